"""What staleness costs in accuracy: naive PPO (anchored on the behaviour policy) against the decoupled objective
(anchored on the recomputed proximal policy, behaviour weight capped), at η = 0, 4, 16 and a much larger value,
the same number of steps, several seeds (AReaL's Table 2 in direction: naive PPO degrades as η grows, the decoupled
objective holds). Run by hand, alone (about an hour):

    python bench/staleness_ablation.py
    python bench/staleness_ablation.py --etas 0,4 --seeds 0 --steps 40     # a quick look
    python bench/staleness_ablation.py & python bench/staleness_ablation.py; wait   # two at once share the runs

Each run is ``asyncrl train`` on the built-in task from builtin:tiny-sft with a small batch (so that many steps
fit: ``--batch`` groups of ``--n`` samples) at ``--lr`` 5e-5 (the global default; the shipped model's own is 1e-5,
docs/algorithms.md "The learning rate"; stale samples hurt in proportion to how far each step moves the policy, but
2e-4 collapses the built-in model even at η = 0: reward 0 from step 60 of 150 on an AMD EPYC, so nothing is left to
compare). Printed: the held-out accuracy (greedy, 200 problems) at the end, mean ± sd over seeds, per loss and η;
the mean staleness each run trained at; the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from machine import cpu  # bench/ is on the path of a script run from it

REPO = Path(__file__).resolve().parent.parent
LOSSES = {
    "naive PPO": ["actor.policy_loss=ppo", "actor.allow_unsafe=true"],
    "decoupled": ["actor.behav_eps_clip=null"],  # AReaL's decoupled loss alone (the default until 2026-12-07)
    "default": [],  # the decoupled loss with the dual anchor (actor.behav_eps_clip=auto)
    # why they differ: with one optimizer step per batch the proximal policy is the current one, so the
    # decoupled clip never binds and the two objectives differ only on the tokens naive PPO clips (and those
    # above the behaviour cap). Without its clip naive PPO is the decoupled objective without its cap;
    # "decoupled tight" asks whether masking behaviour weights outside [1 - ε, 1 + ε] replaces that clip
    # (measured in docs/planner.md: it does not, being blind to the advantage's sign).
    "naive no clip": ["actor.policy_loss=ppo", "actor.allow_unsafe=true", "actor.eps_clip=1000"],
    "decoupled tight": [
        "actor.behav_imp_weight_cap=1.2",
        "actor.behav_imp_weight_floor=0.8",
        "actor.behav_imp_weight_mode=mask",
        "actor.behav_eps_clip=null",
    ],
}
DEFAULT_LOSSES = "naive PPO,decoupled,default"


def run_dir(args, loss: str, eta: int, seed: int) -> Path:
    return args.out / f"{loss.replace(' ', '_')}-eta{eta}-seed{seed}"


def record_of(args, loss: str, eta: int, seed: int) -> Path:
    return run_dir(args, loss, eta, seed) / "asyncrl" / "default" / "metrics.jsonl"


def train(args, loss: str, eta: int, seed: int) -> None:
    out = run_dir(args, loss, eta, seed)
    cmd = [
        sys.executable,
        "-m",
        "asyncrl.cli",
        "train",
        "progress_bar=false",
        "report=false",
        "max_train_time_s=0",
        "saver.freq_steps=0",
        f"output_dir={out}",
        "resume=fresh",
        f"total_train_steps={args.steps}",
        f"train_dataset.batch_size={args.batch}",
        f"gconfig.n_samples={args.n}",
        f"actor.lr={args.lr}",
        f"rollout.max_head_offpolicyness={eta}",
        f"seed={seed}",
        f"train_dataset.seed={seed}",
        f"evaluator.freq_steps={args.steps}",
        "watchdog.no_signal_steps=0",
        "cluster.cpu_split=fixed",
        *LOSSES[loss],
    ]  # 1 + 1 threads, as the table in docs/planner.md
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{loss} η={eta} seed={seed} failed:\n{done.stderr[-2000:]}")


def result(record: Path) -> dict:
    records = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    steps = [r for r in records if r["step"] > 0]
    evals = [r["eval_accuracy"] for r in records if "eval_accuracy" in r]
    return {"final": evals[-1], "start": evals[0], "staleness": statistics.mean(r["staleness_mean"] for r in steps)}


def claim(args, name: str) -> bool:
    """Take the run ``name`` for this process unless a live process has it (invocations side by side share the
    work: each takes the next run nobody has)."""
    claims = args.out / "claims"
    claims.mkdir(parents=True, exist_ok=True)
    path = claims / name
    try:
        owner = int(path.read_text() or 0)
        os.kill(owner, 0)
        return owner == os.getpid()
    except (FileNotFoundError, ValueError, ProcessLookupError):
        pass
    path.write_text(str(os.getpid()))
    return int(path.read_text()) == os.getpid()


def _finished(record: Path, steps: int) -> bool:
    """Whether a run's record reaches its last step (a run stopped half-way is run again)."""
    lines = record.read_text().splitlines() if record.exists() else []
    return bool(lines) and json.loads(lines[-1]).get("step") == steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--etas", default="0,4,16,256")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "bench-staleness")
    p.add_argument("--losses", default=DEFAULT_LOSSES, help=f"comma-separated, of {', '.join(LOSSES)}")
    p.add_argument("--fresh", action="store_true", help="rerun runs that already finished")
    args = p.parse_args(argv)
    etas = [int(e) for e in args.etas.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    print(cpu())
    print(f"{args.steps} steps of {args.batch} x {args.n} samples, actor.lr={args.lr}, seeds {seeds}")
    losses = args.losses.split(",")
    if unknown := set(losses) - set(LOSSES):
        p.error(f"--losses: unknown {sorted(unknown)}; known: {', '.join(LOSSES)}")
    configs = [(loss, eta) for eta in etas for loss in losses if not (eta == 0 and loss != "decoupled")]  # on-
    # policy (η = 0) every objective is the same (the decoupled run stands for all)
    for loss, eta in configs:
        for seed in seeds:
            record = record_of(args, loss, eta, seed)
            if (args.fresh or not _finished(record, args.steps)) and claim(args, record.parent.parent.parent.name):
                train(args, loss, eta, seed)
    while not all(_finished(record_of(args, loss, eta, seed), args.steps) for loss, eta in configs for seed in seeds):
        time.sleep(10)  # runs that another invocation has under way
    table = {}
    for loss, eta in configs:
        results = [result(record_of(args, loss, eta, seed)) for seed in seeds]
        table[(loss, eta)] = results
        acc = [r["final"] for r in results]
        print(
            f"{loss:<16} η={eta:<4} accuracy {statistics.mean(acc):.3f} ± {statistics.pstdev(acc):.3f} "
            f"(start {results[0]['start']:.3f}; trained at mean staleness "
            f"{statistics.mean(r['staleness'] for r in results):.2f})",
            flush=True,
        )
    print(f"\n{'η':>5} " + " ".join(f"{loss:>16}" for loss in losses))
    for eta in etas:
        cells = []
        for loss in losses:
            results = table.get((loss, eta)) or table.get(("decoupled", eta))
            acc = [r["final"] for r in results]
            cells.append(f"{statistics.mean(acc):.3f} ± {statistics.pstdev(acc):.3f}")
        print(f"{eta:>5} " + " ".join(f"{c:>16}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
