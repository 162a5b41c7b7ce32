"""The rollout buffer (asyncrl.loop.buffer): the capacity formula, admission, batches assembled under the staleness
bound, and a reported failure waking a waiting take."""

import threading
import time

import pytest

from asyncrl.loop.buffer import RolloutBuffer, capacity
from asyncrl.types import Trajectory, TrajectoryGroup

from timing_for_tests import loaded


def test_capacity_staleness_limit():
    assert capacity(max_staleness=2, version=0, batch_size=4, accepted=0, running=0) == 12


def test_capacity_grows_with_version():
    assert capacity(max_staleness=2, version=5, batch_size=4, accepted=0, running=0) == 32


def test_running_and_accepted_reduce_capacity():
    assert capacity(max_staleness=0, version=0, batch_size=10, accepted=0, running=3) == 7
    assert capacity(max_staleness=0, version=0, batch_size=10, accepted=5, running=0) == 5
    assert capacity(max_staleness=2, version=0, batch_size=4, accepted=3, running=2) == 7


def test_capacity_can_be_negative():
    assert capacity(max_staleness=0, version=0, batch_size=4, accepted=5, running=3) == -4


def test_max_concurrent_caps_capacity():
    assert capacity(max_staleness=8, version=0, batch_size=4, accepted=0, running=3, max_concurrent=5) == 2


def test_synchronous_when_eta_zero():
    buf = RolloutBuffer(batch_size=2, max_staleness=0)
    tickets = [buf.try_admit(), buf.try_admit()]
    assert all(tickets) and buf.try_admit() is None  # η=0: exactly one batch in flight
    for t in tickets:
        buf.finish(t, _group())
    assert buf.try_admit() is None  # still version 0 until the trainer steps
    assert len(buf.take(timeout=1)) == 2
    buf.set_version(1)
    assert buf.try_admit() is not None


def test_rejected_groups_free_capacity():
    buf = RolloutBuffer(batch_size=1, max_staleness=0)
    t = buf.try_admit()
    buf.finish(t, None)
    assert buf.rejected == 1 and buf.try_admit() is not None


def test_take_waits_for_older_running_group():
    """A newer ready group must not overtake an older running one: that would break the staleness bound."""
    buf = RolloutBuffer(batch_size=1, max_staleness=1)
    old = buf.try_admit()  # version 0
    buf.set_version(1)
    new = buf.try_admit()  # version 1
    buf.finish(new, _group())
    with pytest.raises(TimeoutError):
        buf.take(timeout=0.2)
    buf.finish(old, _group())
    (first,) = buf.take(timeout=1)
    assert first.admit_version == 0


def test_within_a_version_ready_groups_go_first():
    buf = RolloutBuffer(batch_size=1, max_staleness=1)
    a, b = buf.try_admit(), buf.try_admit()
    buf.finish(b, _group())
    (got,) = buf.take(timeout=1)  # a is still running but has the same admission version
    assert got.admit_version == 0 and buf.running == 1
    buf.finish(a, _group())


def test_take_unblocks_from_another_thread():
    buf = RolloutBuffer(batch_size=2, max_staleness=0)
    tickets = [buf.try_admit(), buf.try_admit()]
    timer = threading.Timer(0.1, lambda: [buf.finish(t, _group()) for t in tickets])
    timer.start()
    assert len(buf.take(timeout=5)) == 2


def test_a_reported_failure_wakes_a_waiting_take_at_once():
    buf = RolloutBuffer(batch_size=2, max_staleness=0)
    buf.try_admit()
    error = KeyError("row 4")
    threading.Timer(0.1, buf.fail, args=(error,)).start()
    t0 = time.monotonic()
    with pytest.raises(KeyError) as raised:
        buf.take(timeout=30)
    assert raised.value is error and time.monotonic() - t0 < loaded(5)


def _group():
    return TrajectoryGroup([Trajectory([1], [2], [0.0], [0], 1.0)])


def test_gate_closed_time_counts_the_staleness_bound_only():
    """From a refusal by the staleness bound to the next admission, except while only max_concurrent_rollouts
    refuses (the bound already open): auto η raises η on this time, which a concurrency cap must not cause."""
    now = [0.0]
    buf = RolloutBuffer(batch_size=2, max_staleness=1, max_concurrent=2, clock=lambda: now[0])
    a, b = buf.try_admit(), buf.try_admit()
    buf.finish(a, _group())
    c = buf.try_admit()
    buf.finish(b, _group())
    d = buf.try_admit()  # accepted 2 + running 2 = (1 + 0 + 1) * 2: the bound is reached
    assert d is not None and buf.try_admit() is None  # t = 0: refused by the staleness bound
    now[0] = 1.0
    buf.take(timeout=1)
    buf.set_version(1)  # the bound opens, but c and d hold both concurrency slots
    assert buf.try_admit() is None
    now[0] = 11.0  # 10 s with the bound open
    buf.finish(c, _group())
    assert buf.try_admit() is not None
    assert buf.gate_closed_s() == 1.0


def test_a_resumed_buffer_keeps_the_eta_its_ready_groups_were_admitted_under():
    """A checkpoint's ready groups keep their η: after the resume, a batch of them reports staleness_bound 2 (it
    read 0 while their tokens were 2 versions old), and a checkpoint written before η was kept gets at least the
    gap to the resumed version."""
    buf = RolloutBuffer(batch_size=2, max_staleness=2)
    tickets = [buf.try_admit(), buf.try_admit()]
    for t in tickets:
        buf.finish(t, _group())
    snap = buf.snapshot()
    for ready in (snap.ready, [r[:2] for r in snap.ready]):
        resumed = RolloutBuffer(batch_size=2, max_staleness=2)
        resumed.restore(2, ready, snap.accepted, snap.rejected, snap.drawn)
        assert len(resumed.take(timeout=1)) == 2 and resumed.stats()["staleness_bound"] == 2
