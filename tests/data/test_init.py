"""Training mixtures: several sources interleaved by weight, each scored by its own reward function and
reported per source."""

import collections
import itertools
import json

import pytest

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError
from asyncrl.data import split_sizes
from asyncrl.data.config import dataset_from_config, source_lookup
from asyncrl.evaluate import by_source
from asyncrl.metrics import source_stats
from asyncrl.reward import build_reward_service, call_reward
from asyncrl.reward.config import RewardConfig
from asyncrl.types import Trajectory, TrajectoryGroup


def _file(tmp_path, name: str, n: int, offset: int = 0) -> str:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"question": f"{name}: compute {i} + 1.", "answer": str(i + 1)}) + "\n"
                            for i in range(offset, offset + n)))
    return str(path)


def _cfg(*overrides) -> TrainConfig:
    return configlib.load(TrainConfig, None, list(overrides))


def _mixture(entries: list[dict], *overrides) -> TrainConfig:
    return _cfg(f"train_dataset.mixture={json.dumps(entries)}", *overrides)


def _data(cfg: TrainConfig):
    return dataset_from_config(cfg.task, cfg.train_dataset, cfg.valid_dataset)


def _two_files(tmp_path, *overrides, a: dict | None = None, b: dict | None = None) -> TrainConfig:
    return _mixture([{"path": _file(tmp_path, "alpha", 60), "weight": 3, **(a or {})},
                     {"path": _file(tmp_path, "beta", 60, offset=500), **(b or {})}],
                    "valid_dataset.size=6", *overrides)


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


def test_each_source_is_scored_by_its_own_function_in_workers_too(tmp_path):
    cfg = _two_files(tmp_path, a={"reward_fn": "rewards_for_tests:constant_reward"},
                     b={"reward_fn": "rewards_for_tests:one_reward"})
    data = _data(cfg)
    items = list(itertools.islice(data.train, 40))
    for workers in (0, 1):
        service = build_reward_service(RewardConfig(workers=workers), data.reward_fn)
        try:
            scores = {(it["source"], service.score(it, "no answer")) for it in items}
            held_out = {(it["source"], service.eval_fn(it["question"], "x", **{k: v for k, v in it.items()
                                                                               if k != "question"}))
                        for it in data.valid}
        finally:
            service.close()
        assert scores == held_out == {("alpha", 0.0), ("beta", 1.0)}
        assert service.errors == 0


def test_reward_fn_and_kwargs_stand_in_for_the_sources_own_verifier(tmp_path):
    """reward.fn replaces the verifier of a source that names no reward_fn; a source's reward_fn stays, with
    its own reward_kwargs only; reward.kwargs go under a source's reward_kwargs."""
    cfg = _two_files(tmp_path, b={"reward_fn": "rewards_for_tests:scale_reward", "reward_kwargs": {"scale": 3}})
    data = _data(cfg)
    alpha = next(it for it in data.train if it["source"] == "alpha")
    beta = next(it for it in data.train if it["source"] == "beta")
    right = f"The answer is {alpha['answer']}."

    def score(item, completion, **reward):
        return call_reward(build_reward_service(RewardConfig(workers=0, **reward), data.reward_fn).fn, item,
                           completion)

    assert score(alpha, right) == 1.0 and score(alpha, "The answer is -7.") == 0.0  # its own verifier (math)
    assert score(beta, "anything") == 3.0
    over = dict(fn="rewards_for_tests:scale_reward", kwargs={"scale": 2})
    assert score(alpha, right, **over) == 2.0  # reward.fn with reward.kwargs
    assert score(beta, "anything", **over) == 3.0  # named its own: reward.fn and reward.kwargs do not apply
    cfg = _two_files(tmp_path, a={"reward_kwargs": {"scale": 5}})
    data = _data(cfg)
    assert score(alpha, right, **over) == 5.0  # the source's reward_kwargs win over reward.kwargs


