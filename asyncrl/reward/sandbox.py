"""Run an untrusted Python program in a separate process with the strongest isolation this machine offers.

Layers, from strongest to always-present:

- ``bwrap``: bubblewrap gives fresh user, pid, network, ipc, uts and mount namespaces and a minimal read-only
  root (``/usr`` and its symlinks, the program at ``/app``, a size-capped tmpfs ``/tmp`` as the working
  directory, a private ``/proc`` and bubblewrap's minimal ``/dev``: null, zero, full, random, urandom, tty,
  a private ``pts`` and ``shm``). Host files (home, the project's sources, other runs) do not exist inside;
  the only network interface is a loopback that is down.
- ``unshare``: the same view built by hand as root with util-linux ``unshare`` + ``mount`` + ``chroot``, when
  bubblewrap is not installed; its ``/dev`` holds only null, zero, random and urandom.
- ``rlimits``: no namespaces; only the limits and the private uid below. Weak (files and network of the host
  are reachable); used only when nothing else works, and reported.

In every mode the program runs under a clean environment, in a private temporary directory, with rlimits on
CPU time, address space, file size, open files and processes (set by :mod:`sandbox_prologue`), and a
wall-clock limit enforced by the parent. Running as root, each run first drops to a private uid from a small
locked pool (RLIMIT_NPROC is ignored for root, and a private uid lets us kill every process the program left
behind, even ones that escaped their process group). No ``preexec_fn`` is used anywhere, so running a
sandbox from a process with threads (the trainer) is safe.

Whatever calls the sandbox reaps every process it started, so no run leaves a zombie (docs/rewards.md, "No
zombies", says how, mode by mode).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from asyncrl.reward.sandbox_cleanup import TAG_VAR, UidLease, children_of, default_python, kill_leftovers

log = logging.getLogger(__name__)

MECHANISMS = ("bwrap", "unshare", "rlimits")
"""Isolation mechanisms, strongest first."""
PROLOGUE = Path(__file__).with_name("sandbox_prologue.py")
ROOT_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
FRONT_GRACE_S = 1.0  # after the namespace's init was killed, how long its front may take to reap it and exit
MB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Per-run resource limits (each enforced by the kernel, the wall clock by the parent)."""

    cpu_s: float = 5.0
    wall_s: float = 10.0
    memory_mb: int = 512
    file_mb: int = 16
    nproc: int = 16
    nofile: int = 64
    scratch_mb: int = 64


@dataclass
class RunResult:
    """What a sandboxed run produced. ``timed_out`` covers the wall clock and the CPU limit alike."""

    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    wall_s: float
    returned: str | None = None  # JSON of a called function's return value (function-call mode)
    tag: str = ""  # environment tag of the run's processes, to look for leftovers
    uid: int | None = None  # the private uid it ran as (root only)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@dataclass
class Sandbox:
    """A configured isolation mechanism; ``run`` is thread-safe (each run has its own directory and uid)."""

    mechanism: str
    python: str
    drop_uid: bool = field(default_factory=lambda: os.geteuid() == 0)

    @property
    def description(self) -> str:
        """Short tag for metrics, e.g. ``bwrap+setuid+rlimits``."""
        return "+".join(
            [self.mechanism]
            + (["setuid"] if self.drop_uid else [])
            + (["rlimits"] if self.mechanism != "rlimits" else [])
        )

    def run(
        self, program: str, *, stdin: str = "", call: tuple[str, list] | None = None, limits: Limits = Limits()
    ) -> RunResult:
        """Run ``program`` (Python source) reading ``stdin``; with ``call=(fn_name, args)``, call that function
        of the program instead and return its JSON-encoded result in ``RunResult.returned``."""
        uid_lease = UidLease.acquire() if self.drop_uid else None
        uid = uid_lease.uid if uid_lease else None
        host_dir = Path(tempfile.mkdtemp(prefix="asyncrl-sbx-"))
        tag = secrets.token_hex(8)
        try:
            layout = _prepare(host_dir, program, stdin, call, limits, self.mechanism, uid)
            argv, env, cwd = self._command(layout, limits, uid, tag)
            result = _execute(argv, env, cwd, layout, limits, new_session=self.mechanism == "rlimits")
            result.tag, result.uid = tag, uid
            if uid is not None or self.mechanism == "rlimits" or result.timed_out:
                kill_leftovers(uid, tag)
            return result
        finally:
            _remove_tree(host_dir)
            if uid_lease:
                uid_lease.release()

    def _command(self, layout: "_Layout", limits: Limits, uid: int | None, tag: str):
        """(argv, environment of the front process, its working directory) for this mechanism."""
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": layout.cwd,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            TAG_VAR: tag,
        }
        inner = [self.python, "-I", "-S", layout.prologue, layout.spec]
        return COMMANDS[self.mechanism](layout, limits, uid, env, inner, self.python)


