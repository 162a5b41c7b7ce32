"""The telemetry sections: ``stats_logger`` (the metrics' sinks) and ``watchdog`` (run-health checks)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from asyncrl.configlib import ConfigError

REWARD_FAILURE_ACTIONS = ("stop", "warn")


@dataclass
class StatsLoggerConfig:
    tensorboard: bool = False
    """Also write TensorBoard event files to RUN_DIR/tensorboard (needs the `tensorboard` package)."""
    wandb: bool = False
    """Also log to Weights & Biases (needs the `wandb` package; set WANDB_MODE=offline without network)."""
    wandb_project: str = "asyncrl"
    """W&B project name; the run is named experiment_name/trial_name."""
    samples_per_step: int = 4
    """Prompts and completions of each step's batch written to RUN_DIR/samples.jsonl (the best and the worst of
    a group, with reward, versions and staleness) and shown in report.html; 0 = none."""

    def validate(self) -> None:
        for key, module in (("tensorboard", "tensorboard"), ("wandb", "wandb")):
            if getattr(self, key) and importlib.util.find_spec(module) is None:
                raise ConfigError(f"stats_logger.{key}=true needs the '{module}' package (pip install {module})")
        if self.samples_per_step < 0:
            raise ConfigError(f"stats_logger.samples_per_step must be >= 0, got {self.samples_per_step}")


@dataclass
class WatchdogConfig:
    no_signal_steps: int = 10
    """Warn once when every advantage has been 0 for this many steps in a row (no learning signal: e.g.
    every sample of every group got the same reward); 0 = never."""
    reward_failure_steps: int = 5
    """Act when every reward call failed (raised, returned a non-number or timed out) in this many steps
    in a row, or at the first step when no call of the run has succeeded yet; 0 = never."""
    reward_failure_action: str = "stop"
    """What reward_failure_steps does: stop (the run ends with the reason) | warn (a warning every step)."""
    max_nonfinite_steps: int = 3
    """Stop when this many steps in a row had a non-finite loss or gradient norm (each such step is skipped
    and counted in nonfinite_skipped); 0 = never stop."""
    verdict_steps: int = 10
    """Read the run's verdict (bottleneck and learning health, docs/report.md) every this many steps and warn
    once about a finding seen at two checks in a row; 0 = never (the verdict still ends the run's output)."""

    def validate(self) -> None:
        for key in ("no_signal_steps", "reward_failure_steps", "max_nonfinite_steps", "verdict_steps"):
            if getattr(self, key) < 0:
                raise ConfigError(f"watchdog.{key} must be >= 0, got {getattr(self, key)}")
        if self.reward_failure_action not in REWARD_FAILURE_ACTIONS:
            raise ConfigError(
                f"watchdog.reward_failure_action must be one of {list(REWARD_FAILURE_ACTIONS)}, "
                f"got '{self.reward_failure_action}'"
            )
