"""``asyncrl report RUN_DIR``: one self-contained HTML page (plus PNGs) that shows what a training run did.

Reads the run directory that ``asyncrl train`` writes (``metrics.jsonl``, ``timeline.jsonl``,
``config.yaml``) and writes ``RUN_DIR/report.html`` (every plot inlined as a base64 PNG, no network, no
external files) and the same plots as ``RUN_DIR/plots/*.png``:

- learning: batch reward and held-out accuracy, against training step and against wall time;
- staleness: max / mean staleness of each trained batch, η, and the staleness histogram;
- throughput: generation and training tokens/s, and the generator's busy fraction;
- timeline: when the trainer waited / trained / synced weights / evaluated / saved, and how busy the
  generator was at the same moments (the whole run, and a zoom on a few steps).

:func:`summarize` (a :class:`RunSummary`) is also what ``bench/async_vs_sync.py`` compares across runs.
Plotting needs matplotlib (``pip install 'asyncrl[report]'``); it runs on the Agg backend with its cache in a
temporary directory, so it never writes into the home directory.
"""

from __future__ import annotations

import argparse
import base64
import html
import itertools
import json
import math
import os
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPORT_FILE = "report.html"
PLOTS_DIR = "plots"
SPAN_COLORS = {"wait": "#d9d9d9", "train": "#1f77b4", "sync": "#d62728", "eval": "#2ca02c", "save": "#9467bd"}
GEN_COLOR = "#ff7f0e"
ZOOM_STEPS = 6  # training steps shown in the timeline's zoom panel


class ReportError(RuntimeError):
    """The run directory cannot be reported on, or the plotting dependency is missing."""


# ---- reading a run ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Span:
    """A trainer-thread interval from ``timeline.jsonl`` (seconds since the run started)."""

    kind: str
    t0: float
    t1: float
    step: int


@dataclass(frozen=True)
class GenSample:
    """The engine's cumulative counters at time ``t`` (seconds since the run started)."""

    t: float
    busy_s: float
    generated_tokens: int


@dataclass
class Run:
    path: Path
    records: list[dict]  # metrics.jsonl, one per step; step 0 is the evaluation before training
    spans: list[Span] = field(default_factory=list)
    gen: list[GenSample] = field(default_factory=list)
    config: dict = field(default_factory=dict)

    @property
    def steps(self) -> list[dict]:
        """The training-step records (step >= 1)."""
        return [r for r in self.records if r.get("step", 0) > 0]

    @property
    def evals(self) -> list[dict]:
        """Records with a held-out accuracy (step 0 included), in step order."""
        return [r for r in self.records if r.get("eval_accuracy") is not None]

    def setting(self, dotted: str, default=None):
        """A value of the resolved config, e.g. ``run.setting("rollout.max_head_offpolicyness")``."""
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node


def load_run(run_dir: str | Path) -> Run:
    """Read a run directory; only ``metrics.jsonl`` is required."""
    path = Path(run_dir)
    if not (path / "metrics.jsonl").is_file():
        raise ReportError(f"{path} is not a run directory: it has no metrics.jsonl "
                          "(asyncrl train writes outputs/<experiment_name>/<trial_name>/metrics.jsonl)")
    records = _read_jsonl(path / "metrics.jsonl")
    if not records:
        raise ReportError(f"{path / 'metrics.jsonl'} holds no records")
    run = Run(path, sorted(records, key=lambda r: r.get("step", 0)))
    if (path / "timeline.jsonl").is_file():
        for rec in _read_jsonl(path / "timeline.jsonl"):
            if rec.get("type") == "span":
                run.spans.append(Span(rec["kind"], rec["t0"], rec["t1"], rec.get("step", -1)))
            elif rec.get("type") == "gen":
                run.gen.append(GenSample(rec["t"], rec["busy_s"], rec["generated_tokens"]))
        run.gen.sort(key=lambda g: g.t)
    if (path / "config.yaml").is_file():
        import yaml

        run.config = yaml.safe_load((path / "config.yaml").read_text()) or {}
    return run


def _read_jsonl(path: Path) -> list[dict]:
    lines, out = path.read_text().splitlines(), []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            if n == len(lines):  # a run killed mid-write leaves a torn last line: skip it
                break
            raise ReportError(f"{path}:{n}: not JSON ({e})") from e
    return out


