"""The code reward (asyncrl.reward.code_reward): the code block and the tests in every shape, output comparison,
passing, failing, timing-out and crashing programs, partial credit, no zombie in-process, and hostile code through
the reward leaving the caller alive."""

import ctypes
import os
import shutil
import time

import pytest

from asyncrl.reward import BoundReward, RewardService
from asyncrl.reward import sandbox as sb
from asyncrl.reward.code_reward import (
    BadTestsError,
    code_reward,
    extract_code,
    outputs_match,
    parse_tests,
    values_match,
)

from timing_for_tests import loaded

LIMITS = dict(cpu_s=1.0, wall_s=2.0)  # code_reward: cpu_s=1 and wall_s=2 per case
STDIO_TESTS = [{"input": "2 3\n", "output": "5\n"}, {"input": "10 -4\n", "output": "6\n"}]
CALL_TESTS = {"fn_name": "add", "inputs": [[1, 2], [5, 7], [0, 0]], "outputs": [3, 12, 0]}
GOOD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"

MECHANISMS = [m for m in sb.MECHANISMS if sb.available(m) and sb.probe(m, sb.default_python())]


def fence(code: str) -> str:
    return f"Here is my program:\n```python\n{code}\n```\n"


# ---- pure helpers ---------------------------------------------------------------------------------------
def test_extract_code_takes_the_last_python_block():
    text = "```python\nprint(1)\n```\nbetter:\n```py\nprint(2)\n```\n```text\nnot code\n```"
    assert extract_code(text) == "print(2)\n"
    assert extract_code("```python\nprint(3)\n") == "print(3)\n"  # cut off before the closing fence
    assert extract_code("print(4)") == "print(4)"


def test_parse_tests_accepts_every_shape():
    assert len(parse_tests(STDIO_TESTS)) == 2
    apps = parse_tests('{"inputs": ["1\\n", "2\\n"], "outputs": ["1\\n", "4\\n"]}')
    assert [c.stdin for c in apps] == ["1\n", "2\n"] and apps[0].fn_name is None
    calls = parse_tests(CALL_TESTS)
    assert calls[1].fn_name == "add" and calls[1].args == (5, 7) and calls[1].expected == 12
    per_item = parse_tests([{"args": [2], "expected": 4}], fn_name="sq")
    assert per_item[0].fn_name == "sq"
    lines = parse_tests([{"input": ["1", "2"], "output": ["3"]}])
    assert lines[0].stdin == "1\n2" and lines[0].stdout == "3"


@pytest.mark.parametrize(
    "bad,match",
    [
        ("not json", "not JSON"),
        ([], "non-empty"),
        ({"inputs": [1]}, "inputs"),
        ([{"args": [1]}], "fn_name"),
        ([3], "mapping"),
    ],
)
def test_parse_tests_names_the_problem(bad, match):
    with pytest.raises(BadTestsError, match=match):
        parse_tests(bad)


def test_output_and_value_comparison():
    assert outputs_match("5  \n\n", "5\n")
    assert outputs_match("0.3333333 2\n", "0.33333333 2")
    assert not outputs_match("5\n6\n", "5\n")
    assert not outputs_match("abc", "abd")
    assert values_match([1, [2.0000000001]], [1, [2]])
    assert values_match(3, [3])  # APPS wraps function outputs in a list
    assert not values_match(True, 1) and not values_match({"a": 1}, {"a": 2})
    # integers are equal or wrong: an answer modulo 1e9+7 off by 500 is not within the float tolerance
    assert not outputs_match("999999500\n", "1000000000\n") and not values_match(123456789000, 123456789012)
    assert outputs_match("+7 -3\n", "7 -3") and values_match(10**12, [10**12]) and values_match(2, 2.0000000001)
    # huge numbers: 'inf' is not an integer beyond the float range; integers of any length compare as written
    big = str(3**700)
    assert not any(outputs_match(got, big) for got in ("inf", "1e999", "9e308", "Infinity"))
    assert not outputs_match("-inf", "-" + big) and not values_match(float("inf"), 3**700)
    assert outputs_match("1" * 5000, "1" * 5000 + "\n") and not outputs_match("1" * 5000, "1" * 4999 + "2")
    assert outputs_match("007 -0", "7 0") and outputs_match("inf nan", "inf NaN") and outputs_match("3.0", "3")


# ---- behaviour through the sandbox ---------------------------------------------------------------------
def test_passing_program_scores_one():
    assert code_reward("q", GOOD, tests=STDIO_TESTS, **LIMITS) == 1.0


def test_function_call_style_and_partial_credit():
    good = fence("def add(a, b):\n    print('debug output is ignored')\n    return a + b")
    assert code_reward("q", good, tests=CALL_TESTS, **LIMITS) == 1.0
    half = fence("def add(a, b):\n    return a + b if a else -1")
    assert code_reward("q", half, tests=CALL_TESTS, **LIMITS) == pytest.approx(2 / 3)  # add(0, 0) fails
    assert code_reward("q", half, tests=CALL_TESTS, mode="all", **LIMITS) == 0.0
    leetcode = fence("class Solution:\n    def add(self, a, b):\n        return a + b")
    assert code_reward("q", leetcode, tests=CALL_TESTS, **LIMITS) == 1.0


