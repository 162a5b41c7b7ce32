"""SFT transcripts of the lookup task (asyncrl.agent.tasks.transcripts): their tokens equal what the proxy sends and
records when an agent writes them."""

from asyncrl.agent.chat import ChatRenderer
from asyncrl.agent.tasks.transcripts import transcript_ids
from asyncrl.data.lookup import TOOLS, LookupTask

from engines_for_tests import assistant_texts, play_lookup


def test_sft_transcript_tokens_equal_what_the_proxy_sends_and_records(agent_tokenizer):
    renderer = ChatRenderer(agent_tokenizer, agent_tokenizer.eos_token_id)
    for item in LookupTask(direct_frac=0.5, python_frac=0.2).split(10_000, 30):
        ids, mask = transcript_ids(renderer, item["transcript"], TOOLS)
        reward, recorded = play_lookup(agent_tokenizer, item, assistant_texts(item))
        (sample,) = recorded.samples(reward, "concat")
        assert sample.prompt_ids + sample.output_ids == ids
        assert [0] * len(sample.prompt_ids) + sample.loss_mask == mask
        assert recorded.history_edits == 0
        for call in recorded.calls:  # each call's prompt is a prefix of the SFT sequence
            assert ids[: len(call.prompt_ids)] == call.prompt_ids
