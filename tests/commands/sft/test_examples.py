"""SFT's examples (asyncrl.commands.sft.examples): prompt + response rows and chat rows read as `asyncrl train`
reads them, the loss mask on the response / assistant tokens only (tool calls included, weight-0 turns and turns
the template renders differently left out), bad rows named by file and line."""

import logging

import pytest

from asyncrl.commands.sft.examples import chat_example, item_example, sft_batch
from asyncrl.configlib import ConfigError
from asyncrl.data.formats import prompt_of

from sft_for_tests import CHATS, PAIRS, TEMPLATES, build, spans, write_jsonl


def test_response_rows_mask_only_the_response(tmp_path, tokenizer):
    data = build(write_jsonl(tmp_path / "pairs.jsonl", PAIRS), tokenizer)
    item = next(data.train)
    assert item["solution"] == next(r["response"] for r in PAIRS if r["question"] == item["question"])
    (ids, n_prompt), untrained = item_example(tokenizer, item)
    assert untrained == 0 and ids[:n_prompt] == item["prompt_ids"]
    _, _, loss_mask = sft_batch([(ids, n_prompt)], tokenizer.pad_token_id)
    trained = [ids[t + 1] for t in range(len(ids) - 1) if loss_mask[0, t]]  # the tokens predicted under the mask
    assert trained == ids[n_prompt:] and trained[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(trained, skip_special_tokens=True) == item["solution"]


def test_qa_rows_without_a_solution_train_on_the_answer(tmp_path, tokenizer):
    rows = [{"question": f"Compute {i} + 1.", "answer": str(i + 1)} for i in range(10)]
    item = next(build(write_jsonl(tmp_path / "qa.jsonl", rows), tokenizer).train)
    (ids, n_prompt), _ = item_example(tokenizer, item)
    assert tokenizer.decode(ids[n_prompt:], skip_special_tokens=True) == item["answer"]


def test_prompt_response_pairs_need_no_answer(tmp_path, tokenizer):
    rows = [{"prompt": f"Say {i}.", "response": f"{i}"} for i in range(10)]
    data = build(write_jsonl(tmp_path / "pr.jsonl", rows), tokenizer)
    item = next(data.train)
    assert "answer" not in item and item["solution"] == item["question"][4:-1]
    (ids, n_prompt), _ = item_example(tokenizer, item)
    assert tokenizer.decode(ids[n_prompt:], skip_special_tokens=True) == item["solution"]


def test_chat_rows_become_items_with_their_prompt(tmp_path, tokenizer):
    data = build(write_jsonl(tmp_path / "chat.jsonl", CHATS), tokenizer)
    item = next(data.train)
    row = next(r for r in CHATS if r["messages"][3]["content"] == item["question"])
    assert item["messages"] == row["messages"] and item["answer"] == row["answer"]
    assert item["solution"] == row["messages"][-1]["content"]
    assert prompt_of(item) == row["messages"][:-1]
    assert data.reward_fn.__name__ == "math_reward"


def test_chat_rows_from_parquet(tmp_path, tokenizer):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    # Arrow gives every turn every key of any turn, as nulls
    rows = [{**r, "messages": [{**m, "tool_call_id": None} for m in r["messages"]]} for r in CHATS]
    path = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    item = next(build(str(path), tokenizer).train)
    assert [m["role"] for m in item["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert all(set(m) == {"role", "content"} for m in item["messages"])
    (ids, mask), _ = item_example(tokenizer, item)
    assert [tokenizer.decode(r, skip_special_tokens=True) for r in spans(ids, mask)] == [
        m["content"] for m in item["messages"] if m["role"] == "assistant"
    ]


def test_chat_rows_in_sharegpt_form_and_templated(tmp_path, tokenizer):
    rows = [
        {"conversations": [{"from": "human", "value": f"Add {i} and 1."}, {"from": "gpt", "value": f"{i + 1}"}]}
        for i in range(10)
    ]
    item = next(
        build(write_jsonl(tmp_path / "share.jsonl", rows), tokenizer, prompt_template="{question} Be brief.").train
    )
    assert item["messages"][0]["role"] == "user" and item["messages"][1]["role"] == "assistant"
    assert item["question"].endswith(" Be brief.") and item["messages"][0]["content"] == item["question"]


@pytest.mark.parametrize("template", [None, "qwen2.5.jinja"])
def test_chat_mask_covers_exactly_the_assistant_turns(tmp_path, tokenizer, template):
    tok = _with_template(tokenizer, template)
    messages = CHATS[0]["messages"]
    ids, mask, untrained = chat_example(tok, messages)
    assert untrained == 0
    assert ids == tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False).input_ids
    runs = spans(ids, mask)
    contents = [m["content"] for m in messages if m["role"] == "assistant"]
    assert [tok.decode(r, skip_special_tokens=True) for r in runs] == contents
    assert all(r[-1] == tok.eos_token_id for r in runs)  # each turn ends with the token generation stops at
    content_tokens = sum(len(tok(c, add_special_tokens=False).input_ids) + 1 for c in contents)
    assert sum(mask) == content_tokens  # nothing of the system / user turns or the role headers
    text = tok.decode([t for t, m in zip(ids, mask) if not m], skip_special_tokens=True)
    assert all(m["content"] in text for m in messages if m["role"] != "assistant")


def test_an_assistant_turn_with_only_a_tool_call_is_trained(tokenizer):
    """OpenAI-format agent data: the turn that calls the tool has empty content; calling it is what is learnt."""
    tok = _with_template(tokenizer, "qwen2.5.jinja")
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ]
    ids, mask, untrained = chat_example(tok, messages)
    runs = [tok.decode(r) for r in spans(ids, mask)]
    assert untrained == 0 and len(runs) == 2 and "<tool_call>" in runs[0] and "weather" in runs[0]
    assert runs[1].startswith("It is sunny.")


def test_an_assistant_turn_marked_weight_0_is_not_trained(tokenizer):
    """OpenAI's fine-tuning format marks assistant turns not to learn with "weight": 0 (it was dropped, and the
    turn trained)."""
    from asyncrl.data.formats import chat_messages

    tok = _with_template(tokenizer, "qwen2.5.jinja")
    messages = chat_messages(
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "bad", "weight": 0},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "good", "weight": 1},
        ]
    )
    ids, mask, untrained = chat_example(tok, messages)
    assert untrained == 0 and [tok.decode(r, skip_special_tokens=True) for r in spans(ids, mask)] == ["good"]