def _setpriv(uid: int | None) -> list[str]:
    """Drop to ``uid`` (no groups, no new privileges) before anything else runs; nothing when not root."""
    if uid is None:
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--"]


def _bwrap_command(layout, limits, uid, env, inner, python):
    front_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return _setpriv(uid) + _bwrap_args(layout.host_dir, python, limits, env) + inner, front_env, str(layout.host_dir)


def _unshare_command(layout, limits, uid, env, inner, python):
    """Runs as root: unshare makes the namespaces, UNSHARE_SCRIPT builds the root and drops to ``uid``."""
    script_args = [
        str(layout.host_dir),
        str(limits.scratch_mb),
        _prefix_to_bind(python),
        str(uid or 0),
        *[f"{k}={v}" for k, v in env.items()],
        "--",
        *inner,
    ]
    argv = [
        "setpriv",
        "--pdeathsig",
        "KILL",
        "--",
        "unshare",
        "--mount",
        "--net",
        "--pid",
        "--ipc",
        "--uts",
        "--fork",
        "--kill-child",
        "--",
        "/bin/sh",
        "-c",
        UNSHARE_SCRIPT,
        "sh",
        *script_args,
    ]
    return argv, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, str(layout.host_dir)


def _rlimits_command(layout, limits, uid, env, inner, python):
    front = _setpriv(uid)
    if front:  # the program dies with its parent (the reward worker) even when that is killed
        front = front[:-1] + ["--pdeathsig", "KILL", "--"]
    return front + inner, env, layout.cwd


COMMANDS = {"bwrap": _bwrap_command, "unshare": _unshare_command, "rlimits": _rlimits_command}


# ---- layout of one run ---------------------------------------------------------------------------------
@dataclass
class _Layout:
    host_dir: Path
    prologue: str  # paths as the program sees them
    spec: str
    cwd: str
    stdin_path: Path  # host paths
    stdout_path: Path
    stderr_path: Path
    nonce: str


def _prepare(
    host_dir: Path, program: str, stdin: str, call, limits: Limits, mechanism: str, uid: int | None
) -> _Layout:
    """Write the program, the prologue and the run spec under ``host_dir/app`` (read-only to the program)."""
    app = host_dir / "app"
    app.mkdir()
    if mechanism == "rlimits":
        inside_app, cwd = str(app), str(host_dir / "scratch")
        (host_dir / "scratch").mkdir(mode=0o700)
        if uid is not None:
            os.chown(host_dir / "scratch", uid, uid)
    else:
        inside_app, cwd = "/app", "/tmp"
        (host_dir / "root").mkdir()
    nonce = "@@asyncrl-result-" + secrets.token_hex(8) + "@@"
    spec = {"program": f"{inside_app}/main.py", "cwd": cwd, "limits": asdict(limits), "init": mechanism == "bwrap"}
    if call:
        spec["call"] = {"fn_name": call[0], "args": list(call[1]), "nonce": nonce}
    (app / "main.py").write_text(program)
    (app / "_run.py").write_text(PROLOGUE.read_text())
    (app / "spec.json").write_text(json.dumps(spec))
    for p in (app, *app.iterdir()):
        p.chmod(0o755 if p.is_dir() else 0o644)
    (host_dir / "stdin").write_text(stdin)
    if uid is not None:  # only root and the run's private uid may enter the run directory
        os.chown(host_dir, 0, uid)
    host_dir.chmod(0o755 if uid is None else 0o750)
    return _Layout(
        host_dir,
        f"{inside_app}/_run.py",
        f"{inside_app}/spec.json",
        cwd,
        host_dir / "stdin",
        host_dir / "stdout",
        host_dir / "stderr",
        nonce,
    )


