"""``asyncrl report RUN_DIR``: one self-contained HTML page (plus PNGs) that shows what a training run did.

Reads the run directory that ``asyncrl train`` writes (``metrics.jsonl``, ``timeline.jsonl``,
``config.yaml``) and writes ``RUN_DIR/report.html`` (every plot inlined as a base64 PNG, no network, no
external files) and the same plots as ``RUN_DIR/plots/*.png``:

- learning: batch reward and held-out accuracy, against training step and against wall time;
- staleness: max / mean staleness of each trained batch, η, and the staleness histogram;
- throughput: generation and training tokens/s, and the generator's busy fraction;
- timeline: when the trainer waited / trained / synced weights / evaluated / saved, and how busy the
  generator was at the same moments (the whole run, and a zoom on a few steps).

Modules: :mod:`.reader` reads a run directory, :mod:`.summary` computes its numbers (:func:`summarize`, a
:class:`RunSummary`, is also what ``bench/async_vs_sync.py`` compares across runs), :mod:`.plots` draws the
figures, :mod:`.page` writes the HTML, :mod:`.cli` is the command (``add_arguments`` and ``run``, for the
main CLI). Plotting needs matplotlib (``pip install 'asyncrl[report]'``); it runs on the Agg backend with its
cache in a temporary directory, so it never writes into the home directory. Nothing here imports matplotlib
until a figure is drawn.
"""

from asyncrl.report.cli import main
from asyncrl.report.page import PLOTS_DIR, REPORT_FILE, render_html, write_report
from asyncrl.report.plots import Figure, pyplot, render_figures
from asyncrl.report.summary import (
    RunSummary,
    gen_rates,
    staleness_histogram,
    summarize,
    time_to_target,
    trainer_breakdown,
)
from asyncrl.telemetry.record import GenSample, ReportError, Run, Span, load_run

__all__ = [
    "PLOTS_DIR",
    "REPORT_FILE",
    "Figure",
    "GenSample",
    "ReportError",
    "Run",
    "RunSummary",
    "Span",
    "gen_rates",
    "load_run",
    "main",
    "pyplot",
    "render_figures",
    "render_html",
    "staleness_histogram",
    "summarize",
    "time_to_target",
    "trainer_breakdown",
    "write_report",
]
