"""The first code that runs inside a sandbox, already as the unprivileged user: lower the resource limits,
then run the untrusted program in the same interpreter.

Why a prologue rather than ``preexec_fn``: the training process has threads running, and ``preexec_fn`` is
unsafe after ``fork`` in a threaded process. Limits set by the process on itself cannot be raised again by
the code that follows (soft and hard limits are both lowered), so this is as strong as setting them from
outside. This file is copied into the sandbox and run by the system interpreter with ``-I -S``: it may only
use the standard library and must not import asyncrl.

Usage (inside the sandbox): ``python3 -I -S _run.py SPEC_JSON``; the spec holds ``program``, ``cwd``,
``limits``, ``init`` (true under bubblewrap's ``--as-pid-1``: this process is the pid namespace's init) and,
for a function call, ``call = {"fn_name", "args", "nonce"}``.
"""

import json
import os
import resource
import sys

MB = 1 << 20


def own_process_count() -> int:
    """Processes of our real uid visible in /proc (the sandbox's own when it has a pid namespace)."""
    uid, count = os.getuid(), 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            count += int(line.split()[1]) == uid
                            break
            except OSError:
                pass
    return count


def apply_limits(limits: dict) -> None:
    """Lower soft and hard limits; RLIMIT_NPROC counts every process of our uid, so it is set relative to the
    processes that already exist (a pid namespace or a private uid makes that number small)."""
    cpu = int(limits["cpu_s"]) + (limits["cpu_s"] % 1 > 0)
    caps = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_AS: (limits["memory_mb"] * MB,) * 2,
        resource.RLIMIT_FSIZE: (limits["file_mb"] * MB,) * 2,
        resource.RLIMIT_NOFILE: (limits["nofile"],) * 2,
        resource.RLIMIT_CORE: (0, 0),
        resource.RLIMIT_NPROC: (own_process_count() + limits["nproc"],) * 2,
    }
    for res, (soft, hard) in caps.items():
        cur_soft, cur_hard = resource.getrlimit(res)
        if cur_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, cur_hard), min(hard, cur_hard)
        resource.setrlimit(res, (soft, hard))


def run_script(path: str) -> None:
    """Run ``path`` as ``__main__`` (stdin/stdout style)."""
    with open(path) as f:
        source = f.read()
    sys.argv = [path]
    exec(compile(source, path, "exec"), {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__})


def call_function(path: str, fn_name: str, args: list, nonce: str) -> None:
    """Import ``path`` under a non-main name (its ``if __name__ == '__main__'`` block stays quiet), call
    ``fn_name(*args)`` (or ``Solution().fn_name`` in the LeetCode style) and print the JSON result on a line
    that starts with ``nonce``."""
    with open(path) as f:
        source = f.read()
    scope = {"__name__": "__solution__", "__file__": path, "__builtins__": __builtins__}
    exec(compile(source, path, "exec"), scope)
    fn = scope.get(fn_name)
    if fn is None and isinstance(scope.get("Solution"), type):
        fn = getattr(scope["Solution"](), fn_name, None)
    if not callable(fn):
        raise SystemExit(f"the program defines no function '{fn_name}'")
    result = fn(*args)
    sys.stdout.flush()
    os.write(1, ("\n" + nonce + json.dumps(result, default=repr) + "\n").encode())


def become_init() -> None:
    """Be the pid namespace's init, as a parent that bubblewrap waits for. bubblewrap's own init outlives the
    bwrap process (which exits as soon as the program does), so nothing outside would reap it.

    Fork: the child returns and runs the program; this process reaps every process that ends up with it
    until the program exits, then exits with the program's status (128 + N if signal N killed it, as bwrap
    reports). When it exits the kernel kills and reaps what is left in the namespace. The program is not pid
    1, so it can still be stopped by signals that have no handler, such as its CPU limit's SIGXCPU. An init
    ignores those."""
    program = os.fork()
    if program == 0:
        return
    while True:
        pid, status = os.wait()
        if pid == program:
            os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    if spec.get("init"):
        become_init()
    os.chdir(spec["cwd"])
    apply_limits(spec["limits"])
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)  # judges print big integers
    call = spec.get("call")
    if call:
        call_function(spec["program"], call["fn_name"], call["args"], call["nonce"])
    else:
        run_script(spec["program"])


if __name__ == "__main__":
    main()
