"""What runs beside training instead of stopping it: checkpoints written in the background, and rewards from an
LLM judge scored while the engine generates. Run by hand, alone:

    python bench/overlap.py --suite saves     # the default run, evaluation every 5 steps, a checkpoint every step
    python bench/overlap.py --suite judge     # a judge served by the run (asyncrl serve), η=0 vs η=2

``saves``: three ``asyncrl train`` runs of the default task (``--steps`` steps): foreground checkpoints
(``saver.background=false``), background ones, and background checkpoints and evaluation
(``evaluator.background=true``); printed: the share of the trainer's wall time in
evaluation and in checkpoints, the wall time to the last step, the median step time, held-out accuracy at the end.

``judge``: the default task rewarded by a judge the run serves itself (``reward.judge.serve``, the shipped
tiny-sft model behind ``asyncrl serve``). That model is no grader: asked in the default template it answers
nothing readable, and a run whose first rewards all fail stops. So the judge here is a stand-in with a real
judge's cost: its prompt is the question and the response (``{question}\n{response}``), it answers with
arithmetic (up to ``reward.judge.max_tokens`` = 16 tokens), and its last number read in 0-1000 is the score.
The scores are meaningless as grades, so this measures throughput, not learning: synchronous (η=0: the
generator stops while the last groups are judged and the trainer trains) against asynchronous (η=2: judging and training
overlap generation); printed: rewards scored per second, the generator's busy fraction, the trainer's wait, step time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from machine import cpu  # bench/ is on the path of a script run from it

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
QUIET = [
    "progress_bar=false",
    "report=false",
    "max_train_time_s=0",
    "watchdog.no_signal_steps=0",
    "cluster.cpu_split=fixed",
]  # as measured before the shared split became the default


def run(out: Path, name: str, overrides: list[str]) -> list[dict]:
    from asyncrl.telemetry.metrics import read_metrics

    cmd = [
        sys.executable,
        "-m",
        "asyncrl.cli",
        "train",
        *QUIET,
        f"output_dir={out}",
        f"experiment_name={name}",
        "resume=fresh",
        *overrides,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(REPO / "bench"), str(REPO)])}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return read_metrics(out / name / "default")


def shares(records: list[dict]) -> dict:
    steps = [r for r in records if r["step"] > 0]
    wall = sum(r["step_time_s"] for r in steps)
    evals = [r["eval_accuracy"] for r in records if "eval_accuracy" in r]
    return {
        "steps": len(steps),
        "wall_s": steps[-1]["elapsed_s"],
        "step_s": statistics.median(r["step_time_s"] for r in steps[1:]),
        "eval": sum(r.get("trainer_eval_s", 0.0) for r in steps) / wall,
        "save": sum(r.get("trainer_save_s", 0.0) for r in steps) / wall,
        "wait": sum(r.get("trainer_wait_s", 0.0) for r in steps) / wall,
        "gen_busy": statistics.mean(r["gen_busy_frac"] for r in steps),
        "rewards_per_s": steps[-1].get("reward_calls", 0) / steps[-1]["elapsed_s"],
        "reward_errors": steps[-1].get("reward_errors", 0),
        "final_accuracy": evals[-1] if evals else None,
    }


def saves(args) -> None:
    common = [f"total_train_steps={args.steps}", "evaluator.freq_steps=5", "saver.freq_steps=1", "saver.freq_seconds=0"]
    arms = {
        "foreground": ["saver.background=false"],
        "background saves": ["saver.background=true"],
        "background saves + evaluation": ["saver.background=true", "evaluator.background=true"],
    }
    rows = {
        arm: shares(run(args.out, "saves-" + arm.replace(" ", "").replace("+", "-"), common + flags))
        for arm, flags in arms.items()
    }
    print(f"\n{cpu()}; the default run, {args.steps} steps, evaluation every 5 steps, a checkpoint every step")
    print(
        "| arm | steps | wall s | wall × | median step s | trainer in eval | trainer in checkpoints | "
        "trainer in eval + checkpoints | final acc |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    base = rows["foreground"]
    for arm, r in rows.items():
        print(
            f"| {arm} | {r['steps']} | {r['wall_s']:.0f} | {r['wall_s'] / base['wall_s']:.2f} | {r['step_s']:.2f} | "
            f"{r['eval']:.1%} | {r['save']:.1%} | {r['eval'] + r['save']:.1%} | {r['final_accuracy']} |"
        )


def judge(args) -> None:
    common = [
        f"total_train_steps={args.steps}",
        "reward.judge.serve=builtin:tiny-sft",
        "reward.judge.score=0-1000",
        'reward.judge.template="{question}\\n{response}"',  # YAML: the two lines, quoted
        "reward.judge.max_tokens=16",
        "reward.workers=2",
        "evaluator.freq_steps=0",
        "valid_dataset.size=8",
        "saver.freq_steps=0",
        "train_dataset.batch_size=8",
    ]
    rows = {
        eta: shares(run(args.out, f"judge-eta{eta}", common + [f"rollout.max_head_offpolicyness={eta}"]))
        for eta in (0, 2)
    }
    print(
        f"\n{cpu()}; the default task, {args.steps} steps of 8 groups x 8 samples, every sample judged by "
        "builtin:tiny-sft served by the run (a stand-in grader: 16 tokens of arithmetic per sample, 2 reward workers)"
    )
    print("| η | rewards/s | generator busy | trainer waiting | median step s | wall s | reward failures |")
    print("|---|---|---|---|---|---|---|")
    for eta, r in rows.items():
        print(
            f"| {eta} | {r['rewards_per_s']:.1f} | {r['gen_busy']:.0%} | {r['wait']:.0%} | {r['step_s']:.2f} | "
            f"{r['wall_s']:.0f} | {r['reward_errors']} |"
        )
    print(f"η=2 / η=0: rewards/s {rows[2]['rewards_per_s'] / rows[0]['rewards_per_s']:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", choices=("saves", "judge"), default="saves")
    p.add_argument("--steps", type=int, default=None, help="training steps per run (saves: 100, judge: 12)")
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "bench-overlap")
    args = p.parse_args()
    args.steps = args.steps or (100 if args.suite == "saves" else 12)
    (saves if args.suite == "saves" else judge)(args)


if __name__ == "__main__":
    main()
