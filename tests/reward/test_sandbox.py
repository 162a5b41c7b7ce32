"""The code reward's sandbox (asyncrl.reward.sandbox): timeouts told from crashes, a clean and private environment, and
hostile programs that score 0 within their time limit, cannot reach the host and leave no process or directory
behind."""

import os
import socket
import threading
import time

import pytest

from asyncrl.reward import sandbox as sb
from asyncrl.reward.code_reward import extract_code
from asyncrl.reward.sandbox_cleanup import leftover_processes, processes_of_uid

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


def test_program_environment_is_clean_and_private(monkeypatch):
    monkeypatch.setenv("HOST_SECRET_FOR_TEST", "hunter2")
    probe = fence(
        "import os\nprint(sorted(k for k in os.environ if not k.startswith('ASYNCRL')))\n"
        "print(os.getcwd() != '/work/main', os.access('.', os.W_OK))"
    )
    out = sb.get_sandbox().run(extract_code(probe))
    assert out.ok, out.stderr
    env_keys, private = out.stdout.splitlines()
    assert set(eval(env_keys)) <= {"HOME", "LANG", "LC_ALL", "PATH", "PWD"}
    assert private == "True True"


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
    # RAM-backed file systems hold memory that RLIMIT_AS does not count: 300 MB against a 64 MB scratch
    "fill_ram_through_dev_shm": "n = 0\nfor d in ('/dev/shm', '/dev', '/tmp'):\n    try:\n        while n < 20:\n"
    "            open(f'{{d}}/f{{n}}', 'wb').write(b'x' * (15 << 20))\n"
    "            n += 1\n    except OSError:\n        pass\nprint(5 if n >= 20 else n)",
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


def test_sandbox_dirs_are_removed(monkeypatch):
    base = sb.tempfile.mkdtemp(prefix="asyncrl-test-")
    os.chmod(base, 0o755)  # the sandbox's private uid must be able to enter it
    monkeypatch.setattr(sb.tempfile, "tempdir", base)
    try:
        # the program fills its directory and locks it where it owns it (under unshare its cwd is root's /tmp)
        program = (
            "open('junk', 'w').write('x' * 1000)\nimport os\n"
            "try:\n    os.chmod('.', 0)\nexcept PermissionError:\n    pass"
        )
        result = sb.get_sandbox().run(program)
        assert result.ok, result.stderr
        assert os.listdir(base) == []
    finally:
        os.rmdir(base)
