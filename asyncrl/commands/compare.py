"""``asyncrl compare``: which configuration wins on your task, beyond the noise of seeds.

N arms x S seeds of ``asyncrl train`` from one base (``--config`` and the trailing ``key=value`` overrides), each
arm adding its own overrides (``--arm NAME=KEY=VALUE,KEY=VALUE``; ``--arm NAME=`` is the base alone), every run
with the same budget (the base's ``total_train_steps`` / ``max_train_time_s``) and its seed (``seed`` and
``train_dataset.seed``). Runs go one after another, or ``--parallel`` at once, each into
``OUT/ARM/seedS`` (a finished run is read again, not rerun, unless ``--fresh``), and the table says per arm: the
final and the best held-out accuracy (mean ± sd over seeds, with a 95% confidence interval of the mean), the time
to ``--target`` accuracy, the realised staleness (a run whose mean staleness stays far below its η says so), and
the correction audit (the share of tokens each term changed, the ESS of the behaviour weights, the drift). It names
a winner only where Welch's test tells the best arm apart from every other at ``--alpha`` (0.05); otherwise "no
difference beyond noise". ``OUT/compare.json`` and ``OUT/compare.md`` keep the result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from asyncrl.commands.stats import summarize, welch
from asyncrl.configlib import ConfigError

PROG = "asyncrl compare"
AUDIT_KEYS = (
    "clip_frac",
    "behav_weight_capped_frac",
    "behav_clip_frac",
    "prob_mask_frac",
    "m2_mask_frac",
    "m2_clip_frac",
    "ess",
    "behav_kl_stale",
    "behav_kl_fresh",
)
FAR_BELOW = 0.5  # a run whose mean staleness is below this share of its η did not train as stale as it was allowed


@dataclass
class Arm:
    name: str
    overrides: list[str] = field(default_factory=list)


def add_arguments(p) -> None:
    p.description = __doc__.split("\n\n")[0].strip() + " " + __doc__.split("\n\n")[1].strip()
    p.add_argument("--config", help="YAML file of the base configuration (asyncrl train's)")
    p.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="NAME=OVERRIDES",
        help="an arm: its name, '=', its overrides separated by commas or spaces (e.g. "
        "'dual=actor.behav_eps_clip=0.2'; 'base=' for the base alone); two or more",
    )
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, each arm runs every one (default 0,1,2)")
    p.add_argument("--out", default="outputs/compare", help="where the runs and the table go")
    p.add_argument("--parallel", type=int, default=1, help="runs at once (they share the machine's cores)")
    p.add_argument("--target", type=float, default=None, help="held-out accuracy whose time to reach is reported")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level for naming a winner")
    p.add_argument("--fresh", action="store_true", help="rerun the runs that already finished")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides of the base, for every arm")


def parse_arms(specs: list[str]) -> list[Arm]:
    arms = []
    for spec in specs:
        name, sep, rest = spec.partition("=")
        name = name.strip()
        if not sep or not name or "/" in name or name.startswith("."):
            raise ConfigError(f"--arm '{spec}': give NAME=OVERRIDES (e.g. dual=actor.behav_eps_clip=0.2; base=)")
        overrides = [o for o in rest.replace(",", " ").split() if o]
        bad = [o for o in overrides if "=" not in o]
        if bad:
            raise ConfigError(f"--arm {name}: '{bad[0]}' is not key=value")
        if any(a.name == name for a in arms):
            raise ConfigError(f"--arm {name} is given twice: give each arm its own name")
        arms.append(Arm(name, overrides))
    if len(arms) < 2:
        raise ConfigError("asyncrl compare needs two or more --arm (NAME=OVERRIDES; NAME= for the base alone)")
    return arms


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds must be comma-separated integers, got '{text}'") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds must name distinct seeds, got '{text}'")
    return seeds


def check_configs(config: str | None, base: list[str], arms: list[Arm]) -> dict[str, object]:
    """Load every arm's configuration before any run starts (a bad key is refused here, in one line); returns
    each arm's η (a number, or 'auto')."""
    from asyncrl import configlib
    from asyncrl.config import TrainConfig

    etas = {}
    for arm in arms:
        try:
            cfg = configlib.load(TrainConfig, config, [*base, *arm.overrides])
        except ConfigError as e:
            raise ConfigError(f"arm {arm.name}: {e}") from None
        etas[arm.name] = cfg.rollout.max_head_offpolicyness
    return etas


