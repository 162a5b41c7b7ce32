"""Datasets: the built-in task unchanged, local JSONL / JSON / Parquet / saved datasets in GSM8K, MATH, QA
and code formats, field mapping, bad rows named by file and line, over-long prompts skipped and counted,
reasoning-gym tasks, and the shipped sample files."""

import json
import logging

import pytest

from asyncrl.configlib import ConfigError
from asyncrl.data import hold_out
from asyncrl.data.arith import ArithTask, arith_reward
from asyncrl.data.config import (TaskConfig, TrainDatasetConfig, ValidDatasetConfig, dataset_from_config,
                                 eval_set_from_config)
from asyncrl.data.samples import DATA_DIR, render_all
from asyncrl.reward import call_reward
from datasets_for_tests import SAMPLES, build, take, write_jsonl


def test_builtin_task_is_unchanged_by_default():
    data = build(valid_size=4)
    task = ArithTask()
    held = task.split(10_000, 4)
    questions = {it["question"] for it in held}
    expected = take((it for it in task.stream(0) if it["question"] not in questions), 5)
    assert data.valid == held and data.reward_fn is arith_reward
    assert take(data.train, 5) == [{**it, "id": i} for i, it in enumerate(expected)]


def test_builtin_by_path_and_its_errors():
    assert take(build("builtin:arith").train, 3) == take(build().train, 3)
    with pytest.raises(ConfigError, match="no built-in task 'nope'.*task.name"):
        build("builtin:nope")
    with pytest.raises(ConfigError, match="valid_dataset.path"):
        build("", f"{SAMPLES}/gsm8k_test.jsonl")


def test_gsm8k_jsonl():
    data = build(f"{SAMPLES}/gsm8k_train.jsonl", f"{SAMPLES}/gsm8k_test.jsonl", valid_size=40)
    item = take(data.train, 1)[0]
    assert set(item) >= {"question", "answer", "solution", "id"} and item["answer"].lstrip("-").isdigit()
    assert "<<" not in item["solution"] and item["solution"].endswith(f"The answer is {item['answer']}.")
    assert len(data.valid) == 40 and data.reward_fn.__name__ == "math_reward"
    for it in data.valid[:5]:
        assert call_reward(data.reward_fn, it, it["solution"]) == 1.0


def test_math_format_takes_the_boxed_answer():
    data = build(f"{SAMPLES}/math_train.jsonl", f"{SAMPLES}/math_test.jsonl", type="math")
    it = data.valid[0]
    assert it["answer"] in it["solution"] and "\\boxed" not in it["answer"]
    assert it["level"].startswith("Level")  # other columns ride along for custom rewards
    assert all(call_reward(data.reward_fn, v, v["solution"]) == 1.0 for v in data.valid)


def test_code_format_and_reference_solutions_pass():
    data = build(f"{SAMPLES}/code_train.jsonl", f"{SAMPLES}/code_test.jsonl", valid_size=4)
    assert data.reward_fn.__name__ == "code_reward"
    kinds = {"fn_name" in it for it in data.valid}
    for it in data.valid:
        assert call_reward(data.reward_fn, it, it["solution"]) == 1.0, it["question"]
    assert kinds  # at least one style present; the train file has both
    train = take(data.train, 24)
    assert {("fn_name" in it) for it in train} == {True, False}


def test_field_mapping_and_prompt_template(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"id": "r1", "q": f"What is {i} + {i}?", "final": 2 * i}
                                               for i in range(30)])
    data = build(path, fields={"question": "q", "answer": "final"}, prompt_template="Solve: {question}")
    item = take(data.train, 1)[0]
    assert item["question"].startswith("Solve: What is") and item["answer"] == str(int(item["answer"]))
    assert item["source_id"] == "r1" and isinstance(item["id"], int)
    assert call_reward(data.reward_fn, item, f"The answer is {item['answer']}.") == 1.0


def test_held_out_rows_are_never_trained_on(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(50)])
    data = build(path, valid_size=100)
    held = {it["question"] for it in data.valid}
    assert len(held) == 5  # at most a tenth of the file
    seen = take(data.train, 200)  # four epochs
    assert not held & {it["question"] for it in seen}
    assert len({it["id"] for it in seen}) == 200 and data.stats()["data_epoch"] == 4
    train, valid = hold_out(list(range(10)), 3, seed=1)
    assert len(valid) == 1 and not set(train) & set(valid)


BAD_ROWS = [
    {"question": "good one", "answer": "#### 1"},
    '{"question": "broken", "answer": ',
    "[1, 2, 3]",
    {"text": "no question field", "answer": "#### 2"},
    "",
    {"question": "gsm8k without the final line", "answer": "it is 3"},
    {"question": "good two", "answer": "step\n#### 4"},
]


