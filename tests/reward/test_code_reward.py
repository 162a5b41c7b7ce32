"""The code reward and its sandbox: passing, failing, timing-out and crashing programs, and hostile ones
(each scores 0 within its time limit, cannot reach the host, and leaves no process behind)."""

import ctypes
import os
import shutil
import socket
import threading
import time

import pytest

from asyncrl.reward import BoundReward, RewardService
from asyncrl.reward import sandbox as sb
from asyncrl.reward.code_reward import (BadTestsError, code_reward, extract_code, outputs_match, parse_tests,
                                        values_match)
from asyncrl.reward.sandbox_cleanup import leftover_processes, processes_of_uid

LIMITS = dict(cpu_s=1.0, wall_s=2.0)  # code_reward: cpu_s=1 and wall_s=2 per case
STDIO_TESTS = [{"input": "2 3\n", "output": "5\n"}, {"input": "10 -4\n", "output": "6\n"}]
CALL_TESTS = {"fn_name": "add", "inputs": [[1, 2], [5, 7], [0, 0]], "outputs": [3, 12, 0]}
GOOD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"

MECHANISMS = [m for m in sb.MECHANISMS if sb.available(m) and sb.probe(m, sb.default_python())]


def fence(code: str) -> str:
    return f"Here is my program:\n```python\n{code}\n```\n"


def no_leftovers(result_tag: str, uid, timeout_s: float = 2.0) -> bool:
    """No process of the run survives (namespaces die a moment after their front process returns)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not leftover_processes(result_tag) and not (uid and processes_of_uid(uid)):
            return True
        time.sleep(0.02)
    return False


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


@pytest.mark.parametrize("bad,match", [("not json", "not JSON"), ([], "non-empty"), ({"inputs": [1]}, "inputs"),
                                       ([{"args": [1]}], "fn_name"), ([3], "mapping")])
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
    assert time.monotonic() - t0 < 2 * LIMITS["wall_s"] + 1  # not 5 x the limit


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_slow_crash_is_not_a_timeout_but_the_cpu_limit_is(mechanism):
    """Only a run killed for time (wall clock, or SIGXCPU / SIGKILL of RLIMIT_CPU) is a timeout; a program
    that fails after more than cpu_s of wall time simply failed, and the next test cases still run."""
    box = sb.Sandbox(mechanism, sb.default_python())
    limits = sb.Limits(cpu_s=0.5, wall_s=30.0)  # a wall clock the runs never reach, even on a busy machine
    crash = box.run("import time\ntime.sleep(0.8)\nraise SystemExit(3)", limits=limits)
    assert crash.wall_s >= limits.cpu_s and crash.returncode != 0 and not crash.timed_out, crash
    spin = box.run("while True:\n    pass", limits=limits)
    assert spin.timed_out and spin.wall_s < limits.wall_s, spin  # the CPU limit, not the wall clock
    assert sb._killed_by_cpu_limit(spin.returncode, spin.wall_s, limits.cpu_s)


def test_timeouts_are_told_from_crashes_by_how_the_program_died():
    import signal

    xcpu, kill = int(signal.SIGXCPU), int(signal.SIGKILL)
    for rc in (-xcpu, 128 + xcpu):  # rlimits mode / bwrap and unshare (128 + signal)
        assert sb._killed_by_cpu_limit(rc, wall_s=0.1, cpu_s=1.0)
    for rc in (-kill, 128 + kill):
        assert sb._killed_by_cpu_limit(rc, wall_s=2.0, cpu_s=1.0)
        assert not sb._killed_by_cpu_limit(rc, wall_s=0.1, cpu_s=1.0)  # killed before it could use cpu_s
    for rc in (0, 1, 3, -int(signal.SIGSEGV), 128 + int(signal.SIGSEGV)):
        assert not sb._killed_by_cpu_limit(rc, wall_s=30.0, cpu_s=1.0)


def test_slow_failures_do_not_skip_the_remaining_cases():
    from asyncrl.reward.code_reward import parse_tests, run_tests

    cases = parse_tests([{"input": str(i), "output": "x"} for i in range(3)])
    slow_crash = "import time\ntime.sleep(0.6)\n1/0"
    assert run_tests(slow_crash, cases, sb.Limits(cpu_s=0.5, wall_s=30.0)) == ["failed"] * 3


def test_program_environment_is_clean_and_private(monkeypatch):
    monkeypatch.setenv("HOST_SECRET_FOR_TEST", "hunter2")
    probe = fence("import os\nprint(sorted(k for k in os.environ if not k.startswith('ASYNCRL')))\n"
                  "print(os.getcwd() != '/work/main', os.access('.', os.W_OK))")
    out = sb.get_sandbox().run(extract_code(probe))
    assert out.ok, out.stderr
    env_keys, private = out.stdout.splitlines()
    assert set(eval(env_keys)) <= {"HOME", "LANG", "LC_ALL", "PATH", "PWD"}
    assert private == "True True"


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


# ---- hostile programs ----------------------------------------------------------------------------------
HOSTILE = {
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "fork_bomb_escaping_its_session": "import os\nwhile True:\n    try:\n        if os.fork() == 0:\n"
                                      "            os.setsid()\n    except OSError:\n        pass",
    "memory_bomb": "x = bytearray(8 << 30)\nprint(5)",
    "infinite_loop": "while True:\n    pass",
    "sleeping_orphan": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\nprint(4)",
    "kill_the_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
                       "os.kill(-1, signal.SIGKILL)\nprint(5)",
    "huge_output": "import sys\nwhile True:\n    sys.stdout.write('5' * 65536)",
}
# Need namespaces: the rlimits-only fallback cannot hide host files or the network.
HOSTILE_NEEDS_NAMESPACES = {
    "read_project_sources": "print(open({src!r}).read().split()[0])",
    "write_outside_workdir": "open({outside!r}, 'w').write('x')\nprint(5)",
    "open_a_socket": "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint(5)",
}


@pytest.fixture
def listener():
    """A loopback listener that records whether anyone connected."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(0.2)
    hits, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                hits.append(srv.accept())
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1], hits
    stop.set()
    t.join()
    srv.close()


