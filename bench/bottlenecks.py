"""Planted bottlenecks: runs made slow in one known place; the verdict must name it, and its suggested change,
applied, must make the run faster. Run by hand, alone (minutes):

    python bench/bottlenecks.py                     # every case
    python bench/bottlenecks.py --cases sync,reward --steps 12

Each case is two ``asyncrl train`` processes on the built-in task (the agent case: bench/agent_env.py's slow
checker): ``before`` with the plant, ``after`` with the change the verdict suggested applied (``FIX`` maps
each verdict to the override that change names, and the table checks that the verdict's change names the
fix's keys). Printed per case: the planted bottleneck, the verdict's
bottleneck and its line, the median step time (steps 2..N) before and after, and their ratio; the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from machine import cpu  # bench/ is on the path of a script run from it

REPO = Path(__file__).resolve().parent.parent
QUIET = [
    "progress_bar=false",
    "report=false",
    "max_train_time_s=0",
    "saver.freq_steps=0",
    "evaluator.freq_steps=0",
    "valid_dataset.size=20",
    "watchdog.no_signal_steps=0",
    "cluster.cpu_split=fixed",
]  # the threads each case sets (the trainer case's fix: actor.threads) apply


@dataclass
class Case:
    name: str
    planted: str  # the verdict's name for what was planted
    before: list[str]
    fix: list[str]  # the change the verdict names, as overrides
    steps: int = 12
    setup: list[str] = field(default_factory=list)  # a command to run once before (e.g. make a model)


BIG = REPO / "outputs" / "bench-100m"
CASES = [
    Case("trainer", "trainer-bound", ["actor.ppo_epochs=4"], ["actor.threads=2"]),
    Case(
        "generator",
        "generator-bound",
        [
            "rollout.max_head_offpolicyness=0",
            "rollout.max_slots=8",
            "gconfig.max_new_tokens=128",
            "gconfig.temperature=1.5",
        ],
        ["rollout.max_head_offpolicyness=2"],
    ),
    Case(
        "tools",
        "tool-bound",
        [
            "rollout.max_head_offpolicyness=0",
            "workflow.name=agent",
            "agent.episode=agent_env:episode",
            "agent.client=inprocess",
            "agent.options={attempts: 3, tool_latency_s: 1.0, tool_latency_p99_s: 4.0}",
            "train_dataset.batch_size=4",
            "gconfig.n_samples=4",
            "rollout.max_slots=64",
        ],
        ["rollout.max_head_offpolicyness=4"],
        steps=8,
    ),
    # training as few tokens as a step can (one group of two 4-token answers), so that publishing ~100M weights
    # weighs as much as it can beside training them. Not enough on an AVX2-only EPYC with a fast page cache: there
    # the disk publish took 0.44 s of a 1.8 s step, no slower than in process, and the verdict rightly said
    # trainer-bound (the case needs a transport that is really slow on the machine)
    Case(
        "sync",
        "sync-bound",
        [
            f"model.path={BIG}",
            "rollout.weight_transport=disk",
            "train_dataset.batch_size=1",
            "gconfig.n_samples=2",
            "gconfig.max_new_tokens=4",
            "valid_dataset.size=4",
            "rollout.max_head_offpolicyness=2",
        ],
        ["rollout.weight_transport=inprocess"],
        steps=6,
        setup=["init-model", "--out", str(BIG), "--hidden-size", "768", "--layers", "12"],
    ),
    Case(
        "long tail",
        "long-tail-bound",
        ["rollout.max_head_offpolicyness=0", "workflow.name=bottleneck_env:LongTail", "gconfig.max_new_tokens=400"],
        ["rollout.max_head_offpolicyness=2"],
    ),
    Case(
        "eval+save",
        "eval/checkpoint-bound",
        ["evaluator.freq_steps=1", "valid_dataset.size=200", "saver.freq_steps=1"],
        ["evaluator.freq_steps=10", "saver.freq_steps=10"],
    ),
    Case(
        "reward",
        "reward-bound",
        ["reward.fn=bottleneck_env:slow_arith_reward", "reward.workers=1"],
        ["reward.workers=4"],
    ),
]


def train(args: argparse.Namespace, case: Case, arm: str, overrides: list[str]) -> Path:
    out = args.out / case.name.replace(" ", "-")
    cmd = [
        sys.executable,
        "-m",
        "asyncrl.cli",
        "train",
        *QUIET,
        f"output_dir={out}",
        f"experiment_name={arm}",
        "resume=fresh",
        f"total_train_steps={case.steps if args.steps is None else args.steps}",
        *overrides,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(REPO / "bench"), str(REPO)])}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{case.name} {arm} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return out / arm / "default"


def suggested(top, fix: list[str]) -> bool:
    """Whether the verdict's change names every key the fix sets."""
    return top is not None and all(o.split("=", 1)[0] in top.change for o in fix)


def step_time(run: Path) -> float:
    from asyncrl.telemetry.metrics import read_metrics

    records = read_metrics(run)
    return statistics.median(r["step_time_s"] for r in records if r["step"] > 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    p.add_argument("--steps", type=int, default=None, help="training steps per run (default: the case's)")
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "bench-bottlenecks")
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from asyncrl.report.diagnose import diagnose_dir

    wanted = {c.strip() for c in args.cases.split(",") if c.strip()}
    print(cpu())
    rows = []
    for case in CASES:
        if wanted and case.name not in wanted:
            continue
        if case.setup and not (BIG / "config.json").exists():
            subprocess.run([sys.executable, "-m", "asyncrl.cli", *case.setup], check=True, capture_output=True)
        before = train(args, case, "before", case.before)
        verdict = diagnose_dir(before)
        top = verdict.bottleneck
        after = train(args, case, "after", case.before + case.fix)
        t0, t1 = step_time(before), step_time(after)
        rows.append((case, top, t0, t1, suggested(top, case.fix)))
        print(f"\n[{case.name}] planted {case.planted}; verdict: {top.line() if top else 'no bottleneck'}")
        print(
            f"[{case.name}] fix {' '.join(case.fix)}: median step {t0:.2f} s -> {t1:.2f} s ({t0 / t1:.2f}x)", flush=True
        )
    print(
        f"\n{'case':<11} {'planted':<22} {'verdict':<22} {'named':<6} {'step before':>11} {'after':>7} {'speedup':>8}"
        f"  fix (suggested by the verdict?)"
    )
    for case, top, t0, t1, named in rows:
        name = top.name if top else "-"
        print(
            f"{case.name:<11} {case.planted:<22} {name:<22} {'yes' if name == case.planted else 'NO':<6} "
            f"{t0:>10.2f}s {t1:>6.2f}s {t0 / t1:>7.2f}x  {' '.join(case.fix)} ({'yes' if named else 'NO'})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
