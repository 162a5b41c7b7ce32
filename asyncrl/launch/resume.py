"""Resuming a run: ``asyncrl train`` on a run directory that holds a checkpoint continues from it.

``resume: auto`` (the default) resumes when the configuration matches the one the run was started with; keys
that only change how a run is watched, stopped or placed may differ (``SETTABLE``); any other difference is
refused with the keys listed. ``resume: fresh`` starts over: an existing run directory is moved aside to
``<trial_name>.replaced-<time>``, never overwritten. A directory with files but no checkpoint (a run killed
before its first save) is moved aside the same way.

On resume the run's files are cut back to the checkpoint: ``metrics.jsonl`` and ``ledger.jsonl`` keep the
steps up to its version (so every step appears once), ``timeline.jsonl`` the records before its time.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

from asyncrl import configlib
from asyncrl.configlib import ConfigError
from asyncrl.loop.checkpoint import newest_valid

log = logging.getLogger(__name__)

RESUME_MODES = ("auto", "fresh")
SETTABLE = (
    "output_dir",
    "experiment_name",
    "trial_name",  # where the run is, however it is spelt or moved
    "total_train_steps",
    "max_train_time_s",
    "progress_bar",
    "report",
    "resume",
    "launcher",
    "cluster.",
    "evaluator.",
    "saver.",
    "stats_logger.",
    "watchdog.",
    "reward.workers",
    "reward.timeout_s",
    "rollout.request_timeout_s",
    "rollout.batch_timeout_s",
    "rollout.weight_sync_timeout_s",
    "rollout.server_startup_timeout_s",
    "rollout.backend",
    "rollout.server_addrs",
    "rollout.server_key_env",
    "rollout.server_api",  # the Ray launcher writes the servers it started as remote ones of their dialect
    "rollout.threads",
    "rollout.weight_transport",
    "rollout.weight_dir",
    "rollout.dist_",
    "rollout.max_failures_in_a_row",
    "actor.threads",
    "actor.backend",
    "actor.mb_max_tokens",
    "agent.timeout_s",
    "agent.client",
    "agent.proxy_",
    "agent.admin_key",
)
"""Keys that may change between a run and its resumption: how it is watched, stopped, placed and timed.
Everything else (model, data, algorithm, sampling, seeds) must match."""


def run_dir_of(cfg) -> Path:
    return Path(cfg.output_dir) / cfg.experiment_name / cfg.trial_name


def resume_point(cfg) -> Path | None:
    """The checkpoint directory to resume from, or None to start fresh (``start_fresh`` then moves an old run
    aside). Reads only."""
    run_dir = run_dir_of(cfg)
    if cfg.resume not in RESUME_MODES:
        raise ConfigError(f"resume must be one of {list(RESUME_MODES)}, got '{cfg.resume}'")
    point, skipped = newest_valid(run_dir / "checkpoints")
    if cfg.resume == "fresh" or point is None:
        return None
    for line in skipped:
        log.warning("not resuming from %s; an earlier checkpoint is used", line)
    differences = _differences(run_dir / "config.yaml", configlib.to_dict(cfg))
    if differences:
        shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in differences[:8])
        raise ConfigError(
            f"{run_dir} holds a run with another configuration ({shown}"
            f"{'; ...' if len(differences) > 8 else ''}): resume it with the same keys, or set "
            "resume=fresh to start over (the old run is moved aside, not deleted)"
        )
    return point


def start_fresh(run_dir: Path) -> None:
    """Move the files of an earlier run out of ``run_dir`` (to ``<name>.replaced-<time>``) before a new one."""
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return
    point, skipped = newest_valid(run_dir / "checkpoints")
    why = (
        "resume=fresh"
        if point is not None
        else "it holds no checkpoint to resume from" + (f": {'; '.join(skipped)}" if skipped else "")
    )
    aside = run_dir.with_name(f"{run_dir.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
    shutil.move(str(run_dir), str(aside))
    log.warning("starting %s afresh (%s); the previous run is kept in %s", run_dir, why, aside)


def _differences(saved: Path, current: dict) -> list[tuple[str, object, object]]:
    try:
        old = configlib.read_mapping(saved)
    except ConfigError as e:
        raise ConfigError(
            f"cannot read the configuration of the run to resume, {saved}: {e}; set resume=fresh to start over"
        ) from e
    a, b = configlib.flat(old), configlib.flat(current)
    keys = sorted(set(a) | set(b))
    found = [(k, a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k) and not k.startswith(SETTABLE)]
    # the number of ranks may change, the kind may not: DDP's optimizer state is saved by parameter index,
    # FSDP's as a full state dict by parameter name
    kinds = [str(c.get("actor.backend", "ddp")).partition(":")[0] for c in (a, b)]
    if kinds[0] != kinds[1]:
        found.append(("actor.backend (ddp or fsdp)", a.get("actor.backend"), b.get("actor.backend")))
    return found


def truncate_run_files(run_dir: Path, version: int, timeline_s: float) -> None:
    """Keep the steps up to ``version`` in metrics.jsonl, ledger.jsonl and samples.jsonl, and the timeline up to
    ``timeline_s``; a line torn by a kill is dropped."""
    for name in ("metrics.jsonl", "ledger.jsonl", "samples.jsonl"):
        _keep(run_dir / name, lambda r: r.get("step", 0) <= version)
    _keep(run_dir / "timeline.jsonl", lambda r: r.get("t", r.get("t1", 0.0)) <= timeline_s)


def _keep(path: Path, wanted) -> None:
    if not path.exists():
        return
    kept = []
    for raw in path.read_bytes().splitlines():
        try:
            line = raw.decode("utf-8")
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):  # torn by a kill, maybe inside a character
            continue
        if wanted(record):
            kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    tmp.replace(path)