def _contained(mechanism: str) -> bool:
    """Whether this mechanism may safely run programs that signal or fork without bound: a pid namespace,
    or a private uid (without either, kill(-1) would hit the test runner's own processes)."""
    return mechanism != "rlimits" or os.geteuid() == 0


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("name", sorted(HOSTILE) + sorted(HOSTILE_NEEDS_NAMESPACES))
def test_hostile_program_scores_zero_in_time_and_leaves_nothing(name, mechanism, listener, tmp_path):
    if name in HOSTILE_NEEDS_NAMESPACES and mechanism == "rlimits":
        pytest.skip("the rlimits-only fallback does not isolate files or the network (reported in metrics)")
    if not _contained(mechanism):
        pytest.skip("without namespaces or a private uid a hostile program could signal the test runner")
    port, hits = listener
    outside = tmp_path / "escaped.txt"
    src = os.path.abspath(sb.__file__)
    program = {**HOSTILE, **HOSTILE_NEEDS_NAMESPACES}[name].format(src=src, outside=str(outside), port=port)
    expected = {"read_project_sources": open(src).read().split()[0]}.get(name, "5")
    box = sb.Sandbox(mechanism, sb.default_python())
    limits = sb.Limits(cpu_s=1, wall_s=1.5, memory_mb=256, nproc=8)

    t0 = time.monotonic()
    result = box.run(program, limits=limits)
    elapsed = time.monotonic() - t0

    from asyncrl.reward.code_reward import CodeCase, case_passed

    assert not case_passed(CodeCase(stdout=expected), result), result
    assert elapsed < limits.wall_s + 5  # ended by the wall limit, not hung (slack for a loaded machine)
    assert no_leftovers(result.tag, result.uid)
    assert not outside.exists() and not hits


def test_hostile_code_through_the_reward_leaves_the_caller_alive():
    """kill(-1) and killing the parent from the code reward: we are still here and still scoring."""
    hostile = fence("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)")
    if not _contained(sb.get_sandbox().mechanism):
        pytest.skip("no namespaces and no private uid on this machine")
    assert code_reward("q", hostile, tests=STDIO_TESTS, **LIMITS) == 0.0
    assert code_reward("q", GOOD, tests=STDIO_TESTS, **LIMITS) == 1.0


def test_sandbox_dirs_are_removed(monkeypatch):
    base = sb.tempfile.mkdtemp(prefix="asyncrl-test-")
    os.chmod(base, 0o755)  # the sandbox's private uid must be able to enter it
    monkeypatch.setattr(sb.tempfile, "tempdir", base)
    try:
        # the program fills its directory and locks it where it owns it (under unshare its cwd is root's /tmp)
        program = ("open('junk', 'w').write('x' * 1000)\nimport os\n"
                   "try:\n    os.chmod('.', 0)\nexcept PermissionError:\n    pass")
        result = sb.get_sandbox().run(program)
        assert result.ok, result.stderr
        assert os.listdir(base) == []
    finally:
        os.rmdir(base)