# ---- numbers ------------------------------------------------------------------------------------------
@dataclass
class RunSummary:
    """What one run achieved and where its time went (the columns of the benchmark table)."""

    name: str
    eta: int | None
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
    gen_busy = sum((r.get("gen_busy_frac") or 0.0) * (r.get("step_time_s") or 0.0) for r in steps)
    gen_tokens = sum((r.get("gen_tokens_per_s") or 0.0) * (r.get("step_time_s") or 0.0) for r in steps)
    wall = max((r.get("elapsed_s") or 0.0 for r in steps), default=0.0)
    step_time = sum(r.get("step_time_s") or 0.0 for r in steps)
    hit = time_to_target(run.records, target) if target is not None else None
    hist, unit = staleness_histogram(steps)
    rewards = [r["reward_mean"] for r in steps if r.get("reward_mean") is not None]
    return RunSummary(
        name=name or run.path.name,
        eta=run.setting("rollout.max_head_offpolicyness"),
        steps=len(steps),
        wall_s=wall,
        initial_accuracy=evals[0] if evals and run.evals[0].get("step") == 0 else None,
        final_accuracy=evals[-1] if evals else None,
        best_accuracy=max(evals) if evals else None,
        target=target,
        time_to_target_s=hit[0] if hit else None,
        steps_to_target=hit[1] if hit else None,
        gen_tokens_per_s=_ratio(gen_tokens, step_time),
        gen_tokens_per_busy_s=_ratio(gen_tokens, gen_busy),
        train_tokens_per_s=_ratio(sum(r.get("train_tokens") or 0 for r in steps),
                                  sum(r.get("train_time_s") or 0.0 for r in steps)),
        trained_tokens_per_wall_s=_ratio(sum(r.get("train_tokens") or 0 for r in steps), wall),
        generator_idle_frac=1.0 - _ratio(gen_busy, step_time),
        trainer_idle_frac=_ratio(sum(r.get("trainer_wait_s") or 0.0 for r in steps), wall),
        eval_frac=_ratio(sum(r.get("eval_time_s") or 0.0 for r in steps), wall),
        trainer_breakdown=trainer_breakdown(run.spans),
        step_time_s=_median([r.get("step_time_s") or 0.0 for r in steps]),
        staleness_max=max((r.get("staleness_max") or 0 for r in steps), default=0),
        staleness_mean=_ratio(sum((r.get("staleness_mean") or 0.0) * (r.get("train_tokens") or 1) for r in steps),
                              sum(r.get("train_tokens") or 1 for r in steps)),
        staleness_hist=hist,
        staleness_unit=unit,
        reward_first=_mean(rewards[:5]),
        reward_last=_mean(rewards[-5:]),
    )


def time_to_target(records: list[dict], target: float) -> tuple[float, int] | None:
    """(elapsed_s, step) of the first evaluation whose accuracy reaches ``target``; step 0 counts as 0 s."""
    for r in sorted(records, key=lambda r: r.get("step", 0)):
        acc = r.get("eval_accuracy")
        if acc is not None and acc >= target - 1e-9:
            return (r.get("elapsed_s") or 0.0) if r.get("step", 0) > 0 else 0.0, r.get("step", 0)
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
    return {kind: _ratio(totals[kind], window) for kind in SPAN_COLORS if kind in totals}


def staleness_histogram(steps: list[dict]) -> tuple[dict[int, int], str]:
    """Per-token staleness counts when the run logged ``staleness_hist`` (a list: index = staleness, value =
    trained tokens), else how many steps had each ``staleness_max``."""
    if steps and all(isinstance(r.get("staleness_hist"), list) for r in steps):
        total: Counter = Counter()
        for r in steps:
            for s, n in enumerate(r["staleness_hist"]):
                total[s] += n
        return dict(sorted(total.items())), "tokens"
    return dict(sorted(Counter(int(r.get("staleness_max") or 0) for r in steps).items())), "steps"


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    if not xs:
        return 0.0
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


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


# ---- plots --------------------------------------------------------------------------------------------
def pyplot():
    """matplotlib's pyplot on the Agg backend, with its cache in a temporary directory."""
    os.environ.setdefault("MPLCONFIGDIR", tempfile.mkdtemp(prefix="asyncrl-mpl-"))
    try:
        import matplotlib
    except ImportError as e:
        raise ReportError("the run report needs matplotlib: pip install 'asyncrl[report]' "
                          "(or pip install matplotlib)") from e
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
    steps, evals = run.steps, run.evals
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    for ax, xkey, xlabel in ((axes[0], "step", "training step"), (axes[1], "elapsed_s", "wall time (s)")):
        sx = [_x(r, xkey) for r in steps if r.get("reward_mean") is not None]
        sy = [r["reward_mean"] for r in steps if r.get("reward_mean") is not None]
        ax.plot(sx, sy, color="#1f77b4", alpha=0.35, lw=1, label="batch reward")
        if len(sy) >= 5:
            ax.plot(sx, _rolling(sy, 5), color="#1f77b4", lw=2, label="batch reward (5-step mean)")
        ax.plot([_x(r, xkey) for r in evals], [r["eval_accuracy"] for r in evals], "o-", color="#2ca02c",
                lw=2, ms=4, label="held-out accuracy")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("reward / accuracy")
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].legend(loc="best", fontsize=8)
    return _png(fig, plt)


