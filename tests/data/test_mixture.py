"""Training mixtures (asyncrl.data.mixture, through asyncrl.data.config): sources interleaved by weight with their
ids and tags, resumed in place, held out by weight and never trained on (one file in two entries included), each
reported on in a run."""

import collections
import itertools
import json

import pytest

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.data.config import (
    dataset_from_config,
    source_lookup,
)
from asyncrl.data.mixture import split_sizes
from asyncrl.reward.base import item_fields

from datasets_for_tests import take, write_jsonl


def _file(tmp_path, name: str, n: int, offset: int = 0) -> str:
    path = tmp_path / f"{name}.jsonl"
    path.write_text(
        "".join(
            json.dumps({"question": f"{name}: compute {i} + 1.", "answer": str(i + 1)}) + "\n"
            for i in range(offset, offset + n)
        )
    )
    return str(path)


def _cfg(*overrides) -> TrainConfig:
    return configlib.load(TrainConfig, None, list(overrides))


def _mixture(entries: list[dict], *overrides) -> TrainConfig:
    return _cfg(f"train_dataset.mixture={json.dumps(entries)}", *overrides)


def _data(cfg: TrainConfig):
    return dataset_from_config(cfg.task, cfg.train_dataset, cfg.valid_dataset)


def _two_files(tmp_path, *overrides, a: dict | None = None, b: dict | None = None) -> TrainConfig:
    return _mixture(
        [
            {"path": _file(tmp_path, "alpha", 60), "weight": 3, **(a or {})},
            {"path": _file(tmp_path, "beta", 60, offset=500), **(b or {})},
        ],
        "valid_dataset.size=6",
        *overrides,
    )


def test_weights_seed_ids_and_tags(tmp_path):
    cfg = _two_files(tmp_path)
    data = _data(cfg)
    items = list(itertools.islice(data.train, 2000))
    counts = collections.Counter(it["source"] for it in items)
    assert set(counts) == {"alpha", "beta"}  # names derived from the file stems
    assert abs(counts["alpha"] / 2000 - 0.75) < 0.04
    assert [it["id"] for it in items] == list(range(2000))  # unique integer ids across sources
    assert all(it["question"].startswith(it["source"] + ":") for it in items)  # tagged with where it came from
    lookup = source_lookup(cfg.train_dataset)
    assert all(lookup(it["id"]) == it["source"] == data.source_of(it["id"]) for it in items)
    again = list(itertools.islice(_data(cfg).train, 2000))
    assert [(it["question"], it["source"]) for it in again] == [(it["question"], it["source"]) for it in items]
    other = list(itertools.islice(_data(_two_files(tmp_path, "train_dataset.seed=1")).train, 200))
    assert [it["source"] for it in other] != [it["source"] for it in items[:200]]
    assert set(data.stats()) >= {"data_bad_rows", "data_epoch", "data_bad_rows/alpha", "data_epoch/beta"}


def test_resume_skips_the_drawn_items_and_continues_in_place(tmp_path):
    """A resumed run rebuilds the stream and skips the items its checkpoint drew (launch.build:
    islice(data.train, drawn, None)): the mixture must go on with exactly the items that came next."""
    cfg = _two_files(tmp_path)
    whole = list(itertools.islice(_data(cfg).train, 450))  # past an epoch of alpha's 54 training rows
    resumed = list(itertools.islice(itertools.islice(_data(cfg).train, 300, None), 150))
    assert resumed == whole[300:]


def test_held_out_is_split_by_weight_and_never_trained_on(tmp_path):
    cfg = _mixture(
        [
            {"name": "big", "path": _file(tmp_path, "big", 200), "weight": 1},
            {"name": "task", "path": "builtin:arith", "weight": 2},
        ],
        "valid_dataset.size=12",
    )
    data = _data(cfg)
    assert collections.Counter(it["source"] for it in data.valid) == {"big": 4, "task": 8}
    held_out = {it["question"] for it in data.valid}
    assert not held_out & {it["question"] for it in itertools.islice(data.train, 600)}
    assert split_sizes(10, [1, 1, 1]) == [4, 3, 3] and split_sizes(2, [1, 1, 1]) == [1, 1, 1]
    assert sum(split_sizes(200, [0.3, 1.7, 5.0])) == 200


def test_a_file_source_can_have_its_own_held_out_file(tmp_path):
    valid = _file(tmp_path, "alpha_test", 5, offset=900)
    cfg = _two_files(tmp_path, a={"valid_path": valid})
    data = _data(cfg)
    alpha_valid = [it["question"] for it in data.valid if it["source"] == "alpha"]
    assert alpha_valid and all("compute 9" in q for q in alpha_valid)


