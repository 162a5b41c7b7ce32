"""Datasets (asyncrl.data.datasets): held-out rows are never trained on (a one-row file is refused, an overlapping
held-out file is warned about), and the plain-argument API."""

import itertools
import logging

import pytest

from asyncrl.configlib import ConfigError
from asyncrl.data.config import (
    TaskConfig,
    TrainDatasetConfig,
    ValidDatasetConfig,
    eval_set_from_config,
)
from asyncrl.data.datasets import file_dataset, hold_out, task_dataset

from datasets_for_tests import ROWS, build, take, write_jsonl


def test_a_one_row_file_is_refused(tmp_path):
    one = write_jsonl(tmp_path / "one.jsonl", ROWS[:1])
    with pytest.raises(
        ConfigError,
        match=r"train_dataset.path: '.*one\.jsonl' has a single usable row, and "
        r"held-out rows are never trained on: give valid_dataset.path",
    ):
        build(one)
    with pytest.raises(ConfigError, match="single usable row"):
        eval_set_from_config(TaskConfig(), ValidDatasetConfig(), TrainDatasetConfig(path=one))
    two = write_jsonl(tmp_path / "two.jsonl", ROWS[:2])
    data = build(two)
    assert not {it["question"] for it in data.valid} & {it["question"] for it in itertools.islice(data.train, 9)}
    valid = write_jsonl(tmp_path / "valid.jsonl", ROWS[5:7])
    assert len(build(one, valid).valid) == 2  # a separate held-out file makes one training row fine


def test_held_out_file_overlapping_the_training_file_is_warned_about(tmp_path, caplog):
    train = write_jsonl(tmp_path / "train.jsonl", ROWS)
    valid = write_jsonl(tmp_path / "valid.jsonl", ROWS[:3] + [{"question": "new", "answer": "1"}])
    with caplog.at_level(logging.WARNING, logger="asyncrl.data"):
        build(train, valid)
    assert "3 of the 4 held-out questions" in caplog.text and "trains on them" in caplog.text


def test_data_functions_take_plain_arguments(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    data = file_dataset(
        path,
        row_type="qa",
        fields={"question": "question"},
        template="Q: {question}",
        valid_size=2,
        valid_seed=1,
        seed=3,
    )
    assert len(data.valid) == 2 and next(data.train)["question"].startswith("Q: Compute")
    assert data.reward_fn.__name__ == "math_reward" and data.stats()["data_bad_rows"] == 0
    task = task_dataset("arith", {"min_terms": 2, "max_terms": 2, "ops": "*"}, valid_size=4, seed=5)
    assert len(task.valid) == 4 and " * " in next(task.train)["question"]


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
    # a question written twice in the file: held out, its copy is not trained on either
    path = write_jsonl(tmp_path / "twice.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(100)] * 2)
    data = build(path, valid_size=20)
    assert not {it["question"] for it in data.valid} & {it["question"] for it in take(data.train, 400)}
    # a chat prompt twice with two reference replies: one prompt (the replies are not part of what it asks)
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": reply}]}
        for reply in ("first", "second")
        for i in range(20)
    ]
    data = build(write_jsonl(tmp_path / "replies.jsonl", rows), valid_size=4)
    held = {it["messages"][0]["content"] for it in data.valid}
    assert held and not held & {it["messages"][0]["content"] for it in take(data.train, 80)}