def _bwrap_args(host_dir: Path, python: str, limits: Limits, env: dict) -> list[str]:
    args = [
        "bwrap",
        "--unshare-all",
        "--as-pid-1",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--hostname",
        "sandbox",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for name in ROOT_LINKS:
        p = Path("/") / name
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), f"/{name}"]
        elif p.is_dir():
            args += ["--ro-bind", str(p), f"/{name}"]
    prefix = _prefix_to_bind(python)
    if prefix:
        args += ["--ro-bind", prefix, prefix]
    # /dev and /dev/shm are RAM-backed (memory RLIMIT_AS does not count): /dev read-only, /dev/shm as small as /tmp
    args += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(limits.scratch_mb * MB),
        "--tmpfs",
        "/dev/shm",
        "--remount-ro",
        "/dev",
        "--ro-bind",
        str(host_dir / "app"),
        "/app",
        "--size",
        str(limits.scratch_mb * MB),
        "--tmpfs",
        "/tmp",
        "--chdir",
        "/tmp",
        "--clearenv",
    ]
    for k, v in env.items():
        args += ["--setenv", k, v]
    return args


def _prefix_to_bind(python: str) -> str:
    """The interpreter's installation prefix when it lives outside /usr (it must be mounted in), else ''."""
    real = os.path.realpath(python)
    if real.startswith("/usr/"):
        return ""
    return str(Path(real).parent.parent)


UNSHARE_SCRIPT = r"""
set -euf
H=$1; SCRATCH=$2; PREFIX=$3; U=$4; shift 4
ENV=""; while [ "$1" != "--" ]; do ENV="$ENV $1"; shift; done; shift
R=$H/root
mount -t tmpfs -o size=1m,mode=755 asyncrl "$R"
cd "$R"
mkdir usr proc dev app tmp
mount --bind -o ro /usr usr
for l in bin sbin lib lib32 lib64 libx32; do
  if [ -L "/$l" ]; then ln -s "$(readlink "/$l")" "$l"
  elif [ -d "/$l" ]; then mkdir "$l"; mount --bind -o ro "/$l" "$l"; fi
done
if [ -n "$PREFIX" ]; then mkdir -p ".$PREFIX"; mount --bind -o ro "$PREFIX" ".$PREFIX"; fi
mount --bind -o ro "$H/app" app
mount -t tmpfs -o "size=${SCRATCH}m,mode=1777" asyncrl tmp
mount -t proc -o nosuid,nodev,noexec proc proc
for d in null zero random urandom; do touch "dev/$d"; mount --bind "/dev/$d" "dev/$d"; done
hostname sandbox
cd /
# This shell stays pid 1 of the namespace: an init ignores signals it has no handler for, which would
# shield the program from its own CPU limit. When the program exits, the namespace dies with this shell.
if [ "$U" != 0 ]; then
  chroot "$R" /usr/bin/setpriv --reuid="$U" --regid="$U" --clear-groups --no-new-privs --inh-caps=-all \
    --bounding-set=-all -- /usr/bin/env -i $ENV "$@" && exit 0 || exit $?
fi
chroot "$R" /usr/bin/env -i $ENV "$@" && exit 0 || exit $?
"""


# ---- running and cleaning up ---------------------------------------------------------------------------
def _execute(argv, env, cwd, layout: _Layout, limits: Limits, new_session: bool) -> RunResult:
    t0 = time.monotonic()
    with (
        open(layout.stdin_path, "rb") as fin,
        open(layout.stdout_path, "wb") as fout,
        open(layout.stderr_path, "wb") as ferr,
    ):
        proc = subprocess.Popen(
            argv, stdin=fin, stdout=fout, stderr=ferr, env=env, cwd=cwd, close_fds=True, start_new_session=new_session
        )
        wall_exceeded = not _wait_exit(proc, limits.wall_s)
        if wall_exceeded:
            _kill_front(proc, new_session)
        proc.wait()
    wall = time.monotonic() - t0
    stdout, stderr = _read_capped(layout.stdout_path, limits.file_mb * MB), _read_capped(layout.stderr_path, 64 << 10)
    timed_out = wall_exceeded or _killed_by_cpu_limit(proc.returncode, wall, limits.cpu_s)
    returned = None
    for line in reversed(stdout.splitlines()):
        if line.startswith(layout.nonce):
            returned = line[len(layout.nonce) :]
            stdout = stdout[: stdout.rfind(layout.nonce)].removesuffix("\n")
            break
    return RunResult(stdout, stderr, proc.returncode, timed_out, wall, returned)


