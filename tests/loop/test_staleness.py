"""η as a policy (asyncrl/loop/staleness.py): the auto control law, and the gate's guarantee under an η that moves:
every group is trained at most its version's η behind, never beyond the limit."""

import random

import pytest

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError
from asyncrl.loop.buffer import RolloutBuffer
from asyncrl.loop.staleness import AutoStaleness, FixedStaleness, raised
from asyncrl.types import Trajectory, TrajectoryGroup


def _record(wait_frac: float, gate_closed_s: float = 1.0, step_s: float = 1.0) -> dict:
    return {"step_time_s": step_s, "trainer_wait_s": wait_frac * step_s, "gate_closed_s": gate_closed_s}


def _auto(**kw) -> AutoStaleness:
    """An auto policy past its first step (which waits for the first batch whatever η is, and is not read)."""
    policy = AutoStaleness(**kw)
    policy.observe(_record(1.0))
    return policy


def test_the_first_step_is_not_read_nor_the_two_after_a_change():
    policy = AutoStaleness(limit=8, start=1, window=1)
    policy.observe(_record(1.0))
    assert policy.bound() == 1
    policy.observe(_record(0.2))
    assert policy.bound() == 2
    policy.observe(_record(1.0))
    policy.observe(_record(1.0))
    assert policy.bound() == 2  # these trained groups admitted before η = 2 took hold
    policy.observe(_record(0.2))
    assert policy.bound() == 3


@pytest.mark.parametrize(
    "eta, wait, limit, expected",
    [
        (1, 0.06, 8, 2),  # a small shortfall: one more
        (1, 0.56, 8, 4),  # 2 groups a version short by 56%: 2 / 0.44 = 4.5 -> 5 in flight
        (4, 0.18, 8, 6),  # 5 / 0.82 = 6.1 -> 7
        (1, 1.0, 8, 5),  # at most three times the work in flight
        (3, 0.9, 8, 8),  # never above the limit
        (2, 2 / 3, 8, 8),  # exactly three times: 9 in flight (not 10 from rounding)
    ],
)
def test_auto_raises_eta_by_the_trainers_shortfall(eta, wait, limit, expected):
    assert raised(eta, wait, limit) == expected


def test_fixed_is_fixed():
    policy = FixedStaleness(3)
    policy.observe(_record(0.9))
    assert policy.bound() == 3


def test_auto_rises_while_the_trainer_waits_behind_a_closed_gate_up_to_the_limit():
    policy = _auto(limit=4, start=1, window=2)
    seen = [policy.bound()]
    for _ in range(20):
        policy.observe(_record(0.5))
        seen.append(policy.bound())
    assert seen == sorted(seen) and seen[-1] == 4 and max(seen) == 4
    assert seen[:8] == [1, 1, 3, 3, 3, 3, 4, 4]  # 1 -> 3 (waiting half the time), a change held for two
    # unread steps and a window, then the limit


def test_auto_does_not_rise_when_the_gate_was_open():
    """The trainer waits, but generation was not held back: a larger η could not help."""
    policy = _auto(limit=8, start=1, window=2)
    for _ in range(20):
        policy.observe(_record(0.5, gate_closed_s=0.0))
    assert policy.bound() == 1


def test_auto_falls_when_the_trainer_never_waits_but_not_back_to_a_value_that_made_it_wait():
    policy = _auto(limit=8, start=1, window=2)
    for _ in range(2):  # a window of a little waiting at η = 1: rises to 2
        policy.observe(_record(0.1))
    assert policy.bound() == 2
    for _ in range(30):  # no more waiting: η stays at 2, the smallest that did not make the trainer wait
        policy.observe(_record(0.0))
    assert policy.bound() == 2
    high = _auto(limit=8, start=5, window=1)
    seen = []
    for _ in range(20):  # a change, two steps skipped, the next judged on its own step
        high.observe(_record(0.0))
        seen.append(high.bound())
    assert seen[-1] == 0 and all(a - b in (0, 1) for a, b in zip([5] + seen, seen))  # down one per version


@pytest.mark.parametrize("cut", [1, 3, 5, 11, 15, 17, 22, 23])
def test_a_resumed_auto_eta_goes_on_where_it_stood(cut):
    """The state saved in a checkpoint (JSON) restores a policy that moves as the unbroken one would: here
    6 -> 5 -> 4 (no waiting), back to 6 (waiting behind a closed gate), 5 (not below the value that waited), with
    an evaluation step between; cut anywhere, also within the steps skipped after a change. The first step after
    the resume is not read (it waits for generation to restart, as a fresh run's first step does)."""
    import json

    waits = [0.0] * 12 + [0.4] * 3 + [0.0] * 6 + ["eval"] + [0.0] * 8
    records = [
        {"step_time_s": 4.0, "trainer_eval_s": 3.0} if w == "eval" else _record(w) | {"staleness_hist": [1]}
        for w in waits
    ]
    unbroken, first = AutoStaleness(limit=6), AutoStaleness(limit=6)  # unbroken: never sees the restart step
    for record in records[:cut]:
        unbroken.observe(record)
        first.observe(record)
    resumed = AutoStaleness(limit=6)
    resumed.restore(json.loads(json.dumps(first.state())))
    assert resumed.bound() == unbroken.bound()
    resumed.observe({"step_time_s": 30.0, "trainer_wait_s": 29.0, "gate_closed_s": 1.0})  # the restart: not read
    assert resumed.bound() == unbroken.bound()
    seen = []
    for record in records[cut:]:
        unbroken.observe(record)
        resumed.observe(record)
        assert resumed.bound() == unbroken.bound()
        seen.append(unbroken.bound())
    assert seen[-1] == 5 and (cut > 15 or 6 in seen)
    fresh = AutoStaleness(limit=6)
    fresh.restore({})  # a checkpoint from before η was saved
    assert fresh.bound() == 6