def test_malformed_rows_are_errors_naming_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", BAD_ROWS)
    with pytest.raises(ConfigError, match=r"bad\.jsonl:2: not valid JSON"):
        build(path, path, type="gsm8k", skip_bad_rows=False)
    good_prefix = write_jsonl(tmp_path / "bad2.jsonl", [BAD_ROWS[0], BAD_ROWS[3]])
    with pytest.raises(ConfigError, match=r"bad2\.jsonl:2: no question text"):
        build(good_prefix, good_prefix, type="gsm8k", skip_bad_rows=False)


def test_malformed_rows_are_skipped_counted_and_logged(tmp_path, caplog):
    path = write_jsonl(tmp_path / "bad.jsonl", BAD_ROWS)
    with caplog.at_level(logging.WARNING, logger="asyncrl.data"):
        data = build(path, path)
    assert sorted(it["question"] for it in data.valid) == ["good one", "good two"][: len(data.valid)]
    assert data.stats()["data_bad_rows"] == 2 * 4  # four bad rows, read once for train and once for valid
    logged = " ".join(r.getMessage() for r in caplog.records)
    for line in (2, 3, 4, 6):
        assert f"bad.jsonl:{line}:" in logged
    assert "must be a JSON object" in logged and "#### <final answer>" in logged


def test_a_file_with_no_good_rows_is_a_config_error(tmp_path):
    path = write_jsonl(tmp_path / "all_bad.jsonl", ["{", "nope"])
    with pytest.raises(ConfigError, match=r"(?s)no usable rows.*all_bad\.jsonl:1: not valid JSON"):
        build(path)


@pytest.mark.parametrize("override,match", [
    (dict(path="/nonexistent/train.jsonl"), "train_dataset.path: '/nonexistent/train.jsonl' does not exist"),
    (dict(path=f"{SAMPLES}/gsm8k_train.jsonl", type="csv"), "train_dataset.type must be one of"),
    (dict(path=f"{SAMPLES}/gsm8k_train.jsonl", fields={"prompt": "x"}), "train_dataset.fields"),
    (dict(path=f"{SAMPLES}/gsm8k_train.jsonl", prompt_template="{nope}"), "prompt_template refers to 'nope'"),
])
def test_config_errors_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        build(skip_bad_rows=False, **override)


def test_json_array_file(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([{"problem": "Compute $1+1$.", "solution": "$\\boxed{2}$"}] * 3))
    data = build(str(path), str(path))
    assert data.valid[0]["answer"] == "2"


def test_over_long_prompts_are_skipped_and_counted(tmp_path, tokenizer):
    rows = [{"question": "Add 1 and 2.", "answer": "3"}] * 10 + [{"question": "word " * 400, "answer": "1"}] * 10
    path = write_jsonl(tmp_path / "long.jsonl", rows)
    data = build(path, path, valid_size=50, tokenizer=tokenizer, max_prompt_tokens=64)
    assert data.stats()["data_skipped_long"] == 20  # ten in the train list, ten in the valid list
    items = take(data.train, 30)
    assert all(len(it["prompt_ids"]) <= 64 and it["question"] == "Add 1 and 2." for it in items)
    with pytest.raises(ConfigError, match="max_prompt_tokens"):
        build(path, tokenizer=tokenizer, max_prompt_tokens=2)


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"question": [f"Compute {i} * 2." for i in range(20)], "answer": [str(2 * i) for i in range(20)]})
    pq.write_table(table, tmp_path / "train.parquet")
    data = build(str(tmp_path / "train.parquet"))
    assert len(data.valid) == 2 and take(data.train, 1)[0]["question"].startswith("Compute")
    bad = pa.table({"question": ["ok", ""], "answer": ["1", "2"]})
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(ConfigError, match=r"bad\.parquet row 2: no question text"):
        build(str(tmp_path / "bad.parquet"), skip_bad_rows=False)


def test_saved_datasets_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {"problem": [f"What is ${i}^2$?" for i in range(12)],
            "solution": [f"$\\boxed{{{i * i}}}$" for i in range(12)]}
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows),
                               "test": datasets.Dataset.from_dict({k: v[:3] for k, v in rows.items()})})
    dd.save_to_disk(str(tmp_path / "saved"))
    data = build(str(tmp_path / "saved"), str(tmp_path / "saved"))
    assert [it["answer"] for it in data.valid] == ["0", "1", "4"]
    with pytest.raises(ConfigError, match="valid_dataset.split: .* has no split 'validation'"):
        dataset_from_config(TaskConfig(), TrainDatasetConfig(path=str(tmp_path / "saved")),
                            ValidDatasetConfig(path=str(tmp_path / "saved"), split="validation"))


