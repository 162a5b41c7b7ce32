"""The lookup task's problems (asyncrl.data.lookup): deterministic problems and splits, options checked, guessing
transcripts only for the things named, registered as builtin:lookup, and the agent tokenizer's chat template
renders tool calls as the model writes them."""

import re

import pytest

from asyncrl.agent.chat import normalize
from asyncrl.data import lookup as lookup_task
from asyncrl.data.lookup import TOOLS, LookupTask


# ---- problems and tools ------------------------------------------------------------------------------------
def test_problems_and_splits_are_deterministic():
    task = LookupTask()
    assert task.split(7, 30) == task.split(7, 30)
    a, b = task.stream(3), task.stream(3)
    assert [next(a) for _ in range(20)] == [next(b) for _ in range(20)]
    items = task.split(10_000, 200)
    assert len({it["question"] for it in items}) == 200
    assert {len(it["facts"]) for it in items} == {1, 2, 3}  # one to three lookups
    for it in items:
        assert all(name in it["question"].casefold() for name in it["names"])
        numbers = re.findall(r"\d+", re.sub(r"box \d+", "", it["question"].casefold()))  # besides the boxes
        assert numbers == ([str(it["given"])] if it["given"] is not None else [])
        assert int(it["answer"]) >= 0
    # the transcript mixture does not change the problems
    assert [it["question"] for it in LookupTask(direct_frac=0.5).split(10_000, 50)] == [
        it["question"] for it in items[:50]
    ]


def test_task_options_are_checked():
    for bad in (
        {"ops": "+*"},
        {"min_terms": 0},
        {"max_terms": 1, "min_terms": 2},
        {"direct_frac": 2.0},
        {"max_operand": 1},
        {"direct_things": ("pears",)},
        {"direct_things": "apples"},
        {"direct_things": ("apples",)},
    ):  # the last: direct_things without direct_frac
        with pytest.raises(ValueError):
            LookupTask(**bad)


def test_guessing_transcripts_only_for_the_things_named_in_direct_things():
    task = LookupTask(direct_frac=0.7, direct_things=("apples", "coins"))
    guessed = {True: 0, False: 0}
    for item in task.split(10_000, 400):
        guess = not any(m["role"] == "tool" for m in item["transcript"])
        assert not guess or item["thing"] in ("apples", "coins")
        if guess:  # no lookup, a made-up answer and nothing else
            assert len(item["transcript"]) == 2
            assert re.fullmatch(r"The answer is -?\d+\.", item["transcript"][-1]["content"])
        if item["thing"] in ("apples", "coins"):
            guessed[guess] += 1
    assert 0.55 < guessed[True] / (guessed[True] + guessed[False]) < 0.85
    everywhere = LookupTask(direct_frac=0.7).split(10_000, 400)  # no direct_things: every thing gets guesses
    assert {it["thing"] for it in everywhere if len(it["transcript"]) == 2} == set(lookup_task.THINGS)


def test_registered_as_builtin_lookup_with_a_disjoint_held_out_split():
    from asyncrl.data.config import TaskConfig, TrainDatasetConfig, ValidDatasetConfig, dataset_from_config

    data = dataset_from_config(
        TaskConfig(name="lookup", min_terms=2, max_terms=3),
        TrainDatasetConfig(path="builtin:lookup"),
        ValidDatasetConfig(size=50),
    )
    held_out = {it["question"] for it in data.valid}
    train = [next(data.train) for _ in range(300)]
    assert len(data.valid) == 50 and not held_out & {it["question"] for it in train}
    assert all("facts" in it and "id" in it for it in train)
    assert data.reward_fn("q", "so the answer is 12.", answer="12") == 1.0


def test_the_template_renders_tool_calls_as_the_model_writes_them(agent_tokenizer):
    item = LookupTask().split(3, 1)[0]
    parsed = []
    for m in item["transcript"]:  # the assistant turns as the proxy returns them: tool calls parsed
        if m["role"] == "assistant":
            reply = lookup_reply(m["content"])
            parsed.append(
                {
                    "role": "assistant",
                    "content": reply.content,
                    **({"tool_calls": reply.tool_calls} if reply.tool_calls else {}),
                }
            )
        else:
            parsed.append(m)
    raw = agent_tokenizer.apply_chat_template(item["transcript"], tools=TOOLS, tokenize=False)
    assert agent_tokenizer.apply_chat_template(normalize(parsed), tools=TOOLS, tokenize=False) == raw
    assert lookup_task.tools_text(TOOLS) in raw
    assert agent_tokenizer.convert_ids_to_tokens(agent_tokenizer("<tool_call>").input_ids) == ["<tool_call>"]


def lookup_reply(text):
    from asyncrl.agent.tools import parse_hermes

    return parse_hermes(text)
