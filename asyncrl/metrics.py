"""Metrics sinks: ``metrics.jsonl`` in the run directory and a one-line summary per step."""

from __future__ import annotations

import json
import math
from pathlib import Path

CONSOLE_KEYS = [
    ("step", "{:d}"), ("reward_mean", "reward {:.3f}"), ("eval_accuracy", "eval_acc {:.3f}"),
    ("staleness_max", "stale max {:d}"), ("staleness_mean", "mean {:.2f}"),
    ("gen_tokens_per_s", "gen {:.0f} tok/s"), ("train_tokens_per_s", "train {:.0f} tok/s"),
    ("step_time_s", "step {:.2f}s"),
]


class MetricsLogger:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "metrics.jsonl"
        self._file = self.path.open("a")

    def log(self, record: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def summary_line(record: dict) -> str:
    parts = []
    for key, fmt in CONSOLE_KEYS:
        if record.get(key) is not None:
            value = record[key]
            parts.append(fmt.format(int(value) if "{:d}" in fmt else value))
    return " | ".join(parts)


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
