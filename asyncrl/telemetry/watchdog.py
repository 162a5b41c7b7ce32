"""Run health, checked on every step's record: a run that cannot learn says so, and a run that trains on
garbage stops with the reason instead of going on quietly.

- no learning signal: every advantage of every batch was 0 for N steps (e.g. every sample of a group got
  the same reward under a group baseline) — warned once, with what to do;
- reward failures: every reward call of a step failed for N steps, or every call of the run so far (a broken
  reward function: at once, with its first error) — the run stops (or warns every step);
- non-finite updates: N steps in a row whose loss or gradient was not finite (the trainer skipped them) — the
  run stops; the weights are still those of the last good step.
"""

from __future__ import annotations

import logging
import re
from typing import Callable

from asyncrl.telemetry.record import merge_evaluations
from asyncrl.telemetry.verdict import WINDOW, diagnose

log = logging.getLogger(__name__)


class TrainingHalted(RuntimeError):
    """The watchdog stopped the run; ``version`` is the last version trained."""

    def __init__(self, message: str, version: int):
        super().__init__(message)
        self.version = version


class LiveVerdict:
    """The verdict's rules (``asyncrl.telemetry.verdict``) over the last steps, every ``every`` steps; a finding
    seen at two checks in a row (a condition that persists) is warned about once, with its evidence and the
    change it suggests, and again only if it clears and comes back, or if the change it suggests becomes another
    (numbers aside). Evaluations older than the window are kept too (the held-out rule compares with the best)."""

    def __init__(self, settings: dict, every: int = 10):
        self.settings, self.every = settings, every
        self.records: list[dict] = []
        self.evals: list[dict] = []  # evaluations outside the window's records, by step
        self._seen: set[str] = set()  # findings at the previous check
        self._warned: set[tuple[str, str]] = set()  # (finding, its change with the numbers left out)

    def evaluated(self, record: dict) -> None:
        """An evaluation logged outside a step's record (the one before training, or one that ended beside
        training, ``evaluator.background``): read with its step's record, as a run directory's reader merges it."""
        self.evals = sorted(self.evals + [record], key=lambda r: r.get("step", 0))

    def check(self, record: dict) -> None:
        self.records = self.records + [dict(record)]  # a copy: an evaluation is merged into it
        if len(self.records) > WINDOW + 1:  # the rules read WINDOW steps after the oldest record they are given
            left = [r for r in self.records[: -WINDOW - 1] if "eval_accuracy" in r]
            self.evals = sorted(self.evals + left, key=lambda r: r.get("step", 0))
            self.records = self.records[-WINDOW - 1 :]
        if not self.every or record.get("step", 0) % self.every:
            return
        records = merge_evaluations(self.evals + self.records)
        found = {f.name: f for f in diagnose(records, self.settings).findings}
        self._warned = {key for key in self._warned if key[0] in found}  # a condition that cleared is re-armed
        for name in sorted(found.keys() & self._seen):
            key = (name, re.sub(r"\d+(?:\.\d+)?", "#", found[name].change))
            if key not in self._warned:
                self._warned.add(key)
                log.warning("%s (for %d steps now; warned once): %s", name, 2 * self.every, found[name].line())
        self._seen = set(found)


class Watchdog:
    def __init__(
        self,
        no_signal_steps: int = 10,
        reward_failure_steps: int = 5,
        stop_on_reward_failures: bool = True,
        max_nonfinite_steps: int = 3,
        live: LiveVerdict | None = None,
        first_reward_failure: Callable[[], str] | None = None,
    ):
        self.no_signal_steps, self.reward_failure_steps = no_signal_steps, reward_failure_steps
        self.stop_on_reward_failures, self.max_nonfinite_steps = stop_on_reward_failures, max_nonfinite_steps
        self.no_signal = self.reward_failing = self.nonfinite = 0  # steps in a row
        self._warned_no_signal = False
        self._calls = self._failures = 0  # cumulative reward counters at the previous step
        self.live = live
        self.first_reward_failure = first_reward_failure  # what the first failed reward call said

    def check(self, record: dict) -> None:
        """Look at one step's record; warn, or raise ``TrainingHalted``."""
        version = record["version"]
        self.no_signal = self.no_signal + 1 if record.get("adv_abs_mean", 1.0) == 0.0 else 0
        if self.no_signal_steps and self.no_signal >= self.no_signal_steps and not self._warned_no_signal:
            self._warned_no_signal = True
            log.warning(
                "no learning signal: for %d steps every advantage was 0 (every sample of a group got the "
                "same reward; batch reward mean %.3g), so nothing is learned. If the "
                "policy never succeeds, fine-tune it first (asyncrl sft) or use an easier task; check "
                "that the reward function can return different values; raise gconfig.temperature or "
                "gconfig.n_samples for more varied samples",
                self.no_signal,
                record.get("reward_mean", 0),
            )
        self._check_rewards(record, version)
        self.nonfinite = self.nonfinite + 1 if record.get("nonfinite_skipped", 0) else 0
        if self.max_nonfinite_steps and self.nonfinite >= self.max_nonfinite_steps:
            raise TrainingHalted(
                f"{self.nonfinite} steps in a row had a non-finite loss or gradient "
                "(watchdog.max_nonfinite_steps); each was stopped at that update, so no NaN reached "
                "the weights. Lower actor.lr, check the rewards and actor.behav_imp_weight_cap",
                version,
            )
        if self.live is not None:
            self.live.check(record)

    def evaluated(self, record: dict) -> None:
        """An evaluation logged on its own (before training, or beside it): the live verdict reads it too."""
        if self.live is not None:
            self.live.evaluated(record)

    def _check_rewards(self, record: dict, version: int) -> None:
        calls = record.get("reward_calls_done", record.get("reward_calls", 0))  # calls in flight are no success
        failures = record.get("reward_errors", 0) + record.get("reward_timeouts", 0)
        step_calls, step_failures = calls - self._calls, failures - self._failures
        self._calls, self._failures = calls, failures
        if calls <= 0:
            return
        if step_calls > 0:  # a step whose rollouts were all scored before the last record keeps the count
            self.reward_failing = self.reward_failing + 1 if step_failures >= step_calls else 0
        never_scored = failures >= calls  # not one call of the run has succeeded: a broken reward, not bad luck
        needed = 1 if never_scored else self.reward_failure_steps
        if not self.reward_failure_steps or self.reward_failing < needed:
            return
        first = self.first_reward_failure() if self.first_reward_failure else ""
        what = (
            f"every reward call of the run failed ({calls} calls)"
            if never_scored
            else (f"every reward call failed in the last {self.reward_failing} steps")
        )
        message = (
            f"{what} (reward_errors {record.get('reward_errors', 0)}, reward_timeouts "
            f"{record.get('reward_timeouts', 0)}): the run trains on reward.default alone. "
            + (f"The first failure: {first}. " if first else "The first failure is logged above. ")
            + "Check reward.fn and reward.timeout_s"
        )
        if self.stop_on_reward_failures:
            raise TrainingHalted(message + " (watchdog.reward_failure_action=warn keeps going)", version)
        log.warning(message)
