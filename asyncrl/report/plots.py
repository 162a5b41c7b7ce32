"""The report's figures as PNG bytes. matplotlib is imported only when a figure is drawn, so the rest of the
report (and ``asyncrl report --help``) works without it. Points whose value is missing, NaN or inf are left
out of every curve: a diverging run still gets its report."""

from __future__ import annotations

import io
import os
import tempfile
from dataclasses import dataclass
from typing import Callable

from asyncrl.cache import writable_dir
from asyncrl.report.summary import gen_rates, ratio, staleness_histogram
from asyncrl.telemetry.record import SPAN_KINDS, ReportError, Run, Span, finite

SPAN_COLORS = dict(zip(SPAN_KINDS, ("#d9d9d9", "#1f77b4", "#d62728", "#2ca02c", "#9467bd")))
GEN_COLOR = "#ff7f0e"
ZOOM_STEPS = 6  # training steps shown in the timeline's zoom panel
MISSING_MATPLOTLIB = "needs the 'report' extra (matplotlib): pip install 'asyncrl[report]'"


def pyplot():
    """matplotlib's pyplot on the Agg backend. Its font cache is kept in asyncrl's cache directory
    (``~/.cache/asyncrl/matplotlib``), made once instead of at every run (about 2 s); a temporary directory only
    where that cannot be written. A user's own ``MPLCONFIGDIR`` wins."""
    if "MPLCONFIGDIR" not in os.environ:
        os.environ["MPLCONFIGDIR"] = str(writable_dir("matplotlib") or tempfile.mkdtemp(prefix="asyncrl-mpl-"))
    try:
        import matplotlib
    except ImportError as e:
        raise ReportError(MISSING_MATPLOTLIB) from e
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


@dataclass(frozen=True)
class Figure:
    name: str  # file stem of the PNG
    title: str
    caption: str
    png: bytes


def plot_learning(run: Run, plt) -> bytes:
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    for ax, xkey, xlabel in ((axes[0], "step", "training step"), (axes[1], "elapsed_s", "wall time (s)")):
        sx, sy = series(run.steps, xkey, "reward_mean")
        ax.plot(sx, sy, color="#1f77b4", alpha=0.35, lw=1, label="batch reward")
        if len(sy) >= 5:
            ax.plot(sx, _rolling(sy, 5), color="#1f77b4", lw=2, label="batch reward (5-step mean)")
        ax.plot(*series(run.evals, xkey, "eval_accuracy"), "o-", color="#2ca02c", lw=2, ms=4, label="held-out accuracy")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("reward / accuracy")
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].legend(loc="best", fontsize=8)
    return to_png(fig, plt)