def test_chat_turns_the_template_renders_differently_are_left_untrained(tokenizer):
    tok = _with_template(tokenizer, "qwen3.jinja")  # drops earlier turns' reasoning once a new query follows
    messages = [
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "<think>\n2+3</think>\n\n5."},
        {"role": "user", "content": "And 2 and 4?"},
        {"role": "assistant", "content": "6."},
    ]
    ids, mask, untrained = chat_example(tok, messages)
    assert untrained == 1
    [run] = spans(ids, mask)
    assert tok.decode(run, skip_special_tokens=True).endswith("6.")


def test_bad_rows_are_named_by_file_and_line(tmp_path, tokenizer, caplog):
    rows = CHATS[:9] + [
        {"messages": [{"role": "user", "content": "hi"}]},  # line 10: no assistant turn
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yo"},
                {"role": "user", "content": "and?"},
            ]
        },  # line 11: ends with a user turn
        {"messages": [{"role": "robot", "content": "hi"}]},
    ]  # line 12: unknown role
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="asyncrl.data"):
        data = build(path, tokenizer)
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert f"{path}:10" in logged and "no assistant turn" in logged
    assert f"{path}:11" in logged and "follows the final assistant turn" in logged
    assert f"{path}:12" in logged and "role 'robot'" in logged
    assert data.stats()["data_bad_rows"] == 3
    with pytest.raises(ConfigError, match=f"{path}:10: .*no assistant turn"):
        build(path, tokenizer, skip_bad_rows=False)


def _with_template(tokenizer, template):
    import copy

    tok = copy.deepcopy(tokenizer)
    if template:
        tok.chat_template = (TEMPLATES / template).read_text()
    return tok
