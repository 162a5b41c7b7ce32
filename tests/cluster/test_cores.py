"""cluster.cpu_split=auto (asyncrl/cluster/cores.py): the engine keeps half the cores, the trainer the rest and one of
the engine's while the engine idles (always at η = 0), the evaluation engine one; the engine and the trainer ask
before each step / micro-batch; the default, and where it applies (elsewhere the fixed threads)."""

import pytest
import torch

from asyncrl import configlib
from asyncrl.cluster.cores import CoreShare
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError
from asyncrl.engine.local import LocalEngine
from asyncrl.trainer import PolicyTrainer
from asyncrl.types import SamplingParams

from conftest import make_model
from trainers_for_tests import make_batch


def test_the_trainer_borrows_one_of_the_engines_cores_while_the_engine_idles():
    state = {"idle": False}
    two = CoreShare(2, engine_idle=lambda: state["idle"])
    assert (two.trainer_threads(), two.engine_threads(), two.eval_threads()) == (1, 1, 1)  # both working
    state["idle"] = True
    assert (two.trainer_threads(), two.engine_threads()) == (2, 1)  # every core: the engine's one is idle
    eight = CoreShare(8, engine_idle=lambda: state["idle"])
    assert (eight.trainer_threads(), eight.engine_threads()) == (5, 4)
    state["idle"] = False
    assert (eight.trainer_threads(), eight.engine_threads()) == (4, 4)
    one = CoreShare(1)
    assert (one.trainer_threads(), one.engine_threads()) == (1, 1)


@pytest.mark.parametrize("cores", [1, 2, 3, 4, 7, 8, 16])
def test_the_shares_never_hold_more_openmp_workers_than_cores(cores):
    """libgomp's workers sleep between operators once the process holds more than its cores (asyncrl/cluster/cores.py):
    each thread on n > 1 threads keeps n - 1 workers, the process one thread more than their sum."""
    for alternating in (False, True):
        share = CoreShare(cores, engine_idle=lambda: True, alternating=alternating)
        workers = sum(n - 1 for n in (share.trainer_threads(), share.engine_threads(), share.eval_threads()))
        assert workers + 1 <= cores
        assert share.trainer_threads() >= share.engine_threads()


def test_the_engine_and_the_trainer_ask_for_their_threads():
    asked = []
    engine = LocalEngine(make_model(), max_slots=4, max_len=64, threads=lambda: asked.append("engine") or 1).start()
    try:
        engine.generate_batch([[1, 2, 3]], SamplingParams(max_new_tokens=4))
        assert engine.idle or engine.n_running == 0
    finally:
        engine.stop()
    assert asked.count("engine") >= 2  # at start, and before its steps
    in_caller = LocalEngine(make_model(), max_slots=4, max_len=64, threads=lambda: asked.append("caller") or 1)
    in_caller.generate_batch([[1, 2, 3]], SamplingParams(max_new_tokens=4))  # not started: runs in this thread
    assert asked.count("caller") >= 3  # before each step too (asyncrl plan --profile measures decode this way)
    trainer = PolicyTrainer(make_model(), threads=lambda: asked.append("trainer") or 1)
    trainer.step(make_batch([9, 12, 14, 16]), version=0)
    assert "trainer" in asked and torch.get_num_threads() == 1


def test_at_eta_0_the_trainer_takes_its_most_whatever_the_engine_does():
    """A synchronous run's turns alternate: constant thread counts, so its replay stays exact."""
    share = CoreShare(2, engine_idle=lambda: False, alternating=True)
    assert (share.trainer_threads(), share.engine_threads()) == (2, 1)


@pytest.mark.parametrize(
    "overrides, applies",
    [
        ([], True),
        (["rollout.backend=asyncrl:d1"], False),  # the engine runs in another process
        (["actor.backend=ddp:d2"], False),  # several trainer ranks
        (["cluster.cpu_split=fixed"], False),
    ],
)
def test_the_cores_are_shared_by_default_where_the_engine_and_one_trainer_share_this_process(overrides, applies):
    from asyncrl.launch.build import _core_share

    cfg = configlib.load(TrainConfig, None, ["cluster.device=cpu", *overrides])  # valid: elsewhere auto = fixed
    assert (_core_share(cfg)[0] is not None) == applies
    for eta in (
        ["rollout.max_head_offpolicyness=0"],  # synchronous: the turns alternate
        ["rollout.max_head_offpolicyness=auto", "rollout.max_staleness_limit=0"],
    ):  # auto, always 0
        sync = _core_share(configlib.load(TrainConfig, None, eta))[0]
        assert sync is not None and sync.alternating
    shared = _core_share(configlib.load(TrainConfig, None, ["rollout.max_head_offpolicyness=auto"]))[0]
    assert shared is not None and not shared.alternating


def test_omp_num_threads_caps_the_cores_shared(monkeypatch):
    from asyncrl.cluster.cores import process_cores

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    every = process_cores()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert process_cores() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "not a number")
    assert process_cores() == every


def test_an_unknown_split_is_refused():
    with pytest.raises(ConfigError, match="cluster.cpu_split must be one of"):
        configlib.load(TrainConfig, None, ["cluster.cpu_split=sometimes"])


@pytest.mark.parametrize(
    "threads, cores, expected, warns",
    [
        ((1, 1), 2, 1, False),
        ((2, 1), 2, 1, False),  # the trainer's pool takes the one spare worker
        ((2, 2), 2, 1, True),  # the trainer's and the engine's pools alone outnumber the cores
        ((4, 4), 16, 4, False),
    ],
)
def test_with_fixed_threads_the_evaluation_engine_takes_what_the_other_two_leave(
    monkeypatch, caplog, threads, cores, expected, warns
):
    from asyncrl.launch import build

    monkeypatch.setattr(build, "process_cores", lambda: cores)
    cfg = configlib.load(
        TrainConfig,
        None,
        [
            "cluster.device=cpu",
            "cluster.cpu_split=fixed",
            f"actor.threads={threads[0]}",
            f"rollout.threads={threads[1]}",
        ],
    )
    with caplog.at_level("WARNING", logger="asyncrl.launch.build"):
        assert build._fixed_eval_threads(cfg) == expected
    assert ("OpenMP workers outnumber the cores" in caplog.text) == warns
    servers = configlib.load(
        TrainConfig,
        None,
        ["cluster.device=cpu", "cluster.cpu_split=fixed", "actor.threads=2", "rollout.backend=asyncrl:d1"],
    )
    assert build._fixed_eval_threads(servers) == 2  # the engine in another process: the trainer's threads
