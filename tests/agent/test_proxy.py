"""The agent proxy (asyncrl.agent.proxy): a history edit starts a new chain, a retried request makes one sample, a
malformed tool call is counted and harmless, and a weight update during an episode keeps its tokens with both
versions."""

import asyncio

import pytest

from asyncrl.agent.chat import ChatRenderer
from asyncrl.agent.proxy import AgentProxy

from engines_for_tests import ScriptedEngine, agent_context

TOOLS = [
    {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}},
    }
]


def test_history_edit_starts_a_new_chain(tokenizer):
    proxy = AgentProxy(
        ChatRenderer(tokenizer, tokenizer.eos_token_id),
        agent_context(tokenizer).params,
        512,
        engine=ScriptedEngine(tokenizer, ["one", "two", "three"]),
    )
    key = proxy.open()

    async def main():
        a = await proxy.chat(key, {"messages": [{"role": "user", "content": "q"}]})
        msg = a["choices"][0]["message"]
        await proxy.chat(key, {"messages": [{"role": "user", "content": "q"}, msg, {"role": "user", "content": "go"}]})
        await proxy.chat(
            key, {"messages": [{"role": "user", "content": "summary of q"}, {"role": "user", "content": "go"}]}
        )

    asyncio.run(main())
    episode = proxy.close(key)
    assert [c.parent for c in episode.calls] == [None, 0, None] and episode.history_edits == 1
    assert len(episode.samples(1.0, "concat")) == 2 and len(episode.samples(1.0, "individual")) == 3


def test_a_retried_request_makes_one_sample(tokenizer):
    engine = ScriptedEngine(tokenizer, ["first", "second"])
    proxy = AgentProxy(
        ChatRenderer(tokenizer, tokenizer.eos_token_id), agent_context(tokenizer).params, 512, engine=engine
    )
    key = proxy.open()
    body = {"messages": [{"role": "user", "content": "q"}], "max_tokens": 8}

    async def main():  # an SDK retry while the first is generating
        return await asyncio.gather(proxy.chat(key, body), proxy.chat(key, dict(body), retried=True))

    first, again = asyncio.run(main())
    later = asyncio.run(proxy.chat(key, body, retried=True))
    episode = proxy.close(key)
    assert first["id"] == again["id"] == later["id"] and len(episode.calls) == 1 and episode.retries == 2
    assert len(engine.received) == 1


def test_the_same_request_asked_again_is_a_new_sample(tokenizer):
    """An agent that asks the same thing twice (try again, vote over samples) gets two samples, as from the
    OpenAI API; a retry of the second is answered with the second."""
    engine = ScriptedEngine(tokenizer, ["first", "second"])
    proxy = AgentProxy(
        ChatRenderer(tokenizer, tokenizer.eos_token_id), agent_context(tokenizer).params, 512, engine=engine
    )
    key = proxy.open()
    body = {"messages": [{"role": "user", "content": "q"}], "max_tokens": 8}
    first = asyncio.run(proxy.chat(key, body))
    second = asyncio.run(proxy.chat(key, dict(body)))
    retry = asyncio.run(proxy.chat(key, dict(body), retried=True))
    episode = proxy.close(key)
    assert first["id"] != second["id"] == retry["id"] and len(episode.calls) == 2 and episode.retries == 1
    assert [c["message"]["content"] for c in (first["choices"][0], second["choices"][0])] == ["first", "second"]