def plot_staleness(run: Run, plt) -> bytes:
    steps = run.steps
    max_staleness = run.setting("rollout.max_head_offpolicyness")
    fig, (ax, hx) = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw={"width_ratios": [2.2, 1]})
    ax.step(*series(steps, "step", "staleness_max"), where="mid", color="#d62728", label="max")
    ax.plot(*series(steps, "step", "staleness_mean"), color="#1f77b4", label="mean (tokens)")
    if any("max_staleness" in r for r in steps):  # η of each step (an auto η moves)
        ax.step(*series(steps, "step", "max_staleness"), where="mid", color="k", ls="--", lw=1, label="η")
        if any(r.get("staleness_bound", r.get("max_staleness")) != r.get("max_staleness") for r in steps):
            ax.step(
                *series(steps, "step", "staleness_bound"),
                where="mid",
                color="k",
                ls=":",
                lw=1,
                label="bound (η its groups were admitted under)",
            )
    elif isinstance(max_staleness, int):
        ax.axhline(max_staleness, color="k", ls="--", lw=1, label=f"η = {max_staleness}")
    ax.set_xlabel("training step")
    ax.set_ylabel("staleness (versions)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    hist, unit = staleness_histogram(steps)
    hx.bar(list(hist), list(hist.values()), color="#d62728" if unit == "steps" else "#1f77b4")
    hx.set_xlabel("staleness (versions)")
    hx.set_ylabel("trained tokens" if unit == "tokens" else "steps with this max staleness")
    hx.set_xticks(list(hist))
    ax.yaxis.get_major_locator().set_params(integer=True)
    hx.grid(alpha=0.3, axis="y")
    return to_png(fig, plt)


def plot_throughput(run: Run, plt) -> bytes:
    steps = run.steps
    tools = tool_waits(steps)  # agentic runs: how many episodes were waiting on tools, on average, per step
    rows = 3 if tools[0] else 2
    fig, axes = plt.subplots(
        rows, 1, figsize=(11, 4.6 + 1.6 * (rows - 2)), sharex=True, gridspec_kw={"height_ratios": [2, 1, 1][:rows]}
    )
    ax, bx = axes[0], axes[1]
    if tools[0]:
        axes[2].plot(*tools, color="#9467bd", label="episodes waiting on tools (mean over the step)")
        axes[2].set_ylabel("episodes")
        axes[2].set_xlabel("wall time (s)")
        axes[2].grid(alpha=0.3)
        axes[2].legend(loc="best", fontsize=8)
    ax.plot(*series(steps, "elapsed_s", "gen_tokens_per_s"), color=GEN_COLOR, label="generated tokens/s")
    ax.plot(
        *series(steps, "elapsed_s", "train_tokens_per_s"), color="#1f77b4", label="trained tokens/s (while training)"
    )
    ax.set_ylabel("tokens/s")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    bx.plot(*series(steps, "elapsed_s", "gen_busy_frac"), color=GEN_COLOR, label="generator busy")
    bx.plot(*series(steps, "elapsed_s", _waiting_frac), color="#7f7f7f", label="trainer waiting")
    bx.set_ylim(-0.02, 1.02)
    bx.set_ylabel("fraction of step")
    bx.set_xlabel("wall time (s)")
    bx.grid(alpha=0.3)
    bx.legend(loc="best", fontsize=8)
    if rows == 3:
        bx.set_xlabel("")  # the tools' panel below carries the axis
    return to_png(fig, plt)


def plot_timeline(run: Run, plt) -> bytes:
    windows = [(None, "whole run")]
    zoom = _zoom_window(run.spans)
    if zoom is not None:
        windows.append((zoom, f"zoom: {ZOOM_STEPS} steps"))
    height = 2.1 * len(windows) + 0.9  # inches: the panels, then the x label and the legend below them
    fig, axes = plt.subplots(len(windows), 1, figsize=(11, height), squeeze=False)
    t0, t1, busy, _ = gen_rates(run.gen)
    for ax, (window, title) in zip(axes[:, 0], windows):
        for kind, color in SPAN_COLORS.items():
            bars = [(s.t0, s.t1 - s.t0) for s in run.spans if s.kind == kind]
            if bars:
                ax.broken_barh(bars, (1.1, 0.8), facecolors=color, label=f"trainer: {kind}")
        if t0:
            ax.bar(
                t0,
                [b * 0.8 for b in busy],
                width=[b - a for a, b in zip(t0, t1)],
                bottom=0.1,
                align="edge",
                color=GEN_COLOR,
                linewidth=0,
                label="generator busy (bar height = fraction)",
            )
        ax.set_yticks([0.5, 1.5])
        ax.set_yticklabels(["generator", "trainer"])
        ax.set_ylim(0, 2)
        ax.set_title(title, fontsize=9, loc="left")
        if window is not None:
            ax.set_xlim(*window)
        ax.grid(alpha=0.3, axis="x")
    axes[-1, 0].set_xlabel("seconds since the run started")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=8, frameon=False)
    fig.subplots_adjust(bottom=0.95 / height, top=1 - 0.3 / height, hspace=0.5)
    return to_png(fig, plt, tight=False)


AUDIT_TERMS = (
    ("clip_frac", "proximal clip"),
    ("behav_weight_capped_frac", "behaviour weight cap/mask"),
    ("behav_clip_frac", "behaviour clip (dual anchor)"),
    ("prob_mask_frac", "probability mask (DPPO)"),
    ("m2_mask_frac", "M2 mask"),
    ("m2_clip_frac", "M2PO clip"),
    ("dual_clip_frac", "dual clip (c_clip)"),
)


def plot_corrections(run: Run, plt) -> bytes:
    steps = run.steps
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.4))
    for key, label in AUDIT_TERMS:
        if any(r.get(key) for r in steps):
            ax.plot(*series(steps, "step", key), lw=1.2, label=label)
    ax.set_xlabel("training step")
    ax.set_ylabel("fraction of tokens changed")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8)
    bx.plot(*series(steps, "step", "ess"), color="k", lw=1.2, label="ESS of behaviour weights")
    bx.set_ylim(0, 1.05)
    bx.set_xlabel("training step")
    bx.set_ylabel("ESS (normalised)")
    kx = bx.twinx()
    kx.plot(*series(steps, "step", "behav_kl_stale"), color="#d62728", lw=1, label="KL behaviour/trained, stale")
    kx.plot(*series(steps, "step", "behav_kl_fresh"), color="#ff7f0e", lw=1, label="KL, fresh tokens (mismatch)")
    kx.set_ylabel("KL (nats)")
    handles = bx.get_legend_handles_labels()[0] + kx.get_legend_handles_labels()[0]
    labels = bx.get_legend_handles_labels()[1] + kx.get_legend_handles_labels()[1]
    bx.legend(handles, labels, loc="best", fontsize=8)
    bx.grid(alpha=0.3)
    return to_png(fig, plt)


