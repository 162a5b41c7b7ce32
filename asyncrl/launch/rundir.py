"""The run directory and what it records about the run beside its metrics: ``config.yaml`` (the resolved
config), ``machine.json`` (where it ran), and the settings the verdict's rules read."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from asyncrl import configlib
from asyncrl.cluster.cores import cpu_model, process_cores
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError
from asyncrl.launch.resume import run_dir_of, start_fresh, truncate_run_files
from asyncrl.loop.checkpoint import RunState
from asyncrl.report.diagnose import MACHINE_FILE, one_step


def eval_background(cfg: TrainConfig, evaluates_itself: bool = False) -> tuple[bool, str]:
    """Whether the run evaluates beside training (``evaluator.background``), and why where ``auto`` chose: beside
    training where the evaluation has a device or cores of its own, in the foreground where it would only take
    cores from the trainer and the engine (``evaluates_itself``: a workflow that evaluates in its own way, the
    agent's, always in the foreground)."""
    if evaluates_itself:
        return False, "the agent workflow evaluates in the foreground (its episodes share the rollout side's proxy)"
    chosen = cfg.evaluator.background
    if chosen != "auto":
        return bool(chosen), "set"
    device = cfg.cluster.resolved_device()
    if device != "cpu":
        return True, f"auto: on {device}, beside training"
    cores = process_cores()
    if cfg.cpu_sharing() != "fixed":
        return False, (
            f"auto: the trainer and the engine share all {cores} cores (cluster.cpu_split=auto), so an evaluation "
            "beside them would only take theirs"
        )
    placement = cfg.rollout.placement  # the built-in engine, or servers spawned here (remote ones run elsewhere)
    engine = (
        0 if placement.kind == "remote" else cfg.rollout.threads * (1 if placement.kind == "local" else placement.dp)
    )
    spare = cores - cfg.actor.threads * cfg.actor.world_size - engine
    if spare >= 1:
        return True, f"auto: {spare} of {cores} cores left by the trainer and the engine"
    return False, f"auto: no core of the {cores} left by the trainer and the engine"


def make_run_dir(cfg: TrainConfig, start: RunState, background: tuple[bool, str] | None = None) -> Path:
    """``output_dir/experiment_name/trial_name`` with the resolved config in it: a resumed run's files cut back
    to its checkpoint, else an earlier run moved aside. ``background``: where evaluation runs, and why
    (``eval_background``), recorded in machine.json."""
    run_dir = run_dir_of(cfg)
    try:
        if start.version:
            truncate_run_files(run_dir, start.version, start.timeline_s)
        else:
            start_fresh(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # e.g. a file where a directory should be
        raise ConfigError(f"output_dir: cannot create the run directory '{run_dir}': {e.strerror or e}") from e
    configlib.dump(cfg, run_dir / "config.yaml")
    write_machine(cfg, run_dir, background)
    return run_dir


def write_machine(cfg: TrainConfig, run_dir: Path, background: tuple[bool, str] | None = None) -> None:
    """``run_dir/machine.json``: where the run (last) ran, which its config alone does not say
    (``cluster.device=auto`` resolves on the machine): the device, the CPU, the process's cores, whether trainer
    and engine share them (``cpu_split``, null where the split does not apply), torch's version, where evaluation
    runs (``eval_background`` and, where auto chose, ``eval_background_why``). ``asyncrl diagnose`` reads it, so
    that a run directory copied to another machine is judged for the machine it ran on."""
    background = background or eval_background(cfg)
    facts = {
        "device": cfg.cluster.resolved_device(),
        "cpu": cpu_model(),
        "cores": process_cores(),
        "cpu_split": cfg.cluster.cpu_split if cfg.cpu_split_applies() else None,
        "torch": torch.__version__,
        "eval_background": background[0],
        **({"eval_background_why": background[1]} if background[1] != "set" else {}),
    }
    try:
        (run_dir / MACHINE_FILE).write_text(json.dumps(facts) + "\n")
    except OSError as e:
        raise ConfigError(f"output_dir: cannot write {run_dir / MACHINE_FILE}: {e.strerror or e}") from e


def verdict_settings(cfg: TrainConfig, background: tuple[bool, str] | None = None) -> dict:
    """What the verdict's rules know of the configuration (those ``asyncrl diagnose`` reads off a run directory:
    ``asyncrl.report.diagnose.run_settings``; ``background``: ``eval_background``'s answer, else asked here)."""
    background = background or eval_background(cfg)
    return {
        "max_staleness": cfg.rollout.max_head_offpolicyness,
        "n_samples": cfg.gconfig.n_samples,
        "max_new_tokens": cfg.gconfig.max_new_tokens,
        "workers": cfg.reward.workers,
        "lr": cfg.actor.lr,
        "policy_loss": cfg.actor.policy_loss,
        "one_step": one_step(cfg.actor.ppo_n_minibatches, cfg.actor.ppo_epochs, cfg.actor.prox_logp_method),
        "eval_background": background[0],
        **({"eval_background_why": background[1]} if background[1] != "set" else {}),
        "save_background": cfg.saver.background,
        "transport": cfg.rollout.resolved_transport,
        "device": cfg.cluster.resolved_device().split(":")[0],
        **({"cpu_split": cfg.cluster.cpu_split} if cfg.cpu_split_applies() else {}),
    }
