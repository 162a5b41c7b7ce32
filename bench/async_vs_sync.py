"""The headline benchmark: asynchronous vs synchronous RL (vs TRL's GRPOTrainer), on this machine, side by side.

    python bench/async_vs_sync.py                      # headline: η = 0 (sync) vs η = 1, 2, 4, 8 (async)
    python bench/async_vs_sync.py --suite ablations    # interruptible vs not; decoupled loss vs naive PPO
    python bench/async_vs_sync.py --suite trl          # TRL GRPOTrainer on the same model, task and data
    python bench/async_vs_sync.py --suite threads      # async with other splits of the same cores
    python bench/async_vs_sync.py --suite auto         # η=auto and cluster.cpu_split=auto against every fixed η
    python bench/async_vs_sync.py --suite all          # everything above in one go
    python bench/async_vs_sync.py --quick              # plumbing check: tiny budgets, minutes

Every arm is one ``asyncrl train`` process (``bench/trl_grpo.py`` for TRL) on the same model, seed, prompts,
held-out split and batch shape; only η, the loss, the interrupt mode and the thread split differ. Same total
CPU: the synchronous arm gets both cores for each phase (``actor.threads=2 rollout.threads=2``; its phases
alternate), the asynchronous arms one core each for the trainer and the generator (1 + 1, at the same time),
TRL both cores. The auto suite adds a synchronous arm with the CPU default (``cluster.cpu_split=auto``: the
trainer on both cores, the generator on one, which on 2 cores avoids libgomp's sleeping workers:
asyncrl/cluster/cores.py) and the asynchronous arm with it.

The prompts are chain-arithmetic problems with a long-tailed length mix (``--mix``, number of terms: mostly
short, a tail of long ones whose worked answers take 2-3x as many tokens), written to
``OUT/data/{train,valid}.jsonl``.
The long tail is what makes synchronous generation wait: a batch is done only when its longest sample is.

Each arm runs ``--steps`` training steps (capped at ``--max-time-s``), evaluating greedy accuracy on the
held-out split every ``--eval-every`` steps (evaluation time is included in wall time for every arm). Then:

- time to target = ``elapsed_s`` of the first evaluation with accuracy >= ``--target`` (absolute, e.g.
  ``0.4``, or ``+0.15``: that much above the step-0 accuracy, which is the same for every arm: same model,
  same held-out split, greedy); speedup = the synchronous arm's time to target over the arm's;
- final accuracy after the same number of steps (the paper's "equal accuracy" check: within 2 points);
- generated tokens/s, trained tokens/s, generator and trainer idle fractions, staleness histogram.

Outputs in ``OUT`` (default ``outputs/bench/async_vs_sync``), per suite: ``results-SUITE.json``,
``results-SUITE.md`` (the table), ``summary-SUITE.png`` (accuracy vs wall time, time to target, idle
fractions, staleness), and every arm's run
directory under ``runs/`` with its own ``report.html``. An arm whose configuration is refused (e.g. an
interrupt mode this version does not have) is reported as such, and the rest still run. A finished arm is
reused when its configuration is unchanged (``--fresh`` reruns it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from asyncrl.report import ReportError, RunSummary, load_run, pyplot, summarize, write_report  # noqa: E402

DEFAULT_OUT = REPO / "outputs" / "bench" / "async_vs_sync"
DEFAULT_MIX = "3-5:0.85,6-12:0.15"
ARM_DONE = "arm.json"


# ---- the task data: a long-tailed length mix ------------------------------------------------------------
@dataclass(frozen=True)
class LengthMix:
    """A mixture over the number of terms: ``[(min_terms, max_terms, weight), ...]``."""

    buckets: tuple[tuple[int, int, float], ...]

    @classmethod
    def parse(cls, spec: str) -> LengthMix:
        buckets = []
        for part in spec.split(","):
            try:
                span, weight = part.split(":")
                lo, _, hi = span.partition("-")
                buckets.append((int(lo), int(hi or lo), float(weight)))
            except ValueError:
                raise SystemExit(f"--mix: '{part}' is not MIN-MAX:WEIGHT (e.g. {DEFAULT_MIX})") from None
        if any(lo < 2 or hi < lo or w <= 0 for lo, hi, w in buckets):
            raise SystemExit(f"--mix: need 2 <= MIN <= MAX and WEIGHT > 0, got '{spec}'")
        return cls(tuple(buckets))

    def problem(self, rng: random.Random, max_operand: int = 99) -> dict:
        from asyncrl.data.arith import ArithTask

        lo, hi, _ = rng.choices(self.buckets, weights=[w for *_, w in self.buckets])[0]
        item = ArithTask(min_terms=lo, max_terms=hi, max_operand=max_operand).problem(rng)
        return {**item, "terms": item["question"].count(" + ") + item["question"].count(" - ") + 1}


def write_task_files(out: Path, mix: LengthMix, n_train: int, n_valid: int, seed: int) -> tuple[Path, Path]:
    """``train.jsonl`` and a disjoint ``valid.jsonl`` (question, answer, solution, terms), deterministic."""
    out.mkdir(parents=True, exist_ok=True)
    train_path, valid_path = out / "train.jsonl", out / "valid.jsonl"
    rng, seen, valid = random.Random(seed + 10_000), set(), []
    while len(valid) < n_valid:
        item = mix.problem(rng)
        if item["question"] not in seen:
            seen.add(item["question"])
            valid.append(item)
    rng, train = random.Random(seed), []
    while len(train) < n_train:
        item = mix.problem(rng)
        if item["question"] not in seen:
            train.append(item)
    for path, items in ((train_path, train), (valid_path, valid)):
        text = "".join(json.dumps(it) + "\n" for it in items)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    return train_path, valid_path


# ---- arms and the shared setup ------------------------------------------------------------------------
@dataclass(frozen=True)
class Setup:
    """What every arm shares."""

    model: str
    target: str  # "0.4" (absolute) or "+0.15" (above the step-0 accuracy)
    steps: int
    max_time_s: float
    batch_size: int
    n_samples: int
    max_new_tokens: int
    max_slots: int
    eval_every: int
    valid_size: int
    lr: float
    seed: int
    mix: str
    cores: int
    extra: tuple[str, ...] = ()  # --set KEY=VALUE overrides for every asyncrl arm

    def overrides(self, train_path: Path, valid_path: Path) -> list[str]:
        return [
            f"model.path={self.model}",
            f"seed={self.seed}",
            "progress_bar=false",
            f"total_train_steps={self.steps}",
            f"max_train_time_s={self.max_time_s}",
            f"train_dataset.path={train_path}",
            "train_dataset.type=qa",
            f"train_dataset.seed={self.seed}",
            f"train_dataset.batch_size={self.batch_size}",
            f"valid_dataset.path={valid_path}",
            f"valid_dataset.size={self.valid_size}",
            "reward.fn=asyncrl.data.arith:arith_reward",
            "reward.workers=0",
            f"gconfig.n_samples={self.n_samples}",
            f"gconfig.max_new_tokens={self.max_new_tokens}",
            f"rollout.max_slots={self.max_slots}",
            f"evaluator.freq_steps={self.eval_every}",
            "saver.freq_steps=0",
            f"actor.lr={self.lr}",
            *self.extra,
        ]


@dataclass(frozen=True)
class Arm:
    name: str  # directory name, e.g. "eta4-ppo"
    label: str  # table label
    eta: int | str  # a number, or "auto" (tuned online up to rollout.max_staleness_limit)
    overrides: tuple[str, ...] = ()
    threads: tuple[int, int] = (1, 1)  # (trainer, generator) torch threads
    runner: str = "asyncrl"  # or "trl"

    def all_overrides(self) -> list[str]:
        return [
            f"rollout.max_head_offpolicyness={self.eta}",
            "cluster.cpu_split=fixed",  # an arm may say auto
            f"actor.threads={self.threads[0]}",
            f"rollout.threads={self.threads[1]}",
            *self.overrides,
        ]


def sync_arm(cores: int) -> Arm:
    return Arm("eta0-sync", "sync η=0", 0, threads=(cores, cores))


def async_arm(eta: int, cores: int, *extra: str, name: str = "", label: str = "") -> Arm:
    split = (max(1, cores // 2), max(1, cores - cores // 2))
    return Arm(name or f"eta{eta}", label or f"async η={eta}", eta, tuple(extra), threads=split)


def suite_arms(suite: str, cores: int) -> list[Arm]:
    sync = sync_arm(cores)
    headline = [sync] + [async_arm(eta, cores) for eta in (1, 2, 4, 8)]
    naive = ("actor.policy_loss=ppo", "actor.allow_unsafe=true")
    ablations = [
        sync,
        async_arm(4, cores),  # interruptible (recompute), decoupled loss: the default
        async_arm(4, cores, "rollout.interrupt_mode=drain", name="eta4-drain", label="η=4 non-interruptible (drain)"),
        async_arm(4, cores, "rollout.interrupt_mode=abort", name="eta4-abort", label="η=4 abort + resubmit"),
        async_arm(4, cores, *naive, name="eta4-ppo", label="η=4 naive PPO"),
        async_arm(8, cores),
        async_arm(8, cores, *naive, name="eta8-ppo", label="η=8 naive PPO"),
    ]
    trl = [sync, async_arm(4, cores), Arm("trl-grpo", "TRL GRPOTrainer", 0, threads=(cores, cores), runner="trl")]
    # the same cores, split differently: the trainer is the bottleneck here, so give it more threads
    # (more threads than cores: the OS time-slices them)
    threads = [
        sync,
        async_arm(2, cores),
        Arm("eta2-t21", f"async η=2 ({cores}+1 threads)", 2, threads=(cores, 1)),
        Arm("eta2-t22", f"async η=2 ({cores}+{cores} threads)", 2, threads=(cores, cores)),
    ]
    # η tuned online against every fixed η; and with the cores shared by need (cluster.cpu_split=auto: the trainer
    # borrows the engine's core while the engine idles)
    auto = headline + [
        Arm("eta0-sync-split", "sync η=0, cpu_split=auto", 0, ("cluster.cpu_split=auto",), threads=(cores, cores)),
        async_arm("auto", cores, "rollout.max_staleness_limit=8", name="eta-auto", label="async η=auto (≤8)"),
        Arm(
            "eta-auto-split",
            "async η=auto, cpu_split=auto",
            "auto",
            ("rollout.max_staleness_limit=8", "cluster.cpu_split=auto"),
            threads=(cores, cores),
        ),
    ]
    suites = {"headline": headline, "ablations": ablations, "trl": trl, "threads": threads, "auto": auto}
    if suite == "all":
        arms: dict[str, Arm] = {}
        for name in ("headline", "ablations", "trl", "threads", "auto"):
            arms.update({a.name: a for a in suites[name]})
        return list(arms.values())
    return suites[suite]


# ---- running an arm -------------------------------------------------------------------------------------
@dataclass
class ArmResult:
    arm: Arm
    run_dir: Path
    summary: RunSummary | None = None
    error: str | None = None
    reused: bool = False
    seconds: float = 0.0  # wall time of the whole process (start-up and final save included)
    curve: list[tuple[float, float]] = field(default_factory=list)  # (elapsed_s, eval_accuracy)


def arm_command(arm: Arm, setup: Setup, train_path: Path, valid_path: Path, runs: Path) -> list[str]:
    if arm.runner == "trl":
        return [
            sys.executable,
            str(REPO / "bench" / "trl_grpo.py"),
            "--model",
            setup.model,
            "--train",
            str(train_path),
            "--valid",
            str(valid_path),
            "--out",
            str(runs / arm.name),
            "--steps",
            str(setup.steps),
            "--max-time-s",
            str(setup.max_time_s),
            "--batch-size",
            str(setup.batch_size),
            "--n-samples",
            str(setup.n_samples),
            "--max-new-tokens",
            str(setup.max_new_tokens),
            "--eval-every",
            str(setup.eval_every),
            "--valid-size",
            str(setup.valid_size),
            "--lr",
            str(setup.lr),
            "--seed",
            str(setup.seed),
            "--threads",
            str(arm.threads[0]),
        ]
    return [
        sys.executable,
        "-m",
        "asyncrl.cli",
        "train",
        *setup.overrides(train_path, valid_path),
        f"output_dir={runs.parent}",
        f"experiment_name={runs.name}",
        f"trial_name={arm.name}",
        *arm.all_overrides(),
    ]


def run_arm(arm: Arm, setup: Setup, train_path: Path, valid_path: Path, runs: Path, fresh: bool) -> ArmResult:
    run_dir = runs / arm.name
    command = arm_command(arm, setup, train_path, valid_path, runs)
    done = run_dir / ARM_DONE
    if not fresh and done.is_file():
        previous = json.loads(done.read_text())
        if previous.get("command", [])[2:] == command[2:]:  # same arguments (the interpreter path aside)
            result = collect(arm, run_dir, setup.target)
            result.reused, result.seconds = True, previous.get("seconds", 0.0)
            return result
    if run_dir.exists():
        for name in ("metrics.jsonl", "timeline.jsonl", ARM_DONE):  # a fresh run must not append to an old one
            (run_dir / name).unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "train.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    with log_path.open("w") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        try:
            proc = subprocess.run(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                timeout=setup.max_time_s + 600,
                check=False,
            )
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = -1
    seconds = time.perf_counter() - t0
    if rc != 0:
        return ArmResult(arm, run_dir, error=_failure(log_path, rc), seconds=seconds)
    result = collect(arm, run_dir, setup.target)
    result.seconds = seconds
    done.write_text(json.dumps({"seconds": seconds, "command": command}) + "\n")
    return result


def resolve_target(spec: str, initial: float | None) -> float:
    """``--target``: an absolute accuracy, or ``+GAIN`` over the step-0 accuracy ``initial``."""
    if not spec.startswith("+"):
        return float(spec)
    if initial is None:
        raise ReportError(f"--target {spec} is relative to the step-0 evaluation, which this run lacks")
    return initial + float(spec[1:])


def collect(arm: Arm, run_dir: Path, target: str) -> ArmResult:
    try:
        run = load_run(run_dir)
    except ReportError as e:
        return ArmResult(arm, run_dir, error=str(e))
    curve = [(0.0 if r["step"] == 0 else r.get("elapsed_s", 0.0), r["eval_accuracy"]) for r in run.evals]
    try:
        write_report(run_dir)
    except ReportError as e:  # plots are optional; the numbers are not
        print(f"  (no report for {arm.name}: {e})", file=sys.stderr)
    initial = run.evals[0]["eval_accuracy"] if run.evals and run.evals[0].get("step") == 0 else None
    try:
        value = resolve_target(target, initial)
    except ReportError as e:
        return ArmResult(arm, run_dir, error=str(e))
    return ArmResult(arm, run_dir, summarize(run, target=value, name=arm.label), curve=curve)


def _failure(log_path: Path, rc: int) -> str:
    lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    tail = (errors or lines)[-3:]
    what = "timed out" if rc == -1 else f"exit code {rc}"
    return f"{what}: " + " | ".join(ln.strip()[:300] for ln in tail)


# ---- the table, the JSON and the plots ---------------------------------------------------------------------
def speedup(base: RunSummary | None, s: RunSummary | None) -> float | None:
    if base is None or s is None or not base.time_to_target_s or not s.time_to_target_s:
        return None
    return base.time_to_target_s / s.time_to_target_s


def table(results: list[ArmResult], baseline: ArmResult | None) -> str:
    base = baseline.summary if baseline else None
    head = [
        "arm",
        "threads",
        "steps",
        "wall s",
        "time→target s",
        "speedup",
        "steps/s ×",
        "final acc",
        "Δacc vs sync",
        "gen tok/s",
        "train tok/s",
        "trained tok/wall s",
        "gen idle",
        "trainer idle",
        "staleness mean/max",
        "staleness hist",
    ]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        s = r.summary
        threads = (
            f"{r.arm.threads[0]} (alternating)"
            if r.arm.eta == 0 and r.arm.threads[0] == r.arm.threads[1]
            else "shared by need"
            if "cluster.cpu_split=auto" in r.arm.overrides
            else f"{r.arm.threads[0]}+{r.arm.threads[1]}"
        )
        if s is None:
            error = (r.error or "").replace("|", "/")
            rows.append(f"| {r.arm.label} | {threads} | not run: {error} |" + " |" * (len(head) - 3))
            continue
        rate = (s.steps / s.wall_s) if s.wall_s else 0.0
        base_rate = (base.steps / base.wall_s) if base and base.wall_s else 0.0
        hist = " ".join(f"{k}:{v}" for k, v in sorted(s.staleness_hist.items()))
        rows.append(
            "| "
            + " | ".join(
                [
                    r.arm.label + etas_used(r),
                    threads,
                    f"{s.steps}",
                    f"{s.wall_s:.0f}",
                    _opt(s.time_to_target_s, "{:.0f}", "not reached"),
                    _opt(speedup(base, s), "{:.2f}×"),
                    _opt(rate / base_rate if base_rate else None, "{:.2f}×"),
                    _opt(s.final_accuracy, "{:.3f}"),
                    _opt(
                        None
                        if base is None or s.final_accuracy is None or base.final_accuracy is None
                        else s.final_accuracy - base.final_accuracy,
                        "{:+.3f}",
                    ),
                    f"{s.gen_tokens_per_s:.0f}",
                    f"{s.train_tokens_per_s:.0f}",
                    f"{s.trained_tokens_per_wall_s:.0f}",
                    f"{s.generator_idle_frac:.0%}",
                    f"{s.trainer_idle_frac:.0%}",
                    f"{s.staleness_mean:.2f}/{s.staleness_max}",
                    f"{hist} ({s.staleness_unit})",
                ]
            )
            + " |"
        )
    return "\n".join(rows)


def etas_used(r: ArmResult) -> str:
    """For η=auto: the η of each step, run-length encoded (``: η 1×3, 2×40``)."""
    if r.arm.eta != "auto":
        return ""
    path = r.run_dir / "metrics.jsonl"
    etas = (
        [
            rec.get("max_staleness")
            for line in path.read_text().splitlines()
            if line.strip()
            for rec in [json.loads(line)]
            if rec.get("step", 0) > 0
        ]
        if path.is_file()
        else []
    )
    runs: list[list] = []
    for eta in etas:
        if runs and runs[-1][0] == eta:
            runs[-1][1] += 1
        else:
            runs.append([eta, 1])
    return (": η " + ", ".join(f"{eta}×{n}" for eta, n in runs)) if runs else ""


def _opt(x, fmt: str, none: str = "-") -> str:
    return none if x is None else fmt.format(x)


def plot_summary(results: list[ArmResult], setup: Setup, path: Path) -> None:
    plt = pyplot()
    ok = [r for r in results if r.summary is not None]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    acc, ttt, idle, stale = axes[0, 0], axes[0, 1], axes[1, 0], axes[1, 1]
    for r in ok:
        xs, ys = zip(*r.curve) if r.curve else ((), ())
        acc.plot(xs, ys, "o-", ms=3, lw=1.5, label=r.arm.label)
    target = next((r.summary.target for r in ok), None)
    if target is not None:
        acc.axhline(target, color="k", ls="--", lw=1, label=f"target {target:.3f}")
    acc.set_xlabel("training wall time (s)")
    acc.set_ylabel("held-out accuracy")
    acc.set_title("accuracy vs wall time", fontsize=10)
    acc.grid(alpha=0.3)
    acc.legend(fontsize=7)
    labels = [r.arm.label for r in ok]
    x = list(range(len(ok)))
    _plot_speed(ttt, ok, target or 0.0)
    w = 0.38
    idle.bar(
        [i - w / 2 for i in x], [r.summary.generator_idle_frac for r in ok], w, label="generator idle", color="#ff7f0e"
    )
    idle.bar(
        [i + w / 2 for i in x], [r.summary.trainer_idle_frac for r in ok], w, label="trainer idle", color="#7f7f7f"
    )
    idle.set_xticks(x, labels, rotation=25, ha="right", fontsize=8)
    idle.set_ylim(0, 1)
    idle.set_ylabel("fraction of wall time")
    idle.set_title("idle time", fontsize=10)
    idle.grid(alpha=0.3, axis="y")
    idle.legend(fontsize=8)
    width = 0.8 / max(1, len(ok))
    for i, r in enumerate(ok):
        hist = r.summary.staleness_hist
        total = sum(hist.values()) or 1
        stale.bar(
            [k - 0.4 + width * (i + 0.5) for k in hist], [v / total for v in hist.values()], width, label=r.arm.label
        )
    stale.set_xlabel("staleness (versions)")
    stale.set_ylabel("fraction (of tokens, or of steps by max)")
    stale.set_title("staleness histogram", fontsize=10)
    stale.grid(alpha=0.3, axis="y")
    stale.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_speed(ax, ok: list[ArmResult], target: float) -> None:
    """Time to target with the speedup over sync; if no arm reached the target, training steps per minute."""
    x = list(range(len(ok)))
    base = next((r.summary for r in ok if r.arm.name == "eta0-sync"), None)
    reached = any(r.summary.time_to_target_s is not None for r in ok)
    if reached:
        values = [r.summary.time_to_target_s or 0.0 for r in ok]
        notes = [
            "not reached"
            if r.summary.time_to_target_s is None
            else (f"{speedup(base, r.summary):.2f}×" if speedup(base, r.summary) else "")
            for r in ok
        ]
        ax.set_ylabel("seconds")
        ax.set_title(f"time to held-out accuracy {target:.2f} (speedup vs sync)", fontsize=10)
    else:
        values = [60 * r.summary.steps / r.summary.wall_s if r.summary.wall_s else 0.0 for r in ok]
        base_rate = 60 * base.steps / base.wall_s if base and base.wall_s else 0.0
        notes = [f"{v / base_rate:.2f}×" if base_rate else "" for v in values]
        ax.set_ylabel("training steps per minute")
        ax.set_title(f"no arm reached accuracy {target:.2f}: training steps per minute (× sync)", fontsize=10)
    bars = ax.bar(x, values, color=["#7f7f7f" if r.arm.eta == 0 else "#1f77b4" for r in ok])
    for bar, note in zip(bars, notes):
        ax.annotate(note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [r.arm.label for r in ok], rotation=25, ha="right", fontsize=8)
    ax.grid(alpha=0.3, axis="y")


def write_outputs(results: list[ArmResult], setup: Setup, out: Path, suite: str, command: str, seconds: float) -> str:
    baseline = next((r for r in results if r.arm.name == "eta0-sync" and r.summary), None)
    text = table(results, baseline)
    value = next((r.summary.target for r in results if r.summary), None)
    header = (
        f"target accuracy {setup.target}" + (f" (= {value:.3f})" if value is not None else "") + "; "
        f"{setup.steps} steps (cap {setup.max_time_s:.0f} s) per arm; "
        f"B={setup.batch_size} groups x {setup.n_samples} samples; max_new_tokens={setup.max_new_tokens}; "
        f"length mix (terms:weight) {setup.mix}; model {setup.model}; {setup.cores} cores"
    )
    (out / f"results-{suite}.md").write_text(f"`{command}` ({seconds / 60:.1f} min)\n\n{header}\n\n{text}\n")
    payload = {
        "command": command,
        "seconds": seconds,
        "setup": asdict(setup),
        "arms": [
            {
                "name": r.arm.name,
                "label": r.arm.label,
                "eta": r.arm.eta,
                "threads": list(r.arm.threads),
                "overrides": r.arm.all_overrides() if r.arm.runner == "asyncrl" else [],
                "runner": r.arm.runner,
                "run_dir": str(r.run_dir),
                "reused": r.reused,
                "process_s": r.seconds,
                "error": r.error,
                "summary": r.summary.to_dict() if r.summary else None,
                "speedup_time_to_target": speedup(baseline.summary if baseline else None, r.summary),
                "accuracy_curve": r.curve,
            }
            for r in results
        ],
    }
    (out / f"results-{suite}.json").write_text(json.dumps(payload, indent=2) + "\n")
    try:
        plot_summary(results, setup, out / f"summary-{suite}.png")
    except ReportError as e:
        print(f"(no summary-{suite}.png: {e})", file=sys.stderr)
    return header + "\n\n" + text


# ---- command line -------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="headline", choices=["headline", "ablations", "trl", "threads", "auto", "all"])
    p.add_argument("--arms", help="comma-separated subset of the suite's arm names (e.g. eta0-sync,eta4)")
    p.add_argument("--model", default="builtin:tiny-sft")
    p.add_argument(
        "--target",
        default="+0.15",
        help="held-out accuracy that counts as reached: absolute (0.4) or above step 0 (+0.15)",
    )
    p.add_argument("--steps", type=int, default=60, help="training steps per arm")
    p.add_argument("--max-time-s", type=float, default=240.0, help="wall-time cap per arm (training loop)")
    p.add_argument("--batch-size", type=int, default=16, help="prompt groups per step (B)")
    p.add_argument("--n-samples", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--max-slots", type=int, default=128, help="engine KV slots (sequences decoded at once)")
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--valid-size", type=int, default=200)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--mix", default=DEFAULT_MIX, help="number-of-terms mix MIN-MAX:WEIGHT,...")
    p.add_argument("--cores", type=int, default=2, help="CPU cores the arms share (sync gets all of them)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra asyncrl override for every asyncrl arm (repeatable), e.g. actor.dynamic_sampling=true",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--fresh", action="store_true", help="rerun arms even when a finished run matches")
    p.add_argument("--quick", action="store_true", help="plumbing check: 6 steps, small batches, 2 arms per suite")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.steps, args.max_time_s, args.batch_size, args.n_samples = 6, 120.0, 4, 4
        args.eval_every, args.valid_size, args.max_slots = 3, 32, 32
        args.out = args.out.with_name(args.out.name + "-quick")
    setup = Setup(
        args.model,
        args.target,
        args.steps,
        args.max_time_s,
        args.batch_size,
        args.n_samples,
        args.max_new_tokens,
        args.max_slots,
        args.eval_every,
        args.valid_size,
        args.lr,
        args.seed,
        args.mix,
        args.cores,
        tuple(args.set),
    )
    arms = suite_arms(args.suite, args.cores)
    if args.arms:
        wanted = args.arms.split(",")
        unknown = set(wanted) - {a.name for a in arms}
        if unknown:
            raise SystemExit(f"--arms: {sorted(unknown)} not in suite '{args.suite}' ({[a.name for a in arms]})")
        arms = [a for a in arms if a.name in wanted]
    elif args.quick:
        arms = [a for a in arms if a.name in ("eta0-sync", "eta4", "trl-grpo", "eta4-drain")]
    mix = LengthMix.parse(args.mix)
    train_path, valid_path = write_task_files(
        args.out / "data",
        mix,
        n_train=max(4000, 3 * setup.steps * setup.batch_size),
        n_valid=setup.valid_size,
        seed=setup.seed,
    )
    runs = args.out / "runs"
    command = "python bench/async_vs_sync.py " + " ".join(argv if argv is not None else sys.argv[1:])
    t0 = time.perf_counter()
    results = []
    for i, arm in enumerate(arms, 1):
        print(f"[{i}/{len(arms)}] {arm.label} ...", flush=True)
        result = run_arm(arm, setup, train_path, valid_path, runs, args.fresh)
        results.append(result)
        s = result.summary
        status = (
            f"error: {result.error}"
            if s is None
            else f"{s.steps} steps in {s.wall_s:.0f}s, final acc {_opt(s.final_accuracy, '{:.3f}')}, "
            f"time to {_opt(s.target, '{:.3f}')}: {_opt(s.time_to_target_s, '{:.0f}s', 'not reached')}"
            + (" (reused)" if result.reused else f" (process {result.seconds:.0f}s)")
        )
        print(f"    {status}", flush=True)
    suite = args.suite if not args.arms else f"{args.suite}-{args.arms.replace(',', '+')}"
    text = write_outputs(results, setup, args.out, suite, command.strip(), time.perf_counter() - t0)
    print("\n" + text)
    print(
        f"\nwrote {args.out}/results-{suite}.md, .json and summary-{suite}.png; per-arm reports in {runs}/*/report.html"
    )
    return 0 if any(r.summary for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
