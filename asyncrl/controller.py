"""The asynchronous train loop: admit -> rollout -> buffer -> train -> publish -> version.

Generation runs continuously in its own threads (the engine loop and the rollout event loop, which admits
prompts through the staleness gate); this thread trains on each batch as soon as it is ready, publishes the
new weights (in-flight requests continue under them) and raises the version, which opens the gate for more
prompts. The parts are built by ``asyncrl.launch.assemble``; this module only runs them.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from asyncrl.config import TrainConfig
from asyncrl.data.collate import collate
from asyncrl.data.config import source_lookup
from asyncrl import parallel
from asyncrl.configlib import ConfigError
from asyncrl.launch.build import Parts, assemble, build_rank_trainer
from asyncrl.launch.ranks import serve_rank, spawn_ranks
from asyncrl.launch.resume import resume_point
from asyncrl.launch.signals import GracefulStop

log = logging.getLogger(__name__)


def train(cfg: TrainConfig) -> dict:
    """Run RL training as configured; returns the last metrics record. A run that fails or is stopped by the
    watchdog after training at least one step leaves a checkpoint of its last weights (if they are finite)."""
    if cfg.launcher == "ray" and "ASYNCRL_RAY_RANK" not in os.environ:  # the driver; the ranks it starts have it
        from asyncrl.launch import ray as ray_launcher

        return ray_launcher.run(cfg)
    resume = _resume_point(cfg)
    dp, ranks = _trainer_ranks(cfg, resume)
    if dp is not None and dp.rank > 0:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: rank 0 stops this one
        serve_rank(build_rank_trainer(cfg, dp, resume), dp)
        return {}
    run_dir = None
    try:
        with GracefulStop() as stop, assemble(cfg, dp, resume) as parts:
            run_dir, stop.buffer = parts.run_dir, parts.buffer
            parts.meter.source_of = source_lookup(cfg.train_dataset)  # a mixture's metrics per source
            try:
                return run(parts)
            except Exception as e:  # a failure, the watchdog or a signal (StopRequested): keep what was trained
                _save_last(parts)
                dead = ranks.failed() if ranks is not None else []
                if dead:  # the collective that failed is the symptom; the rank's death is the cause
                    raise RuntimeError(f"a trainer rank died (exit status {dead[0]}); the run stops, resume it from "
                                       "its last checkpoint") from e
                raise
    finally:  # after every part is closed: nothing competes with the plots, and the files are complete
        if ranks is not None:
            ranks.close()
        if cfg.report and run_dir is not None:
            _write_report(run_dir)


def _resume_point(cfg: TrainConfig):
    """The checkpoint this run continues from, if any. Ranks started by this process learn it from the
    environment (``ASYNCRL_RESUME``), so that all ranks load the same one."""
    if "ASYNCRL_RESUME" in os.environ:
        return Path(os.environ["ASYNCRL_RESUME"]) if os.environ["ASYNCRL_RESUME"] else None
    point = resume_point(cfg)
    if point is not None:
        log.info("resuming from %s", point)
    return point


def _trainer_ranks(cfg: TrainConfig, resume):
    """This process's place among the trainer ranks: (None, None) for one rank; else the process group, and the
    other ranks' processes when this one started them (launcher=local without torchrun's environment)."""
    world = cfg.actor.world_size
    if world == 1:
        return None, None
    ranks = None
    if "WORLD_SIZE" not in os.environ:
        from asyncrl.engine.spawn import free_port

        ranks = spawn_ranks(cfg, world, cfg.cluster.master_port or free_port(), resume)
    elif int(os.environ["WORLD_SIZE"]) != world:
        raise ConfigError(f"actor.backend={cfg.actor.backend} asks for {world} ranks, but WORLD_SIZE is "
                          f"{os.environ['WORLD_SIZE']} (torchrun --nproc-per-node must match)")
    import torch

    rank = int(os.environ["RANK"])
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}"
                          if cfg.cluster.resolved_device() == "cuda" else "cpu")
    timeout = cfg.rollout.batch_timeout_s + 600  # a rank waits for rank 0's next batch at most this long
    return parallel.from_env(cfg.actor.parallel_mode, device, timeout), ranks


def run(p: Parts) -> dict:
    """The loop: one batch, one optimizer step, one new version per iteration."""
    plan, tl, record = p.plan, p.timeline, {}
    if p.start.version == 0:
        with tl.span("eval", 0):
            record = {"step": 0, "version": 0, **p.evaluate(0)}
        p.logger.log(record)
    p.start_generation()
    for step in range(p.start.version, plan.total_steps):
        with tl.span("wait", step) as waited:
            groups = p.buffer.take(plan.batch_timeout_s)  # raises the rollout side's failure at once
        batch = collate(groups, plan.pad_id)
        with tl.span("train", step):
            stats = p.trainer.step(batch, version=step)
        version = step + 1
        with tl.span("sync", step):
            sync_s = p.publisher.publish(p.trainer.state_dict(), version)
        p.buffer.set_version(version)  # the staleness gate opens for B more groups
        record = p.meter.record(version, groups, batch, stats, sync_s, waited.seconds)
        final = version == plan.total_steps or plan.out_of_time(p.meter.elapsed())
        if final or plan.evaluate_at(version):
            with tl.span("eval", version):
                record.update(p.evaluate(version))
        p.logger.log(record)  # before the checkpoint: a resume cuts the logs back to it, never leaves a hole
        if final or plan.save_at(version, p.meter.elapsed() - p.meter.last_save):
            with tl.span("save", version):
                p.save(version)
        p.watchdog.check(record)
        if final:
            break
    log.info("trained up to version %s in %.0f s", record.get("version"), p.meter.elapsed())
    return record


def _save_last(parts: Parts) -> None:
    """A checkpoint of the weights the run stops with, if they are those of the last step logged and not saved
    already (refused, and said, if they are not finite)."""
    version = parts.trainer.steps_done
    if version == 0 or parts.checkpoints.last == version or parts.logger.last_step != version:
        return
    try:
        parts.save(version)
        log.info("the run stops: checkpoint of version %d saved", version)
    except Exception as e:  # noqa: BLE001 - the reason the run stopped matters more
        log.error("the run stops: no checkpoint of version %d: %s", version, e)


def _write_report(run_dir) -> None:
    from asyncrl.report import write_report

    try:
        log.info("run report: %s", write_report(run_dir))
    except Exception as e:  # noqa: BLE001 - a finished run never fails for its report
        log.warning("no run report: %s", e)
