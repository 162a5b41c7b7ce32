"""The report of an ``asyncrl sft`` or ``asyncrl rm`` output directory (``sft_metrics.jsonl``, ``rm_metrics.jsonl``):
its training loss and held-out curves, a summary and the verdict, as one self-contained page (``asyncrl report
OUTPUT_DIR``)."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from asyncrl.report.plots import pyplot, series, to_png
from asyncrl.telemetry.record import ReportError, finite, read_jsonl
from asyncrl.telemetry.verdict import diagnose_sft

KINDS = {
    "sft_metrics.jsonl": ("asyncrl sft", "eval_accuracy", "held-out accuracy"),
    "rm_metrics.jsonl": ("asyncrl rm", "eval_pair_accuracy", "held-out pairwise accuracy"),
}
"""The metrics file of each kind of output: (the command, its held-out key, what that key is)."""


def metrics_file(path: Path) -> Path | None:
    """The SFT or RM metrics file of an output directory, if it is one."""
    return next((path / name for name in KINDS if (path / name).is_file()), None)


def write_fit_report(out_dir: str | Path, out: str | Path | None = None) -> Path:
    """Render ``OUTPUT_DIR/report.html`` (or ``out``) of an SFT or RM output; returns its path."""
    path = Path(out_dir)
    file = metrics_file(path)
    if file is None:
        raise ReportError(f"{path} is not an asyncrl sft or rm output (no {' or '.join(KINDS)})")
    command, held_key, held_name = KINDS[file.name]
    records = read_jsonl(file)
    if not records:
        raise ReportError(f"{file} holds no records")
    steps = [r for r in records if finite(r.get("loss")) is not None]
    evals = [r for r in records if finite(r.get(held_key)) is not None]
    plt = pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.6))
    ax[0].plot(*series(steps, "step", "loss"), color="#1f77b4", lw=1.5)
    ax[0].set(
        xlabel="step", ylabel="training loss", yscale="log" if steps and min(r["loss"] for r in steps) > 0 else "linear"
    )
    ax[1].plot(*series(evals, "step", held_key), "o-", color="#2ca02c", lw=2, ms=4)
    ax[1].set(xlabel="step", ylabel=held_name, ylim=(-0.02, 1.02))
    for a in ax:
        a.grid(alpha=0.3)
    png = to_png(fig, plt)
    plots = (Path(out).parent if out is not None else path) / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    (plots / "fit.png").write_bytes(png)
    best = max(evals, key=lambda r: r[held_key]) if evals else None
    rows = [
        ("steps", f"{steps[-1]['step'] if steps else 0}"),
        (
            "training loss (first → last)",
            f"{_f(steps[0]['loss'] if steps else None)} → {_f(steps[-1]['loss'] if steps else None)}",
        ),
        (
            f"{held_name} (start → end, best)",
            f"{_f(evals[0][held_key] if evals else None)} → {_f(evals[-1][held_key] if evals else None)}"
            + (f" (best {_f(best[held_key])} at step {best['step']})" if best else ""),
        ),
    ]
    verdict = diagnose_sft(records).lines() if command == "asyncrl sft" else []
    title = f"{command} output: {html.escape(str(path))}"
    page = Path(out) if out is not None else path / "report.html"
    page.write_text(
        "".join(
            [
                f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title></head><body>',
                f"<h1>{title}</h1><h2>Summary</h2><table>",
                *(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows),
                "</table>",
                "<h2>Verdict</h2><ul>",
                *(f"<li>{html.escape(line)}</li>" for line in verdict or ["no finding"]),
                "</ul>",
                f'<h2>Training loss and {held_name}</h2><img id="plot-fit" alt="loss and {held_name}" '
                f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">',
                "</body></html>",
            ]
        ),
        encoding="utf-8",
    )
    return page


def _f(x) -> str:
    return "-" if finite(x) is None else f"{x:.4g}"