def test_each_choice_of_a_completion_with_n_choices_takes_its_own_reward(tokenizer):
    """A chat request with n = 2 and a completion (no chat template): the reply's id names the completion, a
    list of rewards gives each choice its own; a single number for two choices is refused with the reason."""
    engine = ScriptedEngine(tokenizer, ["a", "b", "c"])
    proxy = AgentProxy(
        ChatRenderer(tokenizer, tokenizer.eos_token_id), agent_context(tokenizer).params, 512, engine=engine
    )
    key = proxy.open()
    chat = asyncio.run(proxy.chat(key, {"messages": [{"role": "user", "content": "q"}], "n": 2, "max_tokens": 8}))
    text = asyncio.run(proxy.complete(key, {"prompt": "2+2=", "max_tokens": 8}))
    episode = proxy.close(key)
    assert [c.id for c in episode.calls] == [chat["id"], chat["id"], text["id"]] and text["id"].startswith("cmpl-")
    assert [c.choice for c in episode.calls] == [0, 1, 0]
    samples = episode.samples({chat["id"]: [0.0, 1.0], text["id"]: 0.5}, gamma=0.0)
    assert [s.reward for s in samples] == [0.0, 1.0, 0.5]
    # with the discount, each choice gets its own reward + the next completion's return, not its sibling's
    assert episode.returns({chat["id"]: [0.0, 1.0], text["id"]: 0.5}, gamma=1.0) == [0.5, 1.5, 0.5]
    assert episode.returns({chat["id"]: [0.0, 1.0]}, gamma=1.0) == [0.0, 1.0, 0.0]
    assert episode.returns(1.0, gamma=0.5) == [0.5, 0.5, 1.0]
    assert [s.output_ids for s in samples] == engine.generated
    with pytest.raises(ValueError, match="1 reward.* for its 2 choice"):
        episode.samples({chat["id"]: 1.0})


def test_a_malformed_tool_call_is_counted_and_harmless(tokenizer):
    bad = '<tool_call>{"name": "lookup", "arguments": {"key": }</tool_call>'
    engine = ScriptedEngine(tokenizer, [bad])
    proxy = AgentProxy(
        ChatRenderer(tokenizer, tokenizer.eos_token_id), agent_context(tokenizer).params, 512, engine=engine
    )
    key = proxy.open()
    reply = asyncio.run(proxy.chat(key, {"messages": [{"role": "user", "content": "q"}], "tools": TOOLS}))
    message = reply["choices"][0]["message"]
    assert "tool_calls" not in message and message["content"] == bad and reply["choices"][0]["finish_reason"] == "stop"
    assert proxy.tool_parse_errors == 1
    (sample,) = proxy.close(key).samples(0.0)
    assert sample.output_ids == engine.generated[0]  # the trained tokens are the engine's, whatever was parsed


def test_a_weight_update_during_an_episode_keeps_its_tokens_with_both_versions(tokenizer):
    """A weight update lands while the episode's second call decodes: the call is not aborted (the engine
    re-prefills), and its tokens carry both versions."""
    from asyncrl.engine.local import LocalEngine
    from asyncrl.models.hf import build_tiny_model
    from asyncrl.types import WeightUpdate

    old = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128, seed=1)
    new = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128, seed=2)
    engine = LocalEngine(old, max_slots=4, max_len=512, stop_token_ids=(-1,)).start()  # never stops early
    context = agent_context(tokenizer, max_new_tokens=200)
    proxy = AgentProxy(ChatRenderer(tokenizer, tokenizer.eos_token_id), context.params, 512, engine=engine)
    key = proxy.open()

    async def main():
        first = await proxy.chat(key, {"messages": [{"role": "user", "content": "q"}], "max_tokens": 4})
        msgs = [{"role": "user", "content": "q"}, first["choices"][0]["message"], {"role": "user", "content": "more"}]
        second = asyncio.ensure_future(proxy.chat(key, {"messages": msgs}))
        while engine.stats().generated_tokens < 4 + 10:
            await asyncio.sleep(0.001)
        await asyncio.to_thread(engine.update_weights, WeightUpdate(1, state_dict=new.state_dict()))
        return await second

    try:
        asyncio.run(main())
    finally:
        engine.stop()
    first, second = proxy.close(key).samples(1.0)
    assert set(first.versions) == {0} and second.versions[0] == 0 and second.versions[-1] == 1
    assert len(second.output_ids) == 200 and second.finish_reason == "length"
