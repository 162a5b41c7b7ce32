"""What else the machine ran while this run trained: per step, the cores that processes outside the run kept busy
and the share of time the hypervisor took (steal), so that the verdict can say "the machine was busy" before it
blames the run (a step of 40 s that is 1.8 s on a quiet machine was called trainer-bound).

Read from Linux's ``/proc/stat`` (the machine's CPU time) and ``/proc/PID/stat`` of this process and its
descendants (the run's own: trainer, engine, reward workers, servers it started). Where ``/proc/stat`` counts more
CPUs than this process may use (a container on a larger host), or there is no ``/proc``, nothing is reported."""

from __future__ import annotations

import os
import time
from pathlib import Path

PROC = Path("/proc")


def machine_cpu_s() -> tuple[float, float, int] | None:
    """(busy seconds of every CPU, steal seconds, CPUs counted) since boot; None without /proc/stat."""
    try:
        lines = (PROC / "stat").read_text().splitlines()
    except OSError:
        return None
    fields = [int(x) for x in lines[0].split()[1:]] + [0] * 8
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    hz = os.sysconf("SC_CLK_TCK")
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return (user + nice + system + irq + softirq) / hz, steal / hz, cpus


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its live descendants."""
    hz, total, todo, seen = os.sysconf("SC_CLK_TCK"), 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            stat = (PROC / str(p) / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
            total += (int(fields[11]) + int(fields[12])) / hz  # utime, stime
            for task in (PROC / str(p) / "task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile, or no children file
    return total


class MachineLoad:
    """Called once per step: ``machine_other_cores`` (the cores that processes outside the run kept busy, on
    average, since the last call) and ``machine_steal_frac`` (the hypervisor's share of the machine's time);
    an empty dict where it cannot tell."""

    def __init__(self, pid: int | None = None):
        self.pid = os.getpid() if pid is None else pid
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self._last = self._read()

    def _read(self):
        machine = machine_cpu_s()
        if machine is None or machine[2] != self.cores:  # a container's /proc/stat counts the host's CPUs
            return None
        return time.monotonic(), machine[0], machine[1], tree_cpu_s(self.pid)

    def __call__(self) -> dict:
        now, last = self._read(), self._last
        self._last = now
        if now is None or last is None or now[0] - last[0] <= 0:
            return {}
        dt = now[0] - last[0]
        other = (now[1] - last[1]) - (now[3] - last[3])
        return {
            "machine_other_cores": max(0.0, other / dt),
            "machine_steal_frac": max(0.0, (now[2] - last[2]) / (dt * self.cores)),
        }
