"""The numbers of a run: what it achieved and where its time went (:class:`RunSummary`, also the columns of
``bench/async_vs_sync.py``'s table). A value a record lacks, or logged as NaN / inf, counts as absent: it
never turns a whole sum into NaN."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import asdict, dataclass

from asyncrl.telemetry.record import SPAN_KINDS, GenSample, Run, Span, finite, num


@dataclass
class RunSummary:
    """What one run achieved and where its time went (the columns of the benchmark table)."""

    name: str
    max_staleness: int | str | None  # "auto": tuned online (each step's η is in its record)
    steps: int
    wall_s: float  # training wall time: from the end of the step-0 evaluation to the last step
    initial_accuracy: float | None
    final_accuracy: float | None
    best_accuracy: float | None
    target: float | None
    time_to_target_s: float | None  # elapsed_s of the first evaluation at or above target
    steps_to_target: int | None
    gen_tokens_per_s: float  # generated tokens over the training wall time
    train_tokens_per_s: float  # trained tokens over the time spent in the optimizer step
    trained_tokens_per_wall_s: float  # trained tokens over the training wall time
    gen_tokens_per_busy_s: float  # generated tokens over the time the engine was busy (its speed when working)
    generator_idle_frac: float
    trainer_idle_frac: float  # time the trainer waited for a batch, over the training wall time
    eval_frac: float  # time the trainer spent on held-out evaluation, over the training wall time
    trainer_breakdown: dict[str, float]  # timeline span kind -> fraction of the training window (after step 0)
    step_time_s: float  # median wall time of a training step
    staleness_max: int
    staleness_mean: float
    staleness_hist: dict[int, int]  # staleness -> count
    staleness_unit: str  # "tokens" (per-token histogram logged) or "steps" (histogram of staleness_max)
    reward_first: float | None  # mean batch reward over the first and the last 5 steps
    reward_last: float | None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["staleness_hist"] = {str(k): v for k, v in sorted(self.staleness_hist.items())}
        return d


def summarize(run: Run, target: float | None = None, name: str | None = None) -> RunSummary:
    steps = run.steps
    evals = [r["eval_accuracy"] for r in run.evals]
    gen_busy = sum(num(r, "gen_busy_frac") * num(r, "step_time_s") for r in steps)
    gen_tokens = sum(num(r, "gen_tokens_per_s") * num(r, "step_time_s") for r in steps)
    wall = max((num(r, "elapsed_s") for r in steps), default=0.0)
    step_time = sum(num(r, "step_time_s") for r in steps)
    train_tokens = sum(num(r, "train_tokens") for r in steps)
    hit = time_to_target(run.records, target) if target is not None else None
    hist, unit = staleness_histogram(steps)
    rewards = [r["reward_mean"] for r in steps if finite(r.get("reward_mean")) is not None]
    eval_key = _eval_key(steps)
    return RunSummary(
        name=name or run.path.name,
        max_staleness=run.setting("rollout.max_head_offpolicyness"),
        steps=len(steps),
        wall_s=wall,
        initial_accuracy=evals[0] if evals and run.evals[0].get("step") == 0 else None,
        final_accuracy=evals[-1] if evals else None,
        best_accuracy=max(evals) if evals else None,
        target=target,
        time_to_target_s=hit[0] if hit else None,
        steps_to_target=hit[1] if hit else None,
        gen_tokens_per_s=ratio(gen_tokens, step_time),
        gen_tokens_per_busy_s=ratio(gen_tokens, gen_busy),
        train_tokens_per_s=ratio(train_tokens, sum(num(r, "train_time_s") for r in steps)),
        trained_tokens_per_wall_s=ratio(train_tokens, wall),
        generator_idle_frac=1.0 - ratio(gen_busy, step_time),
        trainer_idle_frac=ratio(sum(num(r, "trainer_wait_s") for r in steps), wall),
        eval_frac=ratio(sum(num(r, eval_key) for r in steps), wall),
        trainer_breakdown=trainer_breakdown(run.spans),
        step_time_s=_median([num(r, "step_time_s") for r in steps]),
        staleness_max=int(max((num(r, "staleness_max") for r in steps), default=0)),
        staleness_mean=ratio(
            sum(num(r, "staleness_mean") * (num(r, "train_tokens") or 1) for r in steps),
            sum(num(r, "train_tokens") or 1 for r in steps),
        ),
        staleness_hist=hist,
        staleness_unit=unit,
        reward_first=_mean(rewards[:5]),
        reward_last=_mean(rewards[-5:]),
    )


def _eval_key(steps: list[dict]) -> str:
    """The trainer's own evaluation time (the accounting's, within each step); runs from before it: the
    evaluations' durations, which also count those that ran beside training (evaluator.background)."""
    return "trainer_eval_s" if any("trainer_eval_s" in r for r in steps) else "eval_time_s"


def time_to_target(records: list[dict], target: float) -> tuple[float, int] | None:
    """(elapsed_s, step) of the first evaluation whose accuracy reaches ``target``; step 0 counts as 0 s."""
    for r in sorted(records, key=lambda r: r.get("step", 0)):
        acc = finite(r.get("eval_accuracy"))
        if acc is not None and acc >= target - 1e-9:
            return num(r, "elapsed_s") if r.get("step", 0) > 0 else 0.0, r.get("step", 0)
    return None


def trainer_breakdown(spans: list[Span]) -> dict[str, float]:
    """Fraction of the training window (end of the step-0 evaluation to the last span) per span kind."""
    start = max((s.t1 for s in spans if s.kind == "eval" and s.step == 0), default=None)
    if start is None:
        start = min((s.t0 for s in spans), default=0.0)
    inside = [s for s in spans if s.t0 >= start - 1e-6]
    window = max((s.t1 for s in inside), default=start) - start
    totals: Counter = Counter()
    for s in inside:
        totals[s.kind] += s.t1 - s.t0
    return {kind: ratio(totals[kind], window) for kind in SPAN_KINDS if kind in totals}


def staleness_histogram(steps: list[dict]) -> tuple[dict[int, int], str]:
    """Per-token staleness counts when the run logged ``staleness_hist`` (a list: index = staleness, value =
    trained tokens), else how many steps had each ``staleness_max``."""
    if steps and all(isinstance(r.get("staleness_hist"), list) for r in steps):
        total: Counter = Counter()
        for r in steps:
            for s, n in enumerate(r["staleness_hist"]):
                total[s] += n
        return dict(sorted(total.items())), "tokens"
    return dict(sorted(Counter(int(num(r, "staleness_max")) for r in steps).items())), "steps"


def gen_rates(samples: list[GenSample]) -> tuple[list[float], list[float], list[float], list[float]]:
    """Per sampling interval of the generator: (start, end, busy fraction, tokens/s)."""
    t0, t1, busy, rate = [], [], [], []
    for a, b in itertools.pairwise(samples):
        dt = b.t - a.t
        if dt <= 0:
            continue
        t0.append(a.t)
        t1.append(b.t)
        busy.append(min(1.0, max(0.0, (b.busy_s - a.busy_s) / dt)))
        rate.append((b.generated_tokens - a.generated_tokens) / dt)
    return t0, t1, busy, rate


def ratio(a: float, b: float) -> float:
    """``a / b``, or 0 when there is nothing to divide by (a run without that phase)."""
    return a / b if b > 0 else 0.0


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    if not xs:
        return 0.0
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
