"""Held-out accuracy of each algorithm after the same wall-time budget, on the built-in task.

    python bench/algorithms.py [--budget-s 150] [--algos grpo,dr_grpo,rloo,dapo,gspo,ppo] [key=value ...]

Each algorithm trains ``builtin:tiny-sft`` with its preset ``examples/<algo>.yaml`` for ``--budget-s``
seconds of wall time (``max_train_time_s``; evaluation is only at the start and the end), one after the
other in this process, then the table is printed: steps done, held-out accuracy before and after, and the
mean training reward over the last five steps. Extra ``key=value`` arguments override every run. The
numbers depend on the machine's load: give every algorithm the same quiet machine.
"""

from __future__ import annotations

import argparse
import logging
import statistics
from pathlib import Path

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.launch.train import train
from asyncrl.telemetry.metrics import read_metrics

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run(algo: str, budget_s: float, out: str, overrides: list[str]) -> dict:
    cfg = configlib.load(
        TrainConfig,
        str(EXAMPLES / f"{algo}.yaml"),
        [
            f"max_train_time_s={budget_s}",
            "total_train_steps=100000",
            f"output_dir={out}",
            "trial_name=bench",
            "progress_bar=false",
            "report=false",
            "evaluator.freq_steps=0",
            "saver.freq_steps=0",
            *overrides,
        ],
    )
    train(cfg)
    records = read_metrics(Path(out) / cfg.experiment_name / "bench")
    steps = [r for r in records if r["step"] > 0]
    return {
        "algo": algo,
        "steps": len(steps),
        "train_s": steps[-1]["elapsed_s"] if steps else 0.0,
        "acc_start": records[0]["eval_accuracy"],
        "acc_end": steps[-1].get("eval_accuracy", float("nan")) if steps else float("nan"),
        "reward_last5": statistics.mean(r["reward_mean"] for r in steps[-5:]) if steps else float("nan"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algos", default="grpo,dr_grpo,rloo,dapo,gspo,ppo")
    p.add_argument("--budget-s", type=float, default=150.0, help="training wall time per algorithm")
    p.add_argument("--out", default="outputs/bench_algorithms")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rows = []
    for algo in args.algos.split(","):
        rows.append(run(algo, args.budget_s, args.out, args.overrides))
        r = rows[-1]
        print(f"{algo}: {r['steps']} steps, eval accuracy {r['acc_start']:.3f} -> {r['acc_end']:.3f}", flush=True)
    print(f"\nbudget {args.budget_s:.0f} s of training per algorithm\n")
    print("| algorithm | steps | train s | eval accuracy start | eval accuracy end | reward (last 5 steps) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['algo']} | {r['steps']} | {r['train_s']:.0f} | {r['acc_start']:.3f} | {r['acc_end']:.3f} | "
            f"{r['reward_last5']:.3f} |"
        )


if __name__ == "__main__":
    main()
