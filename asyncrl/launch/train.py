"""``asyncrl train``: the launcher on top of the loop.

``train(cfg)`` decides what this process is, then runs it:

- the Ray driver (``launcher=ray``, not started by Ray): ``asyncrl.launch.ray.run`` places servers and ranks;
- trainer rank 1..N-1 (``actor.backend=ddp:dN``/``fsdp:dN``): ``serve_rank`` trains on the shards rank 0 sends;
- rank 0 or the only rank: the resume point (``asyncrl.launch.resume``), ``assemble(cfg)`` builds the parts, and
  ``asyncrl.loop.controller.run`` runs the loop; the run report is written when every part is closed.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from asyncrl.cluster import parallel
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError
from asyncrl.launch.build import assemble
from asyncrl.launch.policy import build_rank_trainer
from asyncrl.launch.ranks import RANK_ENV, RESUME_ENV, RankDied, serve_rank, spawn_ranks
from asyncrl.launch.resume import resume_point
from asyncrl.launch.signals import GracefulStop, StopRequested
from asyncrl.loop.checkpoint import read_latest, run_version
from asyncrl.loop.controller import run

log = logging.getLogger(__name__)


def train(cfg: TrainConfig) -> dict:
    """Run RL training as configured; returns the last metrics record (an empty one on ranks 1..N-1). A run
    that fails or is stopped after training at least one step leaves a checkpoint of its last weights (if they
    are finite)."""
    if cfg.launcher == "ray" and RANK_ENV not in os.environ:  # the driver; the ranks it starts have it
        from asyncrl.launch import ray as ray_launcher

        return ray_launcher.run(cfg)
    resume = _resume_point(cfg)
    done = _complete(cfg, resume)
    if done is not None:
        return done
    dp, ranks = _trainer_ranks(cfg, resume)
    if dp is not None and dp.rank > 0:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: rank 0 stops this one
        serve_rank(build_rank_trainer(cfg, dp, resume), dp)
        return {}
    run_dir, finished = None, False
    try:
        with GracefulStop() as stop, assemble(cfg, dp, resume) as parts:
            run_dir, stop.buffer = parts.run_dir, parts.buffer
            try:
                record = run(parts)
                finished = True
                return {**record, "run_dir": str(run_dir), "checkpoint": _latest_checkpoint(run_dir)}
            except Exception as e:
                dead = ranks.failed(grace_s=2.0) if ranks is not None else []
                if dead:  # the collective that failed is the symptom; the rank's death is the cause
                    raise RankDied(
                        f"a trainer rank died (exit status {dead[0]}); the run stops, resume it from "
                        "its last checkpoint"
                    ) from e
                raise
    except StopRequested as e:
        e.checkpoint = _latest_checkpoint(run_dir) if run_dir is not None else None
        raise
    finally:  # after every part is closed: nothing competes with the plots, and the files are complete
        if ranks is not None:
            ranks.close()
        if cfg.report and run_dir is not None:
            _write_report(run_dir)
        if run_dir is not None:
            _say_verdict(run_dir)
        if finished:
            _say_outcome(run_dir)


def _resume_point(cfg: TrainConfig) -> Path | None:
    """The checkpoint this run continues from, if any. Ranks started by this process learn it from the
    environment (``RESUME_ENV``), so that all ranks load the same one."""
    if RESUME_ENV in os.environ:
        return Path(os.environ[RESUME_ENV]) if os.environ[RESUME_ENV] else None
    point = resume_point(cfg)
    if point is not None:
        log.info("resuming from %s", point)
    return point


def _complete(cfg: TrainConfig, resume: Path | None) -> dict | None:
    """Rerunning a run that has trained all its steps: say so, and how to go on or start over (rather than
    build everything to train 0 steps)."""
    if resume is None or RANK_ENV in os.environ or "WORLD_SIZE" in os.environ:
        return None
    version = run_version(resume)
    if version < cfg.total_train_steps:
        return None
    run_dir = resume.parent.parent
    log.info(
        "%s is complete: it trained %d of total_train_steps=%d steps, its checkpoint is %s. To train on, raise "
        "total_train_steps; to start over, set resume=fresh (the run is moved aside, not deleted) or another "
        "trial_name",
        run_dir,
        version,
        cfg.total_train_steps,
        resume,
    )
    return {"version": version, "complete": True, "run_dir": str(run_dir), "checkpoint": str(resume)}


def _latest_checkpoint(run_dir: Path) -> str | None:
    name = read_latest(run_dir / "checkpoints")
    return str(run_dir / "checkpoints" / name) if name else None


def _say_outcome(run_dir: Path) -> None:
    """Start -> end in a few lines: steps and time, reward, held-out accuracy, where the checkpoint and the report
    are."""
    from asyncrl.report.summary import summarize
    from asyncrl.telemetry.record import load_run

    try:
        run = load_run(run_dir)
        s = summarize(run)
    except Exception as e:  # noqa: BLE001 - a run never fails for its summary
        log.warning("no summary: %s", e)
        return
    last = run.steps[-1]["step"] if run.steps else 0
    log.info(
        "done: step %d, %.0f s of training (median step %.2f s); run directory %s",
        last,
        s.wall_s,
        s.step_time_s,
        run_dir,
    )
    if s.reward_first is not None:
        log.info("reward %.3f -> %.3f (mean of the first and the last 5 steps)", s.reward_first, s.reward_last)
    if s.final_accuracy is not None:
        best_step = max(run.evals, key=lambda r: r["eval_accuracy"])["step"]
        start = f"{s.initial_accuracy:.3f} -> " if s.initial_accuracy is not None else ""
        log.info("held-out accuracy %s%.3f (best %.3f at step %d)", start, s.final_accuracy, s.best_accuracy, best_step)
    checkpoint = _latest_checkpoint(run_dir)
    if checkpoint:
        log.info("checkpoint: %s (a Hugging Face directory; asyncrl eval --model %s)", checkpoint, run_dir)
    if (run_dir / "report.html").is_file():
        log.info("report: %s (asyncrl diagnose %s: where the time went)", run_dir / "report.html", run_dir)


def _trainer_ranks(cfg: TrainConfig, resume: Path | None):
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
        raise ConfigError(
            f"actor.backend={cfg.actor.backend} asks for {world} ranks, but WORLD_SIZE is "
            f"{os.environ['WORLD_SIZE']} (torchrun --nproc-per-node must match)"
        )
    import torch

    rank = int(os.environ["RANK"])
    if rank == 0:
        log.info(
            "trainer: %d %s ranks (actor.backend=%s)%s",
            world,
            cfg.actor.parallel_mode,
            cfg.actor.backend,
            ", started here" if ranks is not None else ", from torchrun",
        )
    device = torch.device(
        f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}" if cfg.cluster.resolved_device() == "cuda" else "cpu"
    )
    timeout = cfg.rollout.batch_timeout_s + 600  # a rank waits for rank 0's next batch at most this long
    return parallel.from_env(cfg.actor.parallel_mode, device, timeout), ranks


def _say_verdict(run_dir: Path) -> None:
    """The verdict's few lines end the run's output (``asyncrl diagnose RUN_DIR`` prints them again)."""
    from asyncrl.report.diagnose import diagnose_dir

    try:
        for line in diagnose_dir(run_dir).lines():
            log.info("verdict: %s", line)
    except Exception as e:  # noqa: BLE001 - a run never fails for its verdict
        log.warning("no verdict: %s", e)


def _write_report(run_dir: Path) -> None:
    from asyncrl.report import write_report

    try:
        log.info("run report: %s", write_report(run_dir))
    except Exception as e:  # noqa: BLE001 - a finished run never fails for its report
        log.warning("no run report: %s", e)
