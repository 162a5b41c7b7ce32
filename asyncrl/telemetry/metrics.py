"""Metrics: the per-step record (``StepMeter``), its sinks (``metrics.jsonl`` always, TensorBoard and
Weights & Biases by config) and the terminal (a progress bar or one log line per step).

Non-finite numbers are written to ``metrics.jsonl`` as the strings ``"nan"``, ``"inf"`` and ``"-inf"``
(standard JSON, and never mistaken for a missing value); :func:`read_metrics` turns them back into floats.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Callable, Protocol

import torch

from asyncrl.telemetry.account import SIDES, key
from asyncrl.telemetry.record import read_records
from asyncrl.types import Batch

log = logging.getLogger(__name__)

CONSOLE_KEYS = [
    ("step", "{:d}"),
    ("reward_mean", "reward {:.3f}"),
    ("eval_accuracy", "eval_acc {:.3f}"),
    ("staleness_max", "stale max {:d}"),
    ("staleness_mean", "mean {:.2f}"),
    ("gen_tokens_per_s", "gen {:.0f} tok/s"),
    ("train_tokens_per_s", "train {:.0f} tok/s"),
    ("step_time_s", "step {:.2f}s"),
    ("truncated_frac", "cut {:.0%}"),
]
CONSOLE_LEGEND = (
    "each step prints: step | reward = mean reward of the batch | eval_acc = held-out accuracy (when "
    "evaluated) | stale max, mean = versions between the weights that generated the trained tokens and "
    "the weights trained | gen, train tok/s = tokens generated, trained per second | step = wall time "
    "of the step | cut = samples stopped by gconfig.max_new_tokens or the context limit, when any "
    "(metrics.jsonl has every key)"
)


# ---- the per-step record ---------------------------------------------------------------------------------
def batch_stats(batch: Batch, version: int) -> dict:
    """What a batch trained at ``version`` holds: rewards, staleness of its tokens, lengths, groups."""
    mask = batch.loss_mask.bool()
    staleness = (version - batch.versions[mask]).float()
    spans = [len(set(row[m].tolist())) for row, m in zip(batch.versions, mask)]
    groups = [batch.rewards[batch.group_ids == g] for g in batch.group_ids.unique()]
    return {
        "reward_mean": float(batch.rewards.mean()),
        "reward_std": float(batch.rewards.std()) if len(batch.rewards) > 1 else 0.0,
        "staleness_max": int(staleness.max()) if staleness.numel() else 0,
        "staleness_mean": float(staleness.mean()) if staleness.numel() else 0.0,
        "staleness_hist": torch.bincount(staleness.long()).tolist() if staleness.numel() else [],
        "versions_per_sample_max": max(spans),
        "response_len_mean": float(mask.sum(-1).float().mean()),
        "response_len_max": int(mask.sum(-1).max()),
        "truncated_frac": float(batch.truncated.float().mean()),
        "n_samples": int(batch.input_ids.shape[0]),
        "groups_no_signal_frac": sum(float(r.max() - r.min()) <= 1e-6 for r in groups) / len(groups),
    }


class Sources(Protocol):
    """A training mixture's sources (``asyncrl.data.mixture.MixtureSchedule``): their ``names``, and the one a training
    item id was drawn from (None: not a training item)."""

    names: list[str]

    def __call__(self, item_id) -> str | None: ...


def source_stats(groups: list, sources: Sources) -> dict:
    """Per source of a training mixture: ``samples/NAME`` (0 for a source absent from this batch) and
    ``reward_mean/NAME`` (only when it has samples), each group counted for the source of its ``item_id``."""
    rewards: dict[str, list[float]] = {name: [] for name in sources.names}
    for g in groups:
        name = sources(g.item_id)
        if name is not None:
            rewards.setdefault(name, []).extend(t.reward for t in g.trajectories)
    out = {f"samples/{name}": len(r) for name, r in rewards.items()}
    out.update({f"reward_mean/{name}": sum(r) / len(r) for name, r in rewards.items() if r})
    return out


class StepMeter:
    """Builds each step's record: the batch's statistics, the trainer's, rates and the time account of the
    step's window (from the previous record to this one; ``asyncrl.telemetry.account`` names the phases) read from
    ``account`` (the timeline's running totals), and the counters of the other parts (callables returning dicts,
    read once per step; their accounting seconds, cumulative there, become the window's). With ``sources`` (a
    training mixture's), the record has the batch's ``samples/NAME`` and ``reward_mean/NAME`` too
    (:func:`source_stats`)."""

    def __init__(
        self,
        account: Callable[[], dict],
        counters: list[Callable[[], dict]],
        sources: Sources | None = None,
        decode: Callable[[list[int]], str] | None = None,
        samples_per_step: int = 4,
    ):
        """``decode`` (token ids -> text) turns on the record's ``samples``: ``samples_per_step`` of the batch's
        prompts and completions (:func:`sample_rows`), which the logger writes to samples.jsonl."""
        self.account, self.counters, self.sources = account, counters, sources
        self.decode, self.samples_per_step = decode, samples_per_step
        self.last_save = 0.0  # elapsed time of the last checkpoint
        self.start()

    def start(self, elapsed_s: float = 0.0) -> None:
        """Rates count from now, elapsed time from ``elapsed_s`` (the training time before a resume)."""
        self.last = time.perf_counter()
        self.t_start = self.last - elapsed_s
        self.last_save = elapsed_s  # a resumed run was saved when it stopped
        self.last_account = self.account()
        self.last_counters: dict = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t_start

    def record(self, version: int, groups: list, batch: Batch, train: dict, sync_s: float, wait_s: float) -> dict:
        acc = self.account()
        now = time.perf_counter()
        dt = max(now - self.last, 1e-9)

        def delta(key: str) -> float:
            return acc.get(key, 0) - self.last_account.get(key, 0)

        record = {
            "step": version,
            "version": version,
            **batch_stats(batch, version - 1),
            "gen_tokens_per_s": delta("generated_tokens") / dt,
            "gen_busy_frac": delta("busy_s") / dt,
            "train_tokens_per_s": train["train_tokens"] / max(train["train_time_s"], 1e-9),
            "trainer_wait_s": wait_s,
            "weight_sync_s": sync_s,
            "step_time_s": dt,
            "elapsed_s": now - self.t_start,
            "interruptions": acc.get("interruptions", 0),
            "gate_closed_s": delta("gate_closed_s"),
        }
        record.update(time_account(dt, delta, train))
        if self.sources is not None:
            record.update(source_stats(groups, self.sources))
        counters: dict = {}
        for read in self.counters:
            counters.update(read())
        for k, v in counters.items():  # the accounting seconds of the window; every other counter as it is
            record[k] = v - self.last_counters.get(k, 0.0) if k in ACCOUNTED else v
        record.update(train)
        record["trained_items"] = [item for g in groups for item in [g.item_id] * len(g.trajectories)]
        if self.decode is not None and self.samples_per_step:
            record["samples"] = sample_rows(groups, version - 1, self.decode, self.samples_per_step)
        self.last, self.last_account, self.last_counters = now, acc, counters
        return record


ACCOUNTED = {key(side, phase) for side in ("episode", "reward") for phase in SIDES[side]}
"""Counters the parts report cumulatively that the record holds per step."""


def time_account(dt: float, delta: Callable[[str], float], train: dict) -> dict:
    """The trainer's and the generator's phases over a window of ``dt`` seconds: ``delta(name)`` is how much a
    running total of the timeline (``Timeline.account``) grew in it, ``train`` the trainer's statistics of the
    step in it. Each side sums to ``dt``: the trainer's ``other`` is its bookkeeping (the rest of the train span,
    the log spans) and the time between its spans (small on a quiet machine; under CPU contention, threads
    waiting for a core or the GIL); the generator's is what its counters did not claim (next to nothing:
    engines count the phase they are in up to the moment they are read)."""
    measured = {k: train.get(f"train_{k}_s", 0.0) for k in ("recompute", "fwd_bwd", "optim")}
    trainer = {
        "wait": delta("span_wait_s"),
        **measured,
        "sync": delta("span_sync_s"),
        "eval": delta("span_eval_s"),
        "save": delta("span_save_s"),  # other: the rest of the train span (advantages, collation) and logs
        "other": max(0.0, delta("span_train_s") - sum(measured.values())) + delta("span_log_s"),
    }
    trainer["other"] += max(0.0, dt - sum(trainer.values()))  # between the spans
    idle = delta("idle_s")
    gate = min(max(0.0, delta("idle_gate_s")), max(0.0, idle))
    gen = {
        "decode": delta("decode_s"),
        "prefill": delta("prefill_s"),
        "reprefill": delta("reprefill_s"),
        "paused": delta("paused_s"),
        "idle_gate": gate,
        "idle_nowork": max(0.0, idle - gate),
    }
    gen["other"] = max(0.0, dt - sum(gen.values()))
    return {**{key("trainer", k): v for k, v in trainer.items()}, **{key("gen", k): v for k, v in gen.items()}}


def sample_rows(groups: list, trained_version: int, decode: Callable[[list[int]], str], k: int = 4) -> list[dict]:
    """``k`` samples of a batch to read, as a TRL or verl user looks at first: the best and the worst of the
    first groups, each with its prompt, completion, reward, finish reason, the versions that generated it and
    its staleness when trained at ``trained_version``."""
    rows = []
    for g in groups:
        ranked = sorted(g.trajectories, key=lambda t: t.reward, reverse=True)
        for t in (ranked[:1] + ranked[-1:]) if len(ranked) > 1 else ranked:
            if len(rows) == k:
                return rows
            versions = [v for v in t.versions if v >= 0] or [trained_version]
            rows.append(
                {
                    "item": g.item_id,
                    "prompt": decode(t.prompt_ids),
                    "completion": t.text or decode(t.output_ids),
                    "reward": t.reward,
                    "finish_reason": t.finish_reason,
                    "version_min": min(versions),
                    "version_max": max(versions),
                    "staleness": trained_version - min(versions),
                }
            )
    return rows


# ---- sinks -----------------------------------------------------------------------------------------------
class Console:
    """A progress bar with one line per step (on a terminal), or one log line per step (``progress_bar`` off, or
    output to a file or pipe, where a bar's carriage returns would garble the log). What the fields are is said
    once, at the start."""

    def __init__(self, progress_bar: bool, total_steps: int, terminal: bool | None = None):
        self._bar = None
        log.info(CONSOLE_LEGEND)
        if progress_bar and (sys.stderr.isatty() if terminal is None else terminal):
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, desc="train", unit="step", dynamic_ncols=True)

    def show(self, record: dict) -> None:
        line = summary_line(record)
        if self._bar is None or not record.get("step"):
            log.info("%s%s", "" if record.get("step") else "start | ", line)
            return
        self._bar.update(1)
        self._bar.set_postfix(reward=f"{record['reward_mean']:.3f}", stale=record["staleness_max"])
        self._bar.write(line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class RunFileError(RuntimeError):
    """A file of the run directory that the run needs (metrics.jsonl, ledger.jsonl, samples.jsonl) cannot be
    written (a full disk): the run stops with one line, and resumes from its last checkpoint once it can."""


class MetricsLogger:
    """Writes each step's record to every configured sink."""

    def __init__(
        self,
        run_dir: Path,
        *,
        tensorboard: bool = False,
        wandb_project: str | None = None,
        run_name: str = "",
        config: dict | None = None,
        console: Console | None = None,
    ):
        """Writes ``run_dir/metrics.jsonl`` and ``ledger.jsonl``; also TensorBoard event files if
        ``tensorboard``, and a W&B run in ``wandb_project`` (named ``run_name``, with ``config``) if given."""
        self.path = Path(run_dir) / "metrics.jsonl"
        self.console = console
        self._file = self.path.open("a")
        self._ledger = (Path(run_dir) / "ledger.jsonl").open("a")
        self._samples = (Path(run_dir) / "samples.jsonl").open("a", encoding="utf-8")
        self.last_step: int | None = None  # the step of the last record written
        self._failed: str | None = None  # the file being written (named when a write fails)
        self._tb = self._wandb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise RuntimeError("stats_logger.tensorboard=true needs `pip install tensorboard`") from e
            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
        if wandb_project:
            try:
                import wandb
            except ImportError as e:
                raise RuntimeError("stats_logger.wandb=true needs `pip install wandb`") from e
            self._wandb = wandb.init(
                project=wandb_project, name=run_name or None, dir=str(run_dir), config=config or {}
            )

    def log(self, record: dict) -> None:
        """One step's record to every sink; its ``trained_items`` (the prompt id of every trained sample) go to
        ``ledger.jsonl`` instead, with the step and version they were trained at. A file that cannot be written
        is a RunFileError naming it."""
        try:
            self._log(record)
        except OSError as e:
            name = Path(getattr(e, "filename", None) or self._failed or self.path).name
            raise RunFileError(
                f"{name}: cannot write ({e.strerror or e}) at step {record.get('step')}: free space and run the "
                "same command again to resume from the last checkpoint"
            ) from e

    def _log(self, record: dict) -> None:
        record = dict(record)
        samples = record.pop("samples", None)
        self._failed = self._samples.name
        if samples:
            self._samples.write(
                "".join(json.dumps({"step": record["step"], **row}, ensure_ascii=False) + "\n" for row in samples)
            )
            self._samples.flush()
        items = record.pop("trained_items", None)
        self._failed = self._ledger.name
        if items is not None:
            self._ledger.write(
                json.dumps({"step": record["step"], "version": record["version"] - 1, "items": items}) + "\n"
            )
            self._ledger.flush()
        self._failed = self._file.name
        self._file.write(json.dumps({k: _encode(v) for k, v in record.items()}) + "\n")
        self._file.flush()
        self._failed = None
        if not record.get("evaluation"):  # an evaluation that ended beside training belongs to an earlier step
            self.last_step = record.get("step")
        scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        step = int(record.get("step", 0))
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)
        if self.console is not None:
            self.console.show(record)

    def close(self) -> None:
        """Flush and close every sink; idempotent."""
        if self._file.closed:
            return
        for file in (self._file, self._ledger, self._samples):
            try:
                file.close()
            except OSError:  # a full disk: the write that failed stopped the run and said so
                pass
        if self.console is not None:
            self.console.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _encode(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def summary_line(record: dict) -> str:
    parts = []
    for name, fmt in CONSOLE_KEYS:
        value = record.get(name)
        if value is None or (name == "truncated_frac" and not value):
            continue
        if "{:d}" in fmt:
            parts.append(
                fmt.format(int(value))
                if isinstance(value, int) or math.isfinite(value)
                else fmt.replace("{:d}", "{}").format(value)
            )
        else:
            parts.append(fmt.format(value))
    return " | ".join(parts)


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl``, one per step (evaluations that ended beside training merged
    into their step's record)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(2, "no such file", str(path))
    return read_records(path)  # a torn last line (a run still writing) skipped