FIGURES = [
    (
        "learning",
        "Reward and held-out accuracy",
        plot_learning,
        (
            "Mean reward of each trained batch (its samples came from older policies when η > 0) and greedy "
            "accuracy on the held-out split, against training step (left) and training wall time (right)."
        ),
    ),
    (
        "staleness",
        "Staleness",
        plot_staleness,
        (
            "How many versions old the trained tokens were: per step (max and token mean), with the bound η, and "
            "the histogram over the run."
        ),
    ),
    (
        "throughput",
        "Throughput",
        plot_throughput,
        (
            "Generated tokens/s (the engine, over each step's wall time) and trained tokens/s (while the optimizer "
            "step ran); below, the fraction of each step the generator was busy and the trainer waited for data."
        ),
    ),
    (
        "corrections",
        "Off-policy corrections",
        plot_corrections,
        (
            "Left: the share of trained tokens each correction term changed, per step (a term that stays at 0 is "
            "inert). Right: the effective sample size of the behaviour weights, and the KL between the behaviour "
            "and the trained policy on stale tokens (drift + mismatch) and on the current version's (mismatch)."
        ),
    ),
    (
        "timeline",
        "Timeline",
        plot_timeline,
        (
            "Top row of each panel: what the trainer thread did (grey = waiting for a batch). Bottom row: how busy "
            "the generator was in each sampling interval. Overlap of blue and orange is asynchrony at work."
        ),
    ),
]


def render_figures(run: Run) -> list[Figure]:
    plt = pyplot()
    figures = []
    for name, title, plot, caption in FIGURES:
        if name == "timeline" and not run.spans:
            continue  # runs from before timeline.jsonl existed
        if name == "corrections" and not any("ess" in r for r in run.steps):
            continue  # runs from before the audit
        figures.append(Figure(name, title, caption, plot(run, plt)))
    return figures


def series(records: list[dict], xkey: str, y: str | Callable[[dict], float | None]):
    """(xs, ys) of the records whose x and y are both finite; ``y`` is a key or a function of the record.
    Step 0's ``elapsed_s`` is 0: the clock starts after its evaluation."""
    xs, ys = [], []
    for r in records:
        x = 0.0 if xkey == "elapsed_s" and r.get("step", 0) == 0 else finite(r.get(xkey))
        value = finite(y(r) if callable(y) else r.get(y))
        if x is not None and value is not None:
            xs.append(x)
            ys.append(value)
    return xs, ys


def tool_waits(records: list[dict]) -> tuple[list[float], list[float]]:
    """(wall time, mean number of episodes waiting on tools during the step): the step's share of the
    cumulative ``agent_tool_s`` over its ``step_time_s``. Empty for runs without agent metrics."""
    xs, ys, before = [], [], 0.0
    for r in records:
        total, x, step = finite(r.get("agent_tool_s")), finite(r.get("elapsed_s")), finite(r.get("step_time_s"))
        if total is None:
            continue
        if x is not None and step:
            xs.append(x)
            ys.append((total - before) / step)
        before = total
    return xs, ys


def _waiting_frac(record: dict) -> float | None:
    wait, step = finite(record.get("trainer_wait_s")), finite(record.get("step_time_s"))
    return None if wait is None or step is None else ratio(wait, step)


def _zoom_window(spans: list[Span]) -> tuple[float, float] | None:
    """A few steps from the middle of the run (past warm-up), or None for a short run."""
    train = [s for s in spans if s.kind == "train"]
    if len(train) < 2 * ZOOM_STEPS:
        return None
    first = train[len(train) // 2 - ZOOM_STEPS // 2]
    last = train[len(train) // 2 - ZOOM_STEPS // 2 + ZOOM_STEPS - 1]
    waits = [s for s in spans if s.kind == "wait" and s.step == first.step]
    start = waits[0].t0 if waits else first.t0
    return start, last.t1 + 0.02 * (last.t1 - start)


def _rolling(ys: list[float], k: int) -> list[float]:
    return [sum(ys[max(0, i - k + 1) : i + 1]) / (i + 1 - max(0, i - k + 1)) for i in range(len(ys))]


def to_png(fig, plt, tight: bool = True) -> bytes:
    buf = io.BytesIO()
    if tight:
        fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
