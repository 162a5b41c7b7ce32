"""What else the machine ran (asyncrl.telemetry.load) and the verdict that says it first: a machine kept busy by
other processes was blamed on the run ("trainer-bound -> more cores" at 40 s a step that takes 1.8 s alone)."""

import subprocess
import sys
import time

import pytest

from asyncrl.telemetry.load import MachineLoad, machine_cpu_s
from asyncrl.telemetry.verdict import diagnose


@pytest.mark.skipif(machine_cpu_s() is None, reason="no /proc/stat")
def test_the_cpu_of_processes_outside_the_run_is_counted_and_the_runs_own_is_not():
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        outside = MachineLoad(pid=idle.pid)  # seen from the idle process, this one's work is another's
        own = MachineLoad()  # seen from this process, its own work is not
        if outside._last is None:
            pytest.skip("/proc/stat counts other CPUs than this process may use (a container)")
        t0, cpu0 = time.monotonic(), time.process_time()
        while time.monotonic() - t0 < 1.0:  # one core busy for a second (less of one on a loaded machine)
            sum(i * i for i in range(1000))
        burn = (time.process_time() - cpu0) / (time.monotonic() - t0)  # the cores this process used
        seen_outside, seen_own = outside(), own()
    finally:
        idle.kill()
    difference = seen_outside["machine_other_cores"] - seen_own["machine_other_cores"]
    assert abs(difference - burn) < 0.25, (burn, seen_outside, seen_own)  # this process's work, counted once
    assert seen_outside["machine_other_cores"] >= burn - 0.25 and 0.0 <= seen_own["machine_steal_frac"] <= 1.0


def _steps(other: float, n: int = 12) -> list[dict]:
    base = {"step_time_s": 1.0, "trainer_busy_s": 1.0, "trainer_fwd_bwd_s": 0.9, "gen_busy_s": 0.5}
    return [{"step": 0}] + [{"step": i, **base, "machine_other_cores": other} for i in range(1, n + 1)]


def test_a_busy_machine_heads_the_verdict():
    verdict = diagnose(_steps(1.3), {"max_staleness": 2})
    assert verdict.bottleneck is not None and verdict.bottleneck.name == "machine busy"
    assert "kept 1.3 cores busy" in verdict.bottleneck.evidence and "run it alone" in verdict.bottleneck.change
    assert "machine busy" not in {f.name for f in diagnose(_steps(0.2), {"max_staleness": 2}).findings}
