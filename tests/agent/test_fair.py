"""The proxy's tokenising worker (asyncrl.agent.fair): the smallest waiting job first, so that one session's long
messages do not hold up another session's short call (red team 4: a 4-token call waited 11.8 s behind three
messages of a million characters)."""

import threading

import pytest

from asyncrl.agent.fair import ShortestFirst


def test_the_smallest_waiting_job_runs_first_ties_in_arrival_order():
    worker = ShortestFirst()
    release, order = threading.Event(), []
    running = worker.submit(10**6, release.wait)  # a long job holds the thread
    jobs = [
        worker.submit(size, lambda name=name: order.append(name) or name)
        for size, name in (
            (10**6, "long a"),
            (10**6, "long b"),
            (12, "short"),
            (10**6, "long c"),
            (12, "short too"),
            (40, "medium"),
        )
    ]
    release.set()
    assert [j.result(timeout=10) for j in jobs] == ["long a", "long b", "short", "long c", "short too", "medium"]
    assert order == ["short", "short too", "medium", "long a", "long b", "long c"]
    assert running.result(timeout=10) is True
    worker.shutdown()


def test_a_job_that_fails_gives_its_exception_and_the_worker_goes_on():
    worker = ShortestFirst()
    failed = worker.submit(1, lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failed.result(timeout=10)
    assert worker.submit(1, lambda: "next").result(timeout=10) == "next"
    worker.shutdown()


def test_shutdown_cancels_what_waits_and_refuses_more():
    worker = ShortestFirst()
    release = threading.Event()
    worker.submit(1, release.wait)
    waiting = worker.submit(1, lambda: "never")
    worker.shutdown()
    release.set()
    assert waiting.cancelled()
    with pytest.raises(RuntimeError, match="shut down"):
        worker.submit(1, lambda: None)
