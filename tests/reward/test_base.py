"""The reward functions of a mixture (asyncrl.reward.base): each source scored by its own function, in worker processes
too, and reward.fn and reward.kwargs standing in for a source's own verifier."""

import itertools
import json

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.data.config import dataset_from_config
from asyncrl.reward import build_reward_service, call_reward
from asyncrl.reward.config import RewardConfig


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


def test_each_source_is_scored_by_its_own_function_in_workers_too(tmp_path):
    cfg = _two_files(
        tmp_path, a={"reward_fn": "rewards_for_tests:constant_reward"}, b={"reward_fn": "rewards_for_tests:one_reward"}
    )
    data = _data(cfg)
    items = list(itertools.islice(data.train, 40))
    for workers in (0, 1):
        service = build_reward_service(RewardConfig(workers=workers), data.reward_fn)
        try:
            scores = {(it["source"], service.score(it, "no answer")) for it in items}
            held_out = {
                (it["source"], service.eval_fn(it["question"], "x", **{k: v for k, v in it.items() if k != "question"}))
                for it in data.valid
            }
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
        return call_reward(build_reward_service(RewardConfig(workers=0, **reward), data.reward_fn).fn, item, completion)

    assert score(alpha, right) == 1.0 and score(alpha, "The answer is -7.") == 0.0  # its own verifier (math)
    assert score(beta, "anything") == 3.0
    over = dict(fn="rewards_for_tests:scale_reward", kwargs={"scale": 2})
    assert score(alpha, right, **over) == 2.0  # reward.fn with reward.kwargs
    assert score(beta, "anything", **over) == 3.0  # named its own: reward.fn and reward.kwargs do not apply
    cfg = _two_files(tmp_path, a={"reward_kwargs": {"scale": 5}})
    data = _data(cfg)
    assert score(alpha, right, **over) == 5.0  # the source's reward_kwargs win over reward.kwargs