def test_auto_falls_only_after_two_windows_without_waiting():
    policy = _auto(limit=8, start=4, window=2)
    seen = []
    for _ in range(4):
        policy.observe(_record(0.0))
        seen.append(policy.bound())
    assert seen == [4, 4, 4, 3]  # one window is not enough to lower η; two are


def test_a_step_spent_evaluating_is_not_read_nor_the_two_that_drain_the_buffer_after_it():
    policy = _auto(limit=8, start=4, window=2)
    evaluating = {**_record(0.0, step_s=20.0), "trainer_eval_s": 19.0}
    for record in [_record(0.0), _record(0.0), _record(0.0), evaluating, _record(0.0), _record(0.0)]:
        policy.observe(record)
    assert policy.bound() == 4  # three steps read, the evaluation and the two that drain the buffer skipped
    policy.observe(_record(0.0))
    assert policy.bound() == 3  # the fourth step read, with the three before the evaluation


def test_eta_falls_with_an_evaluation_every_five_steps_that_takes_most_of_its_step():
    """Measured on a fast CPU (bench/async_vs_sync.py, evaluation every 5 steps, 2.5 s of a 4.5 s step): the
    trainer never waited, yet η stayed at 7 of 8 for 55 steps while each evaluation dropped the steps before it."""
    policy = _auto(limit=8, start=8, window=2)
    evaluating = {**_record(0.0, step_s=4.5), "trainer_eval_s": 2.5}
    for step in range(2, 61):
        policy.observe(evaluating if step % 5 == 0 else _record(0.0))
    assert policy.bound() <= 4


def test_evaluation_time_does_not_dilute_the_wait():
    """A step of 10 s with 4 s of evaluation and 1 s of waiting: the trainer waited a sixth of its own time."""
    policy = _auto(limit=8, start=1, window=2)
    step = {**_record(0.1, step_s=10.0), "trainer_eval_s": 4.0}  # 1 s wait over 10 s, 6 s of it training
    policy.observe(step)
    policy.observe(step)
    assert policy.bound() == 2  # 1/6 = 17% > 5%: rises (by one: 2 / (1 - 1/6) = 2.4 -> 3 in flight)


class _Wandering:
    """An η that jumps anywhere between 0 and ``limit`` each time it is asked."""

    def __init__(self, limit: int, rng: random.Random):
        self.limit, self.rng = limit, rng

    def bound(self) -> int:
        return self.rng.randint(0, self.limit)


@pytest.mark.parametrize("seed", range(6))
def test_every_group_is_trained_within_the_eta_of_its_version(seed):
    """η read once per version (the buffer pins it), however the policy moves: no group is trained more than
    its version's η later, the bound the fixed-η gate gives."""
    rng, batch = random.Random(seed), 3
    policy = _Wandering(limit=4, rng=rng)
    buf = RolloutBuffer(batch, policy)
    running, admitted_under, trained = [], {}, 0

    def finish(ticket, rejected=False):
        group = None if rejected else TrajectoryGroup([Trajectory([1], [2], [0.0], [ticket.version], 1.0)])
        if group is not None:
            admitted_under[id(group)] = ticket
        buf.finish(ticket, group)

    for version in range(40):
        eta = buf.max_staleness
        while (ticket := buf.try_admit()) is not None:
            assert ticket.max_staleness == eta
            running.append(ticket)
        rng.shuffle(running)  # groups finish in any order; some are rejected
        for ticket in running[: rng.randint(0, len(running))]:
            finish(ticket, rejected=rng.random() < 0.2)
        running = sorted((t for t in running if t.seq in buf._running), key=lambda t: t.seq)
        while buf._pick() is None:  # the oldest still running finish, until a batch can be taken
            while not running and (ticket := buf.try_admit()) is not None:  # rejections freed room
                running.append(ticket)
            finish(running.pop(0))
        groups = buf.take(timeout=1)
        for group in groups:
            ticket = admitted_under[id(group)]
            assert version - ticket.version <= ticket.max_staleness <= policy.limit
            trained += 1
        # the step's logged bound: the largest η its groups were admitted under, never below their staleness
        bound = buf.stats()["staleness_bound"]
        assert bound == max(admitted_under[id(g)].max_staleness for g in groups)
        assert all(version - admitted_under[id(g)].version <= bound for g in groups)
        buf.set_version(version + 1)
    assert trained == 40 * batch


def test_auto_is_a_config_value_with_a_limit():
    cfg = configlib.load(TrainConfig, None, ["rollout.max_head_offpolicyness=auto", "rollout.max_staleness_limit=4"])
    assert cfg.rollout.max_staleness == 4
    with pytest.raises(ConfigError, match=r"max_head_offpolicyness must be >= 0 \(an integer\) or 'auto'"):
        configlib.load(TrainConfig, None, ["rollout.max_head_offpolicyness=often"])
    with pytest.raises(ConfigError, match=r"max_head_offpolicyness must be >= 0 \(an integer\) or 'auto'"):
        configlib.load(TrainConfig, None, ["rollout.max_head_offpolicyness=-1"])