def plot_staleness(run: Run, plt) -> bytes:
    steps = run.steps
    eta = run.setting("rollout.max_head_offpolicyness")
    fig, (ax, hx) = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw={"width_ratios": [2.2, 1]})
    x = [r["step"] for r in steps]
    ax.step(x, [r.get("staleness_max", 0) for r in steps], where="mid", color="#d62728", label="max")
    ax.plot(x, [r.get("staleness_mean", 0.0) for r in steps], color="#1f77b4", label="mean (tokens)")
    if eta is not None:
        ax.axhline(eta, color="k", ls="--", lw=1, label=f"η = {eta}")
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
    return _png(fig, plt)


def plot_throughput(run: Run, plt) -> bytes:
    steps = run.steps
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(11, 4.6), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    x = [r.get("elapsed_s", 0.0) for r in steps]
    ax.plot(x, [r.get("gen_tokens_per_s", 0.0) for r in steps], color=GEN_COLOR, label="generated tokens/s")
    ax.plot(x, [r.get("train_tokens_per_s", 0.0) for r in steps], color="#1f77b4",
            label="trained tokens/s (while training)")
    ax.set_ylabel("tokens/s")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    bx.plot(x, [r.get("gen_busy_frac", 0.0) for r in steps], color=GEN_COLOR, label="generator busy")
    bx.plot(x, [_ratio(r.get("trainer_wait_s") or 0.0, r.get("step_time_s") or 0.0) for r in steps],
            color="#7f7f7f", label="trainer waiting")
    bx.set_ylim(-0.02, 1.02)
    bx.set_ylabel("fraction of step")
    bx.set_xlabel("wall time (s)")
    bx.grid(alpha=0.3)
    bx.legend(loc="best", fontsize=8)
    return _png(fig, plt)


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
            ax.bar(t0, [b * 0.8 for b in busy], width=[b - a for a, b in zip(t0, t1)], bottom=0.1, align="edge",
                   color=GEN_COLOR, linewidth=0, label="generator busy (bar height = fraction)")
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
    return _png(fig, plt, tight=False)


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


def _x(record: dict, key: str) -> float:
    return 0.0 if key == "elapsed_s" and record.get("step", 0) == 0 else record.get(key, 0.0)


def _rolling(ys: list[float], k: int) -> list[float]:
    return [sum(ys[max(0, i - k + 1): i + 1]) / (i + 1 - max(0, i - k + 1)) for i in range(len(ys))]


def _png(fig, plt, tight: bool = True) -> bytes:
    import io

    buf = io.BytesIO()
    if tight:
        fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


FIGURES = [
    ("learning", "Reward and held-out accuracy", plot_learning,
     ("Mean reward of each trained batch (its samples came from older policies when η > 0) and greedy "
      "accuracy on the held-out split, against training step (left) and training wall time (right).")),
    ("staleness", "Staleness", plot_staleness,
     ("How many versions old the trained tokens were: per step (max and token mean), with the bound η, and "
      "the histogram over the run.")),
    ("throughput", "Throughput", plot_throughput,
     ("Generated tokens/s (the engine, over each step's wall time) and trained tokens/s (while the optimizer "
      "step ran); below, the fraction of each step the generator was busy and the trainer waited for data.")),
    ("timeline", "Timeline", plot_timeline,
     ("Top row of each panel: what the trainer thread did (grey = waiting for a batch). Bottom row: how busy "
      "the generator was in each sampling interval. Overlap of blue and orange is asynchrony at work.")),
]


def render_figures(run: Run) -> list[Figure]:
    plt = pyplot()
    figures = []
    for name, title, plot, caption in FIGURES:
        if name == "timeline" and not run.spans:
            continue  # runs from before timeline.jsonl existed
        figures.append(Figure(name, title, caption, plot(run, plt)))
    return figures


# ---- the page -----------------------------------------------------------------------------------------
# The script only checks the page's own images: it marks <body> with how many decoded and any script error,
# so a headless browser (tests/test_report.py) can tell a good page from a broken one.
CHECK_SCRIPT = """
window.addEventListener("error", function (e) { document.body.dataset.jsErrors = String(e.message); });
window.addEventListener("load", function () {
  var imgs = document.querySelectorAll("img.plot"), ok = 0;
  for (var i = 0; i < imgs.length; i++) { if (imgs[i].complete && imgs[i].naturalWidth > 0) ok++; }
  document.body.dataset.plotsLoaded = String(ok);
  document.body.dataset.plotsExpected = String(imgs.length);
});
"""

STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1160px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin: 28px 0 6px; }
.sub { color: #666; font-size: 13px; }
table.summary { border-collapse: collapse; font-size: 13px; margin-top: 10px; }
table.summary td { padding: 3px 14px 3px 0; border-bottom: 1px solid #eee; }
table.summary td:first-child { color: #555; }
img.plot { max-width: 100%; border: 1px solid #ddd; }
p.caption { color: #555; font-size: 13px; margin: 4px 0 0; }
pre { background: #f6f6f6; padding: 10px; font-size: 12px; overflow-x: auto; }
"""


def render_html(run: Run, summary: RunSummary, figures: list[Figure]) -> str:
    title = f"asyncrl run: {html.escape(str(run.path))}"
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{title}</title><style>{STYLE}</style><script>{CHECK_SCRIPT}</script></head><body>",
        f"<h1>{title}</h1>",
        f'<div class="sub">{html.escape(_headline(run))}</div>',
        "<h2>Summary</h2>", _summary_table(summary),
    ]
    for fig in figures:
        data = base64.b64encode(fig.png).decode("ascii")
        parts += [f'<h2 id="{fig.name}">{html.escape(fig.title)}</h2>',
                  (f'<img class="plot" id="plot-{fig.name}" alt="{html.escape(fig.title)}" '
                   f'src="data:image/png;base64,{data}">'),
                  f'<p class="caption">{html.escape(fig.caption)}</p>']
    config = (run.path / "config.yaml").read_text() if (run.path / "config.yaml").is_file() else "(no config.yaml)"
    parts += ["<h2>Configuration</h2>",
              f"<details><summary>config.yaml</summary><pre>{html.escape(config)}</pre></details>", "</body></html>"]
    return "\n".join(parts)


def _headline(run: Run) -> str:
    keys = [("model", "model.path"), ("η", "rollout.max_head_offpolicyness"),
            ("batch", "train_dataset.batch_size"), ("samples/prompt", "gconfig.n_samples"),
            ("loss", "actor.policy_loss"), ("interrupt", "rollout.interrupt_mode"),
            ("threads", "actor.threads")]
    return " · ".join(f"{label} {run.setting(key)}" for label, key in keys if run.setting(key) is not None)


def _summary_table(s: RunSummary) -> str:
    hist = ", ".join(f"{k}: {v}" for k, v in sorted(s.staleness_hist.items())) or "-"
    rows = [
        ("training steps", f"{s.steps}"),
        ("training wall time", f"{s.wall_s:.1f} s (median step {s.step_time_s:.2f} s)"),
        ("held-out accuracy (start → end, best)",
         f"{_fmt(s.initial_accuracy)} → {_fmt(s.final_accuracy)} (best {_fmt(s.best_accuracy)})"),
        ("batch reward (first 5 → last 5 steps)", f"{_fmt(s.reward_first)} → {_fmt(s.reward_last)}"),
        ("generation", (f"{s.gen_tokens_per_s:.0f} tokens/s ({s.gen_tokens_per_busy_s:.0f} while busy); "
                        f"generator idle {s.generator_idle_frac:.0%}")),
        ("trainer thread (timeline)", ", ".join(f"{k} {v:.0%}" for k, v in s.trainer_breakdown.items()) or "-"),
        ("training", (f"{s.train_tokens_per_s:.0f} tokens/s while training, {s.trained_tokens_per_wall_s:.0f} "
                      f"per wall second; trainer waiting {s.trainer_idle_frac:.0%}, evaluating {s.eval_frac:.0%}")),
        ("staleness", f"max {s.staleness_max}, mean {s.staleness_mean:.2f}; histogram ({s.staleness_unit}) {hist}"),
    ]
    body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="summary">{body}</table>'


def _fmt(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Render ``RUN_DIR/report.html`` (or ``out``) and ``plots/*.png`` beside it; returns the HTML path."""
    run = load_run(run_dir)
    figures = render_figures(run)
    page = Path(out) if out is not None else run.path / REPORT_FILE
    page.parent.mkdir(parents=True, exist_ok=True)
    plots = page.parent / PLOTS_DIR
    plots.mkdir(exist_ok=True)
    for fig in figures:
        (plots / f"{fig.name}.png").write_bytes(fig.png)
    page.write_text(render_html(run, summarize(run), figures), encoding="utf-8")
    return page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asyncrl report", description="Render a run directory as an HTML page.")
    parser.add_argument("run_dir", help="a run directory written by asyncrl train (holds metrics.jsonl)")
    parser.add_argument("--out", help=f"HTML file to write (default RUN_DIR/{REPORT_FILE})")
    args = parser.parse_args(argv)
    try:
        page = write_report(args.run_dir, args.out)
    except ReportError as e:
        print(f"asyncrl report: error: {e}", file=sys.stderr)
        return 2
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
