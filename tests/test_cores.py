"""cluster.cpu_split=auto (asyncrl/cores.py): the trainer and the engine share the cores, each taking all of them
while the other waits; the engine and the trainer ask before each step / micro-batch; the configuration is
refused where it cannot apply."""

import pytest
import torch

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError
from asyncrl.cores import CoreShare
from asyncrl.engine.local import LocalEngine
from asyncrl.trainer import PolicyTrainer
from asyncrl.types import SamplingParams
from conftest import make_model
from trainers_for_tests import make_batch


def test_each_side_takes_every_core_while_the_other_waits():
    state = {"waiting": False, "idle": False}
    share = CoreShare(4, trainer_waiting=lambda: state["waiting"], engine_idle=lambda: state["idle"])
    assert (share.trainer_threads(), share.engine_threads()) == (2, 2)  # both working
    state["idle"] = True
    assert share.trainer_threads() == 4
    state.update(idle=False, waiting=True)
    assert share.engine_threads() == 4
    one = CoreShare(1)
    assert (one.trainer_threads(), one.engine_threads()) == (1, 1)


def test_the_engine_and_the_trainer_ask_for_their_threads():
    asked = []
    engine = LocalEngine(make_model(), max_slots=4, max_len=64, threads=lambda: asked.append("engine") or 1).start()
    try:
        engine.generate_batch([[1, 2, 3]], SamplingParams(max_new_tokens=4))
        assert engine.idle or engine.n_running == 0
    finally:
        engine.stop()
    assert asked.count("engine") >= 2  # at start, and before its steps
    trainer = PolicyTrainer(make_model(), threads=lambda: asked.append("trainer") or 1)
    trainer.step(make_batch([9, 12, 14, 16]), version=0)
    assert "trainer" in asked and torch.get_num_threads() == 1


@pytest.mark.parametrize("overrides, match", [
    (["rollout.backend=asyncrl:d1"], "needs rollout.backend=local"),
    (["actor.backend=ddp:d2"], "one trainer rank"),
    (["cluster.cpu_split=sometimes"], "cluster.cpu_split must be one of"),
])
def test_auto_split_is_refused_where_it_cannot_apply(overrides, match):
    with pytest.raises(ConfigError, match=match):
        configlib.load(TrainConfig, None, ["cluster.cpu_split=auto", *overrides])