@pytest.mark.slow
def test_train_on_a_two_source_mixture_reports_each_source(tmp_path, tiny_model_dir):
    from asyncrl.launch.train import train
    from asyncrl.telemetry.metrics import read_metrics

    entries = [
        {"name": "ones", "path": _file(tmp_path, "ones", 30), "reward_fn": "rewards_for_tests:one_reward"},
        {
            "name": "zeros",
            "path": _file(tmp_path, "zeros", 30, offset=100),
            "weight": 2,
            "reward_fn": "rewards_for_tests:constant_reward",
        },
    ]
    cfg = _mixture(
        entries,
        f"model.path={tiny_model_dir}",
        f"output_dir={tmp_path}",
        "progress_bar=false",
        "report=false",
        "total_train_steps=3",
        "train_dataset.batch_size=4",
        "gconfig.n_samples=2",
        "gconfig.max_new_tokens=8",
        "valid_dataset.size=4",
        "evaluator.freq_steps=0",
        "rollout.max_slots=8",
        "reward.workers=1",
    )
    train(cfg)
    records = read_metrics(tmp_path / "asyncrl" / "default")
    steps = [r for r in records if r["step"] > 0]
    assert len(steps) == 3 and steps[-1]["reward_errors"] == 0
    for r in steps:  # each source scored by its own function, in a reward worker process
        assert r["samples/ones"] + r["samples/zeros"] == r["n_samples"] == 8
        assert r.get("reward_mean/ones", 1.0) == 1.0 and r.get("reward_mean/zeros", 0.0) == 0.0
        assert r["reward_mean"] == r["samples/ones"] / 8
    for name in ("ones", "zeros"):
        assert any(f"reward_mean/{name}" in r for r in steps)
        assert f"eval_accuracy/{name}" in records[0] and f"eval_accuracy/{name}" in steps[-1]
    assert steps[-1]["eval_accuracy/ones"] == 1.0 and steps[-1]["eval_accuracy/zeros"] == 0.0


# ---- held-out rows are never trained on -----------------------------------------------------------------


# ---- the plain-argument API -----------------------------------------------------------------------------


def test_one_file_in_two_mixture_entries_never_trains_a_held_out_prompt(tmp_path):
    """Each entry holds out its own rows; the other entry read the same file and trained on them (20 leaked)."""
    path = write_jsonl(tmp_path / "p.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(300)])
    cfg = configlib.load(
        TrainConfig,
        None,
        [
            "train_dataset.mixture="
            + json.dumps([{"name": "a", "path": path}, {"name": "b", "path": path, "weight": 3}]),
            "valid_dataset.size=40",
        ],
    )
    data = dataset_from_config(cfg.task, cfg.train_dataset, cfg.valid_dataset)
    held = [it["question"] for it in data.valid]
    assert len(held) == len(set(held)) and not set(held) & {it["question"] for it in take(data.train, 3000)}
    # the same file under two templates: a problem held out under one wording is not trained under the other
    entries = [
        {"name": "plain", "path": path, "weight": 3},
        {"name": "cot", "path": path, "prompt_template": "Think step by step. {question}"},
    ]
    cfg = configlib.load(TrainConfig, None, [f"train_dataset.mixture={json.dumps(entries)}", "valid_dataset.size=40"])
    data = dataset_from_config(cfg.task, cfg.train_dataset, cfg.valid_dataset)
    held = {it["question"].removeprefix("Think step by step. ") for it in data.valid}
    trained = {it["question"].removeprefix("Think step by step. ") for it in take(data.train, 3000)}
    assert held and not held & trained
    assert "question_before_template" not in item_fields(data.valid[-1])  # not passed to reward functions
    chat = write_jsonl(
        tmp_path / "c.jsonl",
        [
            {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": str(i)}]}
            for i in range(300)
        ],
    )  # the same with chat rows
    entries = [
        {"name": "plain", "path": chat, "weight": 3},
        {"name": "cot", "path": chat, "prompt_template": "Think step by step. {question}"},
    ]
    cfg = configlib.load(TrainConfig, None, [f"train_dataset.mixture={json.dumps(entries)}", "valid_dataset.size=40"])
    data = dataset_from_config(cfg.task, cfg.train_dataset, cfg.valid_dataset)

    def asked(item):
        return item["messages"][0]["content"].removeprefix("Think step by step. ")

    held = {asked(it) for it in data.valid}
    assert held and not held & {asked(it) for it in take(data.train, 3000)}