def _killed_by_cpu_limit(returncode: int | None, wall_s: float, cpu_s: float) -> bool:
    """Whether the program died of RLIMIT_CPU: SIGXCPU at the soft limit, or SIGKILL at the hard one (only
    if it ran for at least ``cpu_s`` of wall time: a single-threaded program's CPU time never exceeds wall
    time, and an earlier SIGKILL came from elsewhere). The bwrap and unshare front processes report a
    program killed by signal N as exit status 128 + N; the rlimits mode reports -N. Any other failure, however
    slow, is a crash, not a timeout."""
    if returncode is None or returncode == 0:
        return False
    sig = -returncode if returncode < 0 else returncode - 128
    return sig == signal.SIGXCPU or (sig == signal.SIGKILL and wall_s >= cpu_s)


def _wait_exit(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait until ``proc`` exits (True) or ``timeout`` passes (False). A pidfd wakes us the moment it exits;
    ``Popen.wait(timeout)`` polls with sleeps of up to 50 ms, which would dominate short runs."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        return bool(select.select([pidfd], [], [], timeout)[0])
    finally:
        os.close(pidfd)


def _kill_front(proc: subprocess.Popen, new_session: bool) -> None:
    """SIGKILL a run past its wall clock. The rlimits mode's process group is killed outright. With
    namespaces the front (bwrap, unshare) is a parent waiting for the namespace's init: kill that child and the
    front reaps it and exits. Killing the front first would orphan the init (it dies by its parent-death
    signal, but as a zombie of pid 1). A front that has not exited after ``FRONT_GRACE_S`` is killed too."""
    if new_session:
        _kill(os.killpg, proc.pid)
        return
    for child in children_of(proc.pid):
        _kill(os.kill, child)
    if not _wait_exit(proc, FRONT_GRACE_S):
        proc.kill()


def _kill(kill, pid: int) -> None:
    try:
        kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read_capped(path: Path, cap: int) -> str:
    with open(path, "rb") as f:
        return f.read(cap).decode("utf-8", errors="replace")


def _remove_tree(path: Path) -> None:
    """Delete a run directory even if the program made parts of it unreadable."""

    def fix(_fn, p, _exc):
        try:
            os.chmod(p, 0o700)
            os.chmod(os.path.dirname(p), 0o700)
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=fix)


# ---- choosing a mechanism ------------------------------------------------------------------------------
_detected: dict[tuple[str, str], Sandbox] = {}
_detect_lock = threading.Lock()


def available(mechanism: str) -> bool:
    """The binaries and privileges a mechanism needs are present (a probe run still decides)."""
    if mechanism == "bwrap":
        return shutil.which("bwrap") is not None and (os.geteuid() != 0 or shutil.which("setpriv") is not None)
    if mechanism == "unshare":
        return os.geteuid() == 0 and all(shutil.which(b) for b in ("unshare", "setpriv", "mount", "chroot"))
    if mechanism == "rlimits":
        return os.geteuid() != 0 or shutil.which("setpriv") is not None
    raise ValueError(f"unknown sandbox mechanism '{mechanism}'; choose from {MECHANISMS} or 'auto'")


def probe(mechanism: str, python: str) -> Sandbox | None:
    """A sandbox of ``mechanism`` if a trivial program runs correctly inside it."""
    if not available(mechanism):
        return None
    box = Sandbox(mechanism, python)
    try:
        result = box.run("print(6 * 7)", limits=Limits(cpu_s=5, wall_s=20))
    except (OSError, RuntimeError) as e:
        log.info("sandbox mechanism %s unavailable: %r", mechanism, e)
        return None
    if result.ok and result.stdout.strip() == "42":
        return box
    log.info("sandbox mechanism %s unavailable: rc=%s %s", mechanism, result.returncode, result.stderr[-300:])
    return None


def get_sandbox(mechanism: str = "auto", python: str | None = None) -> Sandbox:
    """The strongest working mechanism (``auto``) or the named one; probed once per process."""
    if mechanism != "auto" and mechanism not in MECHANISMS:
        raise ValueError(f"unknown sandbox mechanism '{mechanism}'; choose from {MECHANISMS} or 'auto'")
    python = python or default_python()
    key = (mechanism, python)
    with _detect_lock:
        if key not in _detected:
            for name in MECHANISMS if mechanism == "auto" else (mechanism,):
                box = probe(name, python)
                if box:
                    if name == "rlimits" and mechanism == "auto":
                        log.warning(
                            "sandbox: no namespaces available (install bubblewrap); untrusted code "
                            "runs with rlimits%s only",
                            " and a private uid" if box.drop_uid else "",
                        )
                    _detected[key] = box
                    break
            else:
                raise RuntimeError(f"no working sandbox mechanism among {mechanism!r} (python {python})")
        return _detected[key]