def test_reasoning_gym_task_by_name():
    pytest.importorskip("reasoning_gym")
    data = build("gym:chain_sum", valid_size=20, gym_options={"min_terms": 2, "max_terms": 3})
    held = {it["question"] for it in data.valid}
    items = take(data.train, 50)
    assert len(held) == 20 and not held & {it["question"] for it in items}
    it = items[0]
    assert it["gym_task"] == "chain_sum" and data.reward_fn.__name__ == "gym_reward"
    assert call_reward(data.reward_fn, it, f"<answer>{it['answer']}</answer>") == 1.0
    assert call_reward(data.reward_fn, it, "The answer is 1e9.") < 1.0
    with pytest.raises(ConfigError, match="no task 'chain_summ'.*chain_sum"):
        build("gym:chain_summ")


GYM_TINY = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}  # few distinct questions


def test_gym_prompt_template_keeps_held_out_questions_out_of_training():
    """The held-out exclusion compares the same (untemplated) questions the generator makes: with a template,
    held-out problems must still never be trained on."""
    pytest.importorskip("reasoning_gym")
    template = "{question}\nGive the result in <answer></answer> tags."
    data = build("gym:chain_sum", valid_size=40, gym_options=GYM_TINY, prompt_template=template)
    held = {it["question"] for it in data.valid}
    trained = {it["question"] for it in take(data.train, 400)}
    assert all(q.endswith("<answer></answer> tags.") for q in held | trained)
    assert not held & trained
    raw = build("gym:chain_sum", valid_size=40, gym_options=GYM_TINY)  # the same problems, untemplated
    assert {template.format(**it) for it in raw.valid} == held


def test_gym_prompt_template_with_an_unknown_field_names_the_key():
    pytest.importorskip("reasoning_gym")
    with pytest.raises(ConfigError, match=r"train_dataset.prompt_template.*'problem'"):
        build("gym:chain_sum", valid_size=5, gym_options=GYM_TINY, prompt_template="{problem} Answer it.")
    with pytest.raises(ConfigError, match="train_dataset.prompt_template"):
        build("gym:chain_sum", valid_size=5, gym_options=GYM_TINY, prompt_template="{question")


def test_prompt_template_applies_to_the_builtin_task():
    small = TaskConfig(min_terms=2, max_terms=2, max_operand=6)  # few distinct problems: collisions likely
    data = dataset_from_config(small, TrainDatasetConfig(prompt_template="Q: {question} Think step by step."),
                               ValidDatasetConfig(size=20))
    held = {it["question"] for it in data.valid}
    trained = {it["question"] for it in take(data.train, 300)}
    assert all(q.startswith("Q: Compute ") and q.endswith("step by step.") for q in held | trained)
    assert len(held) == 20 and not held & trained
    it = data.valid[0]
    assert call_reward(data.reward_fn, it, f"The answer is {it['answer']}.") == 1.0
    with pytest.raises(ConfigError, match=r"train_dataset.prompt_template.*'problem'"):
        dataset_from_config(small, TrainDatasetConfig(prompt_template="{problem}"), ValidDatasetConfig(size=5))


def test_eval_set_from_a_file_needs_no_training_source(tmp_path):
    """``asyncrl eval valid_dataset.path=F``: the file alone, in its detected format, with its own verifier."""
    path = write_jsonl(tmp_path / "test.jsonl", [{"question": f"{i} + 1 = ?", "answer": str(i + 1)}
                                                 for i in range(8)])
    items, reward_fn = eval_set_from_config(TaskConfig(), ValidDatasetConfig(path=path, size=5))
    assert [it["answer"] for it in items] == ["1", "2", "3", "4", "5"]
    assert reward_fn.__name__ == "math_reward" and call_reward(reward_fn, items[2], "\\boxed{3}") == 1.0
    builtin, arith = eval_set_from_config(TaskConfig(), ValidDatasetConfig(size=5))  # default: the built-in task
    assert len(builtin) == 5 and arith is arith_reward
    with pytest.raises(ConfigError, match="valid_dataset.path"):
        eval_set_from_config(TaskConfig(), ValidDatasetConfig(path=str(tmp_path / "missing.jsonl")))


def test_shipped_samples_are_what_the_generator_writes():
    for name, text in render_all().items():
        assert (DATA_DIR / name).read_text(encoding="utf-8") == text, f"run python -m asyncrl.data.samples ({name})"