def test_failing_and_crashing_programs_score_zero():
    assert code_reward("q", fence("print(0)"), tests=STDIO_TESTS, **LIMITS) == 0.0
    assert code_reward("q", fence("raise SystemExit(3)"), tests=STDIO_TESTS, **LIMITS) == 0.0
    assert code_reward("q", fence("1/0"), tests=STDIO_TESTS, **LIMITS) == 0.0
    assert code_reward("q", fence("def f(:"), tests=STDIO_TESTS, **LIMITS) == 0.0
    assert code_reward("q", "no code at all", tests=CALL_TESTS, **LIMITS) == 0.0


def test_a_timeout_scores_zero_and_stops_after_one_case():
    tests = [{"input": str(i), "output": "x"} for i in range(5)]
    t0 = time.monotonic()
    assert code_reward("q", fence("while True:\n    pass"), tests=tests, **LIMITS) == 0.0
    assert time.monotonic() - t0 < loaded(2 * LIMITS["wall_s"] + 1)  # not 5 x the limit


def test_slow_failures_do_not_skip_the_remaining_cases():
    from asyncrl.reward.code_reward import parse_tests, run_tests

    cases = parse_tests([{"input": str(i), "output": "x"} for i in range(3)])
    slow_crash = "import time\ntime.sleep(0.6)\n1/0"
    assert run_tests(slow_crash, cases, sb.Limits(cpu_s=0.5, wall_s=30.0)) == ["failed"] * 3


def test_metrics_name_the_isolation_used():
    facts = code_reward.describe()
    assert facts["sandbox"] == sb.get_sandbox().description
    assert facts["sandbox"].split("+")[0] in sb.MECHANISMS


# ---- reaping: no zombies ----------------------------------------------------------------------------------
PR_SET_CHILD_SUBREAPER = 36


def _zombie_children() -> set[int]:
    """Zombies (state Z in /proc/PID/stat) whose parent is this process."""
    me, found = os.getpid(), set()
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state == "Z" and int(ppid) == me:
            found.add(int(name))
    return found


@pytest.fixture
def adopted_zombies():
    """This process stands in for a container's pid 1 that never reaps: it is made a child subreaper, so
    whatever a sandbox run orphans is adopted here instead of by pid 1, and stays a zombie where the test can
    see it. No other process's zombie can be mistaken for the run's. Yields a function listing the new
    zombies; afterwards reaps them and stops adopting."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    before = _zombie_children()
    if prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        pytest.skip(f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}")
    try:
        yield lambda: sorted(_zombie_children() - before)
    finally:
        prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        for pid in _zombie_children() - before:
            os.waitpid(pid, os.WNOHANG)


@pytest.mark.parametrize("mechanism", ["bwrap", "unshare"])
def test_in_process_scoring_leaves_no_zombie(mechanism, adopted_zombies):
    """Scoring in the calling process (code_reward directly, or RewardService with workers=0) reaps every
    process it started. bubblewrap's own namespace init used to outlive the bwrap process and stay a zombie
    of pid 1 after every run, piling up in a container whose pid 1 does not reap. Covers a passing program,
    one that leaves an orphan in its namespace, and one stopped by the wall clock."""
    if mechanism == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install -y bubblewrap)")
    if mechanism not in MECHANISMS:
        pytest.skip(f"the {mechanism} sandbox does not work on this machine")
    kw = dict(LIMITS, sandbox=mechanism)
    service = RewardService(BoundReward(code_reward, kw), workers=0)
    try:
        for _ in range(3):
            assert code_reward("q", GOOD, tests=STDIO_TESTS, **kw) == 1.0
            assert service.score({"question": "q", "tests": STDIO_TESTS}, GOOD) == 1.0
        orphan = fence("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint(5)")
        assert code_reward("q", orphan, tests=[{"input": "", "output": "5"}], **kw) == 1.0
        sleeper = fence("import time\ntime.sleep(60)")
        assert code_reward("q", sleeper, tests=STDIO_TESTS, **{**kw, "wall_s": 0.5}) == 0.0  # the wall clock
    finally:
        service.close()
    assert service.stats()["reward_errors"] == 0
    time.sleep(0.1)  # an orphan would turn into a zombie a moment after its run returned
    assert adopted_zombies() == []


def _contained(mechanism: str) -> bool:
    """Whether this mechanism may safely run programs that signal or fork without bound: a pid namespace,
    or a private uid (without either, kill(-1) would hit the test runner's own processes)."""
    return mechanism != "rlimits" or os.geteuid() == 0


def test_hostile_code_through_the_reward_leaves_the_caller_alive():
    """kill(-1) and killing the parent from the code reward: we are still here and still scoring."""
    hostile = fence("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)")
    if not _contained(sb.get_sandbox().mechanism):
        pytest.skip("no namespaces and no private uid on this machine")
    assert code_reward("q", hostile, tests=STDIO_TESTS, **LIMITS) == 0.0
    assert code_reward("q", GOOD, tests=STDIO_TESTS, **LIMITS) == 1.0
