"""The HTML page: a summary table and every figure inlined as a base64 PNG (no network, no external files),
and :func:`write_report`, which writes the page and the same figures as ``plots/*.png`` beside it."""

from __future__ import annotations

import base64
import html
import os
from pathlib import Path

from asyncrl.report.diagnose import run_settings
from asyncrl.report.plots import Figure, render_figures
from asyncrl.report.summary import RunSummary, summarize
from asyncrl.telemetry.record import Run, finite, load_run
from asyncrl.telemetry.verdict import diagnose

REPORT_FILE = "report.html"
PLOTS_DIR = "plots"

# The script only checks the page's own images: it marks <body> with how many decoded and any script error,
# so a headless browser (tests/report/test_page.py) can tell a good page from a broken one.
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
ul.verdict { font-size: 14px; } ul.verdict li:nth-child(2) { font-weight: 600; }
pre { background: #f6f6f6; padding: 10px; font-size: 12px; overflow-x: auto; }
"""


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Render ``RUN_DIR/report.html`` (or ``out``) and ``plots/*.png`` beside it; returns the HTML path."""
    run = load_run(run_dir)
    figures = render_figures(run)
    page = Path(out) if out is not None else run.path / REPORT_FILE
    page.parent.mkdir(parents=True, exist_ok=True)
    plots = page.parent / PLOTS_DIR
    if plots.is_symlink():  # a link there is replaced by a directory of the report's own, never written through
        plots.unlink()
    plots.mkdir(exist_ok=True)
    for fig in figures:
        write_aside(plots / f"{fig.name}.png", fig.png)
    write_aside(page, render_html(run, summarize(run), figures).encode("utf-8"))
    return page


def write_aside(path: Path, data: bytes) -> None:
    """``data`` into a new file beside ``path``, then renamed over it: a symlink at ``path`` is replaced, never
    written through (a run directory's ``report.html`` linking to a file elsewhere is not that file's to change)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def render_html(run: Run, summary: RunSummary, figures: list[Figure]) -> str:
    title = f"asyncrl run: {html.escape(str(run.path))}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{title}</title><style>{STYLE}</style><script>{CHECK_SCRIPT}</script></head><body>",
        f"<h1>{title}</h1>",
        f'<div class="sub">{html.escape(_headline(run))}</div>',
        "<h2>Verdict</h2>",
        _verdict(run),
        "<h2>Summary</h2>",
        _summary_table(summary),
    ]
    for fig in figures:
        data = base64.b64encode(fig.png).decode("ascii")
        parts += [
            f'<h2 id="{fig.name}">{html.escape(fig.title)}</h2>',
            (
                f'<img class="plot" id="plot-{fig.name}" alt="{html.escape(fig.title)}" '
                f'src="data:image/png;base64,{data}">'
            ),
            f'<p class="caption">{html.escape(fig.caption)}</p>',
        ]
    if run.samples:
        parts += ["<h2>Sample generations</h2>", _samples(run.samples)]
    config = (run.path / "config.yaml").read_text() if (run.path / "config.yaml").is_file() else "(no config.yaml)"
    parts += [
        "<h2>Configuration</h2>",
        f"<details><summary>config.yaml</summary><pre>{html.escape(config)}</pre></details>",
        "</body></html>",
    ]
    return "\n".join(parts)


SAMPLE_STEPS = 3
"""Steps whose samples the report shows: the first, the middle and the last logged."""


def _samples(samples: list[dict]) -> str:
    """A table of the samples of a few steps (samples.jsonl has them all): step, reward, staleness and versions,
    the prompt and the completion."""
    steps = sorted({r.get("step", 0) for r in samples})
    shown = sorted({steps[0], steps[len(steps) // 2], steps[-1]})[:SAMPLE_STEPS]
    rows = [
        "<table><tr><th>step</th><th>reward</th><th>stale</th><th>versions</th><th>prompt</th><th>completion</th></tr>"
    ]
    for r in (r for r in samples if r.get("step") in shown):
        versions = f"{r.get('version_min')}-{r.get('version_max')}"
        cells = [
            r.get("step"),
            _fmt(r.get("reward")),
            r.get("staleness"),
            versions,
            r.get("prompt", "")[-300:],
            f"{r.get('completion', '')} [{r.get('finish_reason', '')}]",
        ]
        rows.append("<tr>" + "".join(f"<td><pre>{html.escape(str(c))}</pre></td>" for c in cells) + "</tr>")
    return "".join(rows) + "</table>"


def _verdict(run: Run) -> str:
    """Where the time went, the bottleneck and the other findings (docs/report.md explains each rule)."""
    lines = diagnose(run.records, run_settings(run)).lines()
    return '<ul class="verdict">' + "".join(f"<li>{html.escape(line)}</li>" for line in lines) + "</ul>"


def _headline(run: Run) -> str:
    keys = [
        ("model", "model.path"),
        ("η", "rollout.max_head_offpolicyness"),
        ("batch", "train_dataset.batch_size"),
        ("samples/prompt", "gconfig.n_samples"),
        ("loss", "actor.policy_loss"),
        ("interrupt", "rollout.interrupt_mode"),
        ("threads", "actor.threads"),
    ]
    return " · ".join(f"{label} {run.setting(key)}" for label, key in keys if run.setting(key) is not None)


def _summary_table(s: RunSummary) -> str:
    hist = ", ".join(f"{k}: {v}" for k, v in sorted(s.staleness_hist.items())) or "-"
    rows = [
        ("training steps", f"{s.steps}"),
        ("training wall time", f"{s.wall_s:.1f} s (median step {s.step_time_s:.2f} s)"),
        (
            "held-out accuracy (start → end, best)",
            f"{_fmt(s.initial_accuracy)} → {_fmt(s.final_accuracy)} (best {_fmt(s.best_accuracy)})",
        ),
        ("batch reward (first 5 → last 5 steps)", f"{_fmt(s.reward_first)} → {_fmt(s.reward_last)}"),
        (
            "generation",
            (
                f"{s.gen_tokens_per_s:.0f} tokens/s ({s.gen_tokens_per_busy_s:.0f} while busy); "
                f"generator idle {s.generator_idle_frac:.0%}"
            ),
        ),
        ("trainer thread (timeline)", ", ".join(f"{k} {v:.0%}" for k, v in s.trainer_breakdown.items()) or "-"),
        (
            "training",
            (
                f"{s.train_tokens_per_s:.0f} tokens/s while training, {s.trained_tokens_per_wall_s:.0f} "
                f"per wall second; trainer waiting {s.trainer_idle_frac:.0%}, evaluating {s.eval_frac:.0%}"
            ),
        ),
        ("staleness", f"max {s.staleness_max}, mean {s.staleness_mean:.2f}; histogram ({s.staleness_unit}) {hist}"),
    ]
    body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="summary">{body}</table>'


def _fmt(x: float | None) -> str:
    return "-" if finite(x) is None else f"{x:.3f}"
