"""The reward service: worker processes, per-call timeouts, counted failures, clean shutdown, and training
that goes on when the reward raises or hangs."""

import asyncio
import logging
import math
import os
import time
import uuid

import numpy as np
import pytest

from asyncrl import configlib
from asyncrl.reward import BoundReward, RewardService

from data_fixtures import reward_fns
from timing_for_tests import loaded

ITEM = {"id": 7, "question": "q", "answer": "42", "prompt_ids": [1, 2, 3]}


def _gone(pids, timeout_s=5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(os.path.exists(f"/proc/{p}") and "Z" not in _state(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def _state(pid) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


@pytest.fixture
def service_factory():
    made = []

    def make(fn, **kw):
        s = RewardService(fn, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def test_scores_in_worker_processes(service_factory):
    from asyncrl.reward.isolation import isolation

    s = service_factory(reward_fns.pid, workers=2)
    pids = {s.score(ITEM, "x") for _ in range(4)}
    assert os.getpid() not in pids and s.worker_pids()
    if isolation()[0] == "pidns":  # each worker is pid 1 of its own namespace
        assert pids == {1.0}
    else:
        assert pids <= set(s.worker_pids())
    assert service_factory(reward_fns.exact_answer, workers=2).score(ITEM, "42") == 1.0


def test_raising_reward_is_counted_and_logged_once_with_the_sample_id(service_factory, caplog):
    s = service_factory(reward_fns.raising, default=-0.5, workers=1)
    with caplog.at_level(logging.WARNING, logger="asyncrl.reward.service"):
        assert [s.score({**ITEM, "id": i}, "x") for i in range(3)] == [-0.5] * 3
    assert s.stats()["reward_errors"] == 3 and s.stats()["reward_timeouts"] == 0
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "item 0" in warnings[0] and "RuntimeError" in warnings[0]


def test_hanging_reward_times_out_and_its_worker_is_replaced(service_factory):
    s = service_factory(reward_fns.hanging, workers=1, timeout_s=0.5)
    first = s.score(ITEM, "x")
    old = s.worker_pids()
    t0 = time.monotonic()
    assert s.score(ITEM, "x") == 0.0 and first == 0.0
    assert time.monotonic() - t0 < loaded(5)
    stats = s.stats()
    assert stats["reward_timeouts"] == 2 and stats["reward_errors"] == 0 and stats["reward_worker_restarts"] >= 1
    assert _gone(old) or s.worker_pids() != old


def test_concurrent_calls_overlap(service_factory):
    s = service_factory(reward_fns.hanging, workers=2, timeout_s=1.0)
    s.score(ITEM, "warm up both")  # start-up time is not part of the per-call timeout

    async def both():
        return await asyncio.gather(s.ascore(ITEM, "a"), s.ascore(ITEM, "b"))

    t0 = time.monotonic()
    assert asyncio.run(both()) == [0.0, 0.0]
    assert time.monotonic() - t0 < loaded(2 * 1.0 + 1.5)  # two workers: the timeouts overlap
    assert s.stats()["reward_timeouts"] == 3


def test_a_reward_that_kills_its_worker_costs_one_sample(service_factory):
    s = service_factory(reward_fns.kills_its_worker, workers=1, timeout_s=5)
    assert s.score(ITEM, "x") == 0.0 and s.score(ITEM, "y") == 0.0
    assert s.stats()["reward_errors"] == 2


def test_a_worker_that_died_is_replaced_before_the_next_call(service_factory, tmp_path):
    """A reward that calls os._exit once costs that one sample: the worker still looks alive just after its pipe
    closed, but it is never handed out again, and every later call scores."""
    flag = tmp_path / "exit-once"
    flag.write_text("")
    s = service_factory(BoundReward(reward_fns.exits_once, {"flag": str(flag)}), workers=1, timeout_s=30)
    scores = [s.score({**ITEM, "id": i}, "x") for i in range(7)]
    assert scores == [0.0] + [1.0] * 6
    assert s.stats()["reward_errors"] == 1 and s.stats()["reward_worker_restarts"] == 1


@pytest.mark.parametrize("contained", ["pidns", "subreaper"])
@pytest.mark.parametrize("how", ["close", "timeout"])
def test_detached_grandchildren_die_with_their_worker(service_factory, monkeypatch, contained, how):
    """A reward function's children that leave its session and process group (os.setsid) do not outlive the
    worker: killed with it after a timeout, or when the service closes. In a pid namespace per worker the kernel
    kills them; without one, the worker's process tree is walked (the worker is their subreaper)."""
    from asyncrl.reward import isolation, service

    if contained == "pidns" and isolation.isolation()[0] != "pidns":
        pytest.skip("no pid namespaces on this machine (unshare --pid refused)")
    if contained == "subreaper":
        monkeypatch.setattr(service, "isolation", lambda: ("subreaper", []))
    marker = f"0.{uuid.uuid4().int % 10**12:012d}1"  # `sleep 300 MARKER`: unique to this test
    fn = BoundReward(reward_fns.detaches_sleepers, {"n": 20, "marker": marker, "hang": how == "timeout"})
    s = service_factory(fn, workers=1, timeout_s=3.0)
    assert s.score(ITEM, "x") == (0.0 if how == "timeout" else 1.0)
    if how == "close":
        deadline = time.monotonic() + 10
        while len(_with_marker(marker)) < 20 and time.monotonic() < deadline:  # the last ones may still exec
            time.sleep(0.05)
        assert len(_with_marker(marker)) == 20  # they outlive the call
        s.close()
    else:
        assert s.stats()["reward_timeouts"] == 1
    assert _gone(_with_marker(marker), timeout_s=10) and not _with_marker(marker)


def test_non_finite_reward_is_an_error(service_factory):
    s = service_factory(reward_fns.not_a_number, workers=0)
    assert s.score(ITEM, "x") == 0.0 and s.stats()["reward_errors"] == 1


def returns_value(prompt, completion, value=None, **_):
    """Returns the item's ``value`` field as is (module level, so a worker can import it)."""
    return value


NOT_REWARDS = ["1.0", b"1", None, math.nan, math.inf, -math.inf, np.float64(math.nan), np.array([1.0, 2.0])]
REWARDS = [
    (1, 1.0),
    (0, 0.0),
    (True, 1.0),
    (False, 0.0),
    (0.5, 0.5),
    (np.float32(0.25), 0.25),
    (np.float64(-0.5), -0.5),
    (np.int64(2), 2.0),
    (np.bool_(True), 1.0),
    (np.array(0.75), 0.75),
]


@pytest.mark.parametrize("workers", [0, 1])
def test_only_finite_real_numbers_are_rewards(service_factory, workers):
    """The same rule in-process and in a worker: a finite real number (bool, int, float, NumPy integer or
    floating) is the reward, as a float; anything else is counted in reward_errors and scores the default."""
    s = service_factory(returns_value, default=-1.0, workers=workers)
    assert s.workers == workers
    for value in NOT_REWARDS:
        assert s.score({**ITEM, "value": value}, "x") == -1.0, value
    assert s.stats()["reward_errors"] == len(NOT_REWARDS)
    for value, expected in REWARDS:
        got = s.score({**ITEM, "value": value}, "x")
        assert got == expected and type(got) is float, (value, got)
    assert s.stats()["reward_errors"] == len(NOT_REWARDS) and s.stats()["reward_timeouts"] == 0


def test_in_process_mode_and_unpicklable_functions(service_factory):
    s = service_factory(lambda prompt, completion, **_: 2.0, workers=2)  # cannot travel to a worker
    assert s.workers == 0 and s.score(ITEM, "x") == 2.0 and s.worker_pids() == []


def test_close_leaves_no_process(service_factory):
    s = service_factory(reward_fns.hangs_on_even_ids, workers=2, timeout_s=30)

    async def close_while_busy():
        await asyncio.gather(s.ascore({**ITEM, "id": 1}, "x"), s.ascore({**ITEM, "id": 3}, "x"))  # start both
        busy = asyncio.ensure_future(s.ascore({**ITEM, "id": 0}, "x"))  # one worker hangs, the other idles
        await asyncio.sleep(1.0)
        pids = s.worker_pids()
        assert len(pids) == 2
        s.close()
        return pids, await asyncio.wait_for(busy, 10)

    pids, value = asyncio.run(close_while_busy())
    assert pids and value == 0.0 and s.stats()["reward_errors"] == 0
    assert _gone(pids)
    with pytest.raises(RuntimeError, match="closed"):
        s.score(ITEM, "x")


def test_eval_fn_raises_for_the_caller_to_count(service_factory):
    from asyncrl.reward import RewardFailure

    s = service_factory(reward_fns.hanging, workers=1, timeout_s=0.5)
    with pytest.raises(RewardFailure, match="timeout"):
        s.eval_fn("q", "x", answer="1")
    with pytest.raises(RewardFailure) as failure:
        service_factory(reward_fns.raising, default=-0.25, workers=0).eval_fn("q", "x")
    assert failure.value.default == -0.25
    ok = service_factory(reward_fns.exact_answer, workers=1)
    assert ok.eval_fn("q", "42", answer="42") == 1.0
    assert s.stats()["reward_timeouts"] == 0  # evaluation failures stay out of the training counters


def test_a_worker_stuck_in_start_up_is_killed_and_replaced(service_factory, monkeypatch):
    """A start-up past its timeout is a timeout like a call's: the worker goes (counted as a restart), and the
    next call gets a fresh one instead of the stuck slot failing until close()."""
    from asyncrl.reward import service

    monkeypatch.setattr(service, "STARTUP_TIMEOUT_S", 0.001)  # no interpreter starts that fast
    s = service_factory(reward_fns.exact_answer, workers=1, timeout_s=5)
    assert s.score(ITEM, "42") == 0.0
    stuck = next(iter(s._all)).proc.pid
    assert _gone([stuck]) and s.stats()["reward_timeouts"] == 1
    monkeypatch.setattr(service, "STARTUP_TIMEOUT_S", 120.0)
    assert s.score(ITEM, "42") == 1.0
    assert s.stats()["reward_worker_restarts"] == 1 and s.stats()["reward_timeouts"] == 1


def test_a_worker_that_dies_before_reading_its_start_up_is_a_counted_failure(service_factory, monkeypatch):
    """Its pipe breaks when the payload is sent (a namespace refused at run time): score() still never raises."""
    from asyncrl.reward import service

    monkeypatch.setattr(service, "isolation", lambda: ("pidns", ["/bin/sh", "-c", "exit 1", "sh"]))

    class Broken(service.Connection):
        def send(self, obj):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(service, "Connection", Broken)
    s = service_factory(reward_fns.exact_answer, workers=1, timeout_s=5)
    assert s.score(ITEM, "42") == 0.0 and s.stats()["reward_errors"] == 1


class _Completion:
    def __init__(self, ids):
        self.output_ids = ids


class _FakeEngine:
    version = 0

    async def generate(self, prompt_ids, params):
        return [_Completion([7])]


class _FakeTokenizer:
    def apply_chat_template(self, messages, **_):
        return messages[0]["content"]

    def __call__(self, text, **_):
        return type("Encoded", (), {"input_ids": [1, 2]})()

    def decode(self, ids, **_):
        return "x"


def test_failed_held_out_scores_get_the_configured_default(service_factory):
    """Held-out evaluation scores a failed reward with reward.default, as training does, and counts it."""
    from asyncrl.loop.evaluate import evaluate
    from asyncrl.types import SamplingParams

    items = [{"question": "q", "answer": "1"}] * 4
    s = service_factory(reward_fns.raising, default=-1.0, workers=0)
    stats = evaluate(_FakeEngine(), _FakeTokenizer(), items, s.eval_fn, SamplingParams(max_new_tokens=1))
    assert stats["eval_reward_mean"] == -1.0 and stats["eval_accuracy"] == 0.0 and stats["eval_reward_errors"] == 4
    assert s.stats()["reward_errors"] == 0  # kept out of the training counters
    plain = evaluate(
        _FakeEngine(), _FakeTokenizer(), items, reward_fns.raising, SamplingParams(max_new_tokens=1), default=-0.5
    )
    assert plain["eval_reward_mean"] == -0.5 and plain["eval_reward_errors"] == 4


def test_config_kwargs_override_item_fields_and_describe_reaches_stats(service_factory):
    bound = BoundReward(reward_fns.scaled, {"scale": 3.0, "answer": "1"})
    s = service_factory(bound, workers=1)
    assert s.score(ITEM, "1") == 3.0  # answer '42' on the item is overridden by the config's '1'
    from asyncrl.reward.code_reward import code_reward

    code = service_factory(BoundReward(code_reward, {"sandbox": "auto"}), workers=0)
    assert code.stats()["sandbox"].split("+")[0] in ("bwrap", "unshare", "rlimits")


@pytest.mark.slow
def test_training_continues_when_the_reward_hangs(tmp_path, tiny_model_dir):
    """Half the samples hang: they time out, are counted, score the default, and the run finishes."""
    from asyncrl.config import TrainConfig
    from asyncrl.launch.train import train

    cfg = configlib.load(
        TrainConfig,
        None,
        [
            f"model.path={tiny_model_dir}",
            f"output_dir={tmp_path}",
            "progress_bar=false",
            "report=false",
            "total_train_steps=2",
            "train_dataset.batch_size=2",
            "gconfig.n_samples=2",
            "gconfig.max_new_tokens=8",
            "valid_dataset.size=2",
            "evaluator.freq_steps=0",
            "rollout.max_slots=8",
            "reward.fn=data_fixtures.reward_fns:hangs_on_even_ids",
            "reward.timeout_s=0.5",
            "reward.workers=2",
            "rollout.max_head_offpolicyness=0",
        ],
    )
    last = train(cfg)
    assert last["version"] == 2 and last["reward_timeouts"] > 0 and last["reward_errors"] == 0


@pytest.mark.parametrize("mechanism", ["auto", "rlimits"])
def test_a_killed_worker_takes_its_sandboxes_with_it(service_factory, mechanism):
    """The service times out a code reward mid-run: the program and a child that left its session die too."""
    from asyncrl.reward.code_reward import code_reward
    from asyncrl.reward.sandbox import get_sandbox

    box = get_sandbox(mechanism)
    if box.mechanism == "rlimits" and not box.drop_uid:
        pytest.skip("without namespaces or a private uid, a child that leaves its session is not tracked")
    s = service_factory(
        BoundReward(code_reward, {"cpu_s": 30, "wall_s": 60, "sandbox": mechanism}), workers=1, timeout_s=1.5
    )
    marker = f"asyncrl-test-{uuid.uuid4().hex}"  # in the command line of both processes, to find them
    sleeper = ["python3", "-c", "import time; time.sleep(300)", marker]
    program = (
        f"```python\nimport os\nif os.fork() == 0:\n    os.setsid()\nos.execv('/usr/bin/python3', {sleeper!r})\n```"
    )
    assert s.score({"question": "q", "tests": [{"input": "", "output": "x"}], "id": 1}, program) == 0.0
    assert s.stats()["reward_timeouts"] == 1
    assert _gone(_with_marker(marker)) and not _with_marker(marker)


def _with_marker(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in open(f"/proc/{pid}/cmdline", "rb").read() and "Z" not in _state(pid):
                found.append(int(pid))
        except OSError:
            pass
    return found
