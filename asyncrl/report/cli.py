"""``asyncrl report RUN_DIR [--out FILE]``. Importable without matplotlib (only drawing needs it), so the
main command can list and parse it anywhere; every user error is one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asyncrl.report.fit_page import metrics_file, write_fit_report
from asyncrl.report.page import REPORT_FILE, write_report
from asyncrl.telemetry.record import ReportError

PROG = "asyncrl report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir",
        help="a run directory written by asyncrl train (holds metrics.jsonl), or the "
        "output directory of asyncrl sft or asyncrl rm",
    )
    parser.add_argument("--out", help=f"HTML file to write (default RUN_DIR/{REPORT_FILE})")


def run(args: argparse.Namespace) -> int:
    """Write the report and print its path (exit 0), or print why not in one line (exit 2)."""
    path = Path(args.run_dir)
    try:
        if not (path / "metrics.jsonl").is_file() and metrics_file(path) is not None:
            page = write_fit_report(path, args.out)
        else:
            page = write_report(path, args.out)
    except (ReportError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(page)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="Render a run directory as an HTML page.")
    add_arguments(parser)
    return run(parser.parse_args(argv))
