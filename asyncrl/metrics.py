"""Metrics sinks: ``metrics.jsonl`` in the run directory (always), TensorBoard and Weights & Biases (by
config), and a one-line summary per step for the terminal."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

CONSOLE_KEYS = [
    ("step", "{:d}"), ("reward_mean", "reward {:.3f}"), ("eval_accuracy", "eval_acc {:.3f}"),
    ("staleness_max", "stale max {:d}"), ("staleness_mean", "mean {:.2f}"),
    ("gen_tokens_per_s", "gen {:.0f} tok/s"), ("train_tokens_per_s", "train {:.0f} tok/s"),
    ("step_time_s", "step {:.2f}s"),
]


@dataclass
class StatsLoggerConfig:
    tensorboard: bool = False
    """Also write TensorBoard event files to RUN_DIR/tensorboard (needs the `tensorboard` package)."""
    wandb: bool = False
    """Also log to Weights & Biases (needs the `wandb` package; set WANDB_MODE=offline without network)."""
    wandb_project: str = "asyncrl"
    """W&B project name; the run is named experiment_name/trial_name."""

    def validate(self) -> None:
        import importlib.util

        from asyncrl.configlib import ConfigError

        for key, module in (("tensorboard", "tensorboard"), ("wandb", "wandb")):
            if getattr(self, key) and importlib.util.find_spec(module) is None:
                raise ConfigError(f"stats_logger.{key}=true needs the '{module}' package (pip install {module})")


class MetricsLogger:
    """Writes each step's record to every configured sink."""

    def __init__(self, run_dir: Path, cfg: StatsLoggerConfig | None = None, run_name: str = "", config: dict | None = None):
        cfg = cfg or StatsLoggerConfig()
        self.path = Path(run_dir) / "metrics.jsonl"
        self._file = self.path.open("a")
        self._tb = self._wandb = None
        if cfg.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise RuntimeError("stats_logger.tensorboard=true needs `pip install tensorboard`") from e
            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
        if cfg.wandb:
            try:
                import wandb
            except ImportError as e:
                raise RuntimeError("stats_logger.wandb=true needs `pip install wandb`") from e
            self._wandb = wandb.init(project=cfg.wandb_project, name=run_name or None, dir=str(run_dir),
                                     config=config or {})

    def log(self, record: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        scalars = {k: v for k, v in clean.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        step = int(record.get("step", 0))
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


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