def run_dir(out: Path, arm: Arm, seed: int) -> Path:
    return out / arm.name / f"seed{seed}"


def command(config: str | None, base: list[str], arm: Arm, seed: int, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "asyncrl.cli",
        "train",
        *(["--config", config] if config else []),
        *base,
        *arm.overrides,
        f"seed={seed}",
        f"train_dataset.seed={seed}",
        f"output_dir={run_dir(out, arm, seed)}",
        "experiment_name=compare",
        "trial_name=run",
        "resume=fresh",
        "progress_bar=false",
        "report=false",
    ]


def train_one(config, base, arm: Arm, seed: int, out: Path, fresh: bool) -> Path:
    """Run (or find finished) one arm's seed; its run directory. A failed run stops the comparison with its
    last lines."""
    where = run_dir(out, arm, seed)
    done = where / "done.json"
    if done.is_file() and not fresh:
        return where / "compare" / "run"
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        command(config, base, arm, seed, out), capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    (where / "train.log").write_text(proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RuntimeError(
            f"arm {arm.name}, seed {seed} failed (exit {proc.returncode}; {where / 'train.log'}):\n{tail}"
        )
    done.write_text(proc.stdout.strip().splitlines()[-1] + "\n" if proc.stdout.strip() else "{}\n")
    return where / "compare" / "run"


def read_run(path: Path, target: float | None) -> dict:
    """What a finished run says: final, best and starting held-out accuracy, time to ``target``, realised
    staleness, steps and the audit's means over its steps."""
    from asyncrl.telemetry.metrics import read_metrics

    records = read_metrics(path)
    steps = [r for r in records if r.get("step", 0) > 0]
    evals = [r for r in records if isinstance(r.get("eval_accuracy"), (int, float))]
    if not evals or not steps:
        raise RuntimeError(f"{path}: no held-out evaluation or no training step in metrics.jsonl")
    reached = next((r for r in evals if target is not None and r["eval_accuracy"] >= target), None)

    def mean(key):
        values = [r[key] for r in steps if isinstance(r.get(key), (int, float))]
        return sum(values) / len(values) if values else None

    return {
        "final": evals[-1]["eval_accuracy"],
        "best": max(r["eval_accuracy"] for r in evals),
        "start": evals[0]["eval_accuracy"],
        "time_to_target_s": None if reached is None else reached.get("elapsed_s", 0.0),
        "steps": steps[-1]["step"],
        "elapsed_s": steps[-1].get("elapsed_s"),
        "staleness_mean": mean("staleness_mean"),
        "staleness_max": max((r.get("staleness_max") or 0) for r in steps),
        **{k: mean(k) for k in AUDIT_KEYS},
    }


def table(arms: list[Arm], results: dict[str, list[dict]], etas: dict, target, alpha: float) -> dict:
    """Per arm: the summaries of final/best accuracy, time to target, staleness and audit; and the verdict."""
    rows = []
    for arm in arms:
        runs = results[arm.name]
        final, best = summarize([r["final"] for r in runs]), summarize([r["best"] for r in runs])
        times = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
        staleness = summarize([r["staleness_mean"] or 0.0 for r in runs])
        eta = etas[arm.name]
        far = isinstance(eta, int) and eta > 0 and staleness.mean < FAR_BELOW * eta
        rows.append(
            {
                "arm": arm.name,
                "overrides": arm.overrides,
                "eta": eta,
                "seeds": len(runs),
                "final": final.__dict__,
                "best": best.__dict__,
                "time_to_target_s": (sorted(times)[len(times) // 2] if times else None),
                "reached": len(times),
                "staleness_mean": staleness.mean,
                "staleness_max": max(r["staleness_max"] for r in runs),
                "staleness_far_below_eta": far,
                "audit": {k: _mean([r[k] for r in runs]) for k in AUDIT_KEYS},
            }
        )
    ranked = sorted(rows, key=lambda r: -r["final"]["mean"])
    top = ranked[0]
    tests = [
        {"against": other["arm"], "diff": d, "p": p}
        for other in ranked[1:]
        for d, p in [welch([r["final"] for r in results[top["arm"]]], [r["final"] for r in results[other["arm"]]])]
    ]
    beats_all = all(t["p"] < alpha and t["diff"] > 0 for t in tests)
    verdict = (
        f"{top['arm']} wins: its final held-out accuracy is above every other arm's beyond noise (Welch, p < {alpha})"
        if beats_all
        else f"no difference beyond noise: {top['arm']} has the best mean, but not beyond noise against "
        + ", ".join(t["against"] for t in tests if not (t["p"] < alpha and t["diff"] > 0))
        + f" (Welch, p >= {alpha})"
    )
    return {
        "rows": rows,
        "tests": tests,
        "winner": top["arm"] if beats_all else None,
        "verdict": verdict,
        "target": target,
        "alpha": alpha,
    }


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def markdown(result: dict) -> str:
    target = result["target"]
    head = (
        "| arm | η | final held-out (mean ± sd) | 95% CI | best | "
        + (f"time to {target:g} | " if target is not None else "")
        + "staleness mean / max | proximal clip | behaviour cap | behaviour trust | ESS | drift KL |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in result["rows"]:
        a, f = r["audit"], r["final"]
        trust = sum(a[k] or 0.0 for k in ("behav_clip_frac", "prob_mask_frac", "m2_mask_frac", "m2_clip_frac"))
        time_cell = (
            "not reached"
            if r["time_to_target_s"] is None
            else f"{r['time_to_target_s']:.0f} s ({r['reached']}/{r['seeds']})"
        )
        lines.append(
            f"| {r['arm']} | {r['eta']} | {f['mean']:.3f} ± {f['sd']:.3f} | ±{f['ci95']:.3f} | "
            f"{r['best']['mean']:.3f} | "
            + (f"{time_cell} | " if target is not None else "")
            + f"{r['staleness_mean']:.2f}{' (far below η)' if r['staleness_far_below_eta'] else ''} / "
            f"{r['staleness_max']} | {_pct(a['clip_frac'])} | {_pct(a['behav_weight_capped_frac'])} | "
            f"{_pct(trust)} | {_num(a['ess'])} | {_num(a['behav_kl_stale'], 4)} |"
        )
    lines.append("")
    lines.append(result["verdict"])
    return "\n".join(lines) + "\n"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.2%}"


def _num(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def run(args) -> int:
    from asyncrl.cluster.cores import cpu_model

    try:
        arms, seeds = parse_arms(args.arm), parse_seeds(args.seeds)
        if args.parallel < 1:
            raise ConfigError("--parallel must be >= 1")
        etas = check_configs(args.config, list(args.overrides), arms)
    except ConfigError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"{PROG}: {len(arms)} arms x {len(seeds)} seeds into {out} ({cpu_model()}, {args.parallel} at once)",
        file=sys.stderr,
        flush=True,
    )
    t0 = time.perf_counter()
    jobs = [(arm, seed) for seed in seeds for arm in arms]
    try:
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            paths = list(
                pool.map(lambda job: train_one(args.config, args.overrides, job[0], job[1], out, args.fresh), jobs)
            )
        results = {arm.name: [] for arm in arms}
        for (arm, _), path in zip(jobs, paths):
            results[arm.name].append(read_run(path, args.target))
    except RuntimeError as e:
        print(f"{PROG}: stopped: {e}", file=sys.stderr)
        return 1
    result = table(arms, results, etas, args.target, args.alpha)
    result.update(
        seeds=seeds,
        cpu=cpu_model(),
        wall_s=time.perf_counter() - t0,
        base=list(args.overrides),
        config=args.config,
        runs={a: r for a, r in results.items()},
    )
    (out / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    (out / "compare.md").write_text(text)
    print(text)
    return 0