@pytest.mark.parametrize("entry, key", [
    ({"path": "builtin:arith", "weight": 0}, "train_dataset.mixture[1].weight"),
    ({"path": "builtin:arith", "weight": "heavy"}, "train_dataset.mixture[1].weight"),
    ({"path": "builtin:arith", "wieght": 2}, "train_dataset.mixture[1].wieght: unknown key; did you mean 'weight'"),
    ({"weight": 2}, "train_dataset.mixture[1].path is required"),
    ({"path": "builtin:arith", "reward_fn": "no_such_module:fn"}, "train_dataset.mixture[1].reward_fn"),
    ({"path": "builtin:arith", "type": "csv"}, "train_dataset.mixture[1].type"),
    ({"path": "builtin:arith", "valid_path": "x.jsonl"}, "train_dataset.mixture[1].valid_path"),
    ({"path": "gym:arith"}, "train_dataset.mixture[1].name: 'arith' is the name of entry 0"),
    ({"path": "builtin:arith", "name": "a/b"}, "train_dataset.mixture[1].name"),
])
def test_a_bad_entry_is_one_line_naming_its_key(entry, key):
    with pytest.raises(ConfigError) as e:
        _mixture([{"path": "builtin:arith"}, entry])
    assert key in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_mixture_and_path_are_exclusive():
    with pytest.raises(ConfigError, match="train_dataset.path and train_dataset.mixture are exclusive"):
        _mixture([{"path": "builtin:arith"}], "train_dataset.path=builtin:arith")
    with pytest.raises(ConfigError, match=r"train_dataset.mixture\[i\].valid_path"):
        _data(_mixture([{"path": "builtin:arith"}], "valid_dataset.path=held_out.jsonl"))


def test_a_source_that_cannot_load_is_named(tmp_path):
    cfg = _mixture([{"path": "builtin:arith"}, {"name": "gone", "path": str(tmp_path / "missing.jsonl")}])
    with pytest.raises(ConfigError, match=r"mixture\[1\] \(gone\): train_dataset.path: .* does not exist"):
        _data(cfg)


def test_held_out_is_split_by_weight_and_never_trained_on(tmp_path):
    cfg = _mixture([{"name": "big", "path": _file(tmp_path, "big", 200), "weight": 1},
                    {"name": "task", "path": "builtin:arith", "weight": 2}], "valid_dataset.size=12")
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


def test_metrics_and_evaluation_per_source():
    def group(item_id, *rewards):
        return TrajectoryGroup([Trajectory([1], [2], [0.0], [0], r) for r in rewards], item_id=item_id)

    lookup = {0: "a", 1: "b", 2: "a"}.get
    stats = source_stats([group(0, 1.0, 0.0), group(1, 0.5, 0.5), group(2, 1.0, 1.0)], lookup, ["a", "b", "c"])
    assert stats == {"samples/a": 4, "samples/b": 2, "samples/c": 0, "reward_mean/a": 0.75, "reward_mean/b": 0.5}
    items = [{"source": "a"}, {"source": "a"}, {"source": "b"}]
    assert by_source(items, [1.0, 0.0, 1.0]) == {"eval_accuracy/a": 0.5, "eval_reward_mean/a": 0.5,
                                                 "eval_accuracy/b": 1.0, "eval_reward_mean/b": 1.0}
    assert by_source([{"question": "q"}], [1.0]) == {}


def test_help_config_documents_the_mixture():
    text = " ".join(configlib.describe(TrainConfig).split())
    assert "train_dataset.mixture = []" in text and "reward_mean/NAME" in text and "weight: 3" in text


@pytest.mark.slow
def test_train_on_a_two_source_mixture_reports_each_source(tmp_path, tiny_model_dir):
    from asyncrl.launch.train import train
    from asyncrl.metrics import read_metrics

    entries = [{"name": "ones", "path": _file(tmp_path, "ones", 30), "reward_fn": "rewards_for_tests:one_reward"},
               {"name": "zeros", "path": _file(tmp_path, "zeros", 30, offset=100), "weight": 2,
                "reward_fn": "rewards_for_tests:constant_reward"}]
    cfg = _mixture(entries, f"model.path={tiny_model_dir}", f"output_dir={tmp_path}", "progress_bar=false",
                   "report=false", "total_train_steps=3", "train_dataset.batch_size=4", "gconfig.n_samples=2",
                   "gconfig.max_new_tokens=8", "valid_dataset.size=4", "evaluator.freq_steps=0",
                   "rollout.max_slots=8", "reward.workers=1")
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
