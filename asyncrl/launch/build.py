"""Assembly: a ``TrainConfig`` becomes the ``asyncrl.loop.controller.Parts`` of a run, built inside one exit stack
that closes each part, in reverse order, on every path (a failure half-way through start-up closes what was
built). This is where config sections become plain arguments.

Everything that can refuse the configuration (the model directory, the data, the reward function, the
engine) is checked before the run directory is created. Single process, threads: the trainer (the caller's
thread), the engine loop, the rollout event loop; evaluation runs on a second engine pinned to the trained
version.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import logging
import os
from pathlib import Path
from typing import Callable, Iterator

import torch

from asyncrl import configlib
from asyncrl.algo import build_group_filter
from asyncrl.api.engine import Lifecycle
from asyncrl.api.workflow import Closable, Counted, Evaluating, Workflow, WorkflowContext
from asyncrl.cluster.cores import SHARED_MB_TOKENS, CoreShare, process_cores, spare_threads
from asyncrl.cluster.parallel import DataParallel
from asyncrl.cluster.placement import Allocation, PlacementError, allocate
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError
from asyncrl.data.config import dataset_from_config
from asyncrl.engine import build_engine
from asyncrl.engine.local import LocalEngine
from asyncrl.launch.policy import model_paths, policy_model, policy_trainer, say_trainable
from asyncrl.launch.ranks import RANK_ENV, RankedTrainer
from asyncrl.launch.resume import run_dir_of
from asyncrl.launch.rundir import eval_background, make_run_dir, verdict_settings
from asyncrl.launch.shape import RunShape
from asyncrl.loop.buffer import RolloutBuffer
from asyncrl.loop.checkpoint import (
    Checkpointer,
    RunState,
    load_run_state,
)
from asyncrl.loop.controller import LoopPlan, Parts
from asyncrl.loop.evaluate import BackgroundEvaluator, Evaluator
from asyncrl.loop.lock import RunDirLock
from asyncrl.loop.rollout import RolloutRunner
from asyncrl.loop.staleness import AutoStaleness, FixedStaleness
from asyncrl.models.hf import load_model, load_tokenizer
from asyncrl.reward import build_reward_service
from asyncrl.telemetry.load import MachineLoad
from asyncrl.telemetry.metrics import Console, MetricsLogger, StepMeter
from asyncrl.telemetry.timeline import Timeline
from asyncrl.telemetry.watchdog import LiveVerdict, Watchdog
from asyncrl.trainer.critic import CRITIC_DIR
from asyncrl.weights.publish import build_publisher
from asyncrl.workflow import build_workflow

log = logging.getLogger(__name__)


@contextlib.contextmanager
def assemble(cfg: TrainConfig, dp: DataParallel | None = None, resume: Path | None = None) -> Iterator[Parts]:
    """The parts of the run ``cfg`` describes (rank 0's, when ``dp`` has several ranks), continuing from the
    checkpoint ``resume`` if given; each is closed when the block exits, however it exits."""
    with contextlib.ExitStack() as stack:
        yield _build(cfg, stack, dp, resume)


def _allocation(cfg: TrainConfig, device: str) -> Allocation:
    """Which GPUs the servers this process starts get (after the trainer ranks'); refused at start-up if the
    machine has too few. Ranks started by the Ray launcher see only their own GPU and start no servers."""
    kind = torch.device(device).type
    if RANK_ENV in os.environ:
        kind = "cpu"  # nothing to place here: Ray placed every process
    try:
        return allocate(
            cfg.rollout.backend, cfg.actor.backend, kind, torch.cuda.device_count() if kind == "cuda" else 0
        )
    except PlacementError as e:
        raise ConfigError(str(e)) from None


def _build(cfg: TrainConfig, stack: contextlib.ExitStack, dp: DataParallel | None, resume: Path | None) -> Parts:
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.actor.threads)
    device = str(dp.device) if dp is not None else cfg.cluster.resolved_device()
    allocation = _allocation(cfg, device)
    init_path, model_path = model_paths(cfg, resume)
    start = load_run_state(resume) if resume else RunState(version=0)
    if resume and cfg.actor.critic != "none":  # the critic comes back from the checkpoint too
        cfg = dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, critic_path=str(resume / CRITIC_DIR)))
    tokenizer = load_tokenizer(model_path)  # the trainer thread's (evaluation, checkpoints)
    rollout_tokenizer = load_tokenizer(model_path)  # the rollout thread's: fast tokenizers are not thread-safe
    model = load_model(model_path)  # master weights in float32; model.dtype sets the compute dtype (engines' copy)
    shape = RunShape.of(cfg, model, tokenizer)
    room = shape.max_len - cfg.gconfig.max_new_tokens  # prompt tokens that fit beside a full completion
    if (cfg.train_dataset.max_prompt_tokens or 0) > room:
        raise ConfigError(
            f"train_dataset.max_prompt_tokens={cfg.train_dataset.max_prompt_tokens} exceeds the "
            f"{room} tokens a prompt can have beside gconfig.max_new_tokens={cfg.gconfig.max_new_tokens} "
            f"in the engine's context of {shape.max_len}; lower it or leave it unset"
        )
    data = dataset_from_config(
        cfg.task, cfg.train_dataset, cfg.valid_dataset, tokenizer=rollout_tokenizer, default_max_prompt_tokens=room
    )
    reward = build_reward_service(cfg.reward, data.reward_fn)
    stack.callback(reward.close)
    share, sharing = _core_share(cfg)
    engine = _start(
        stack,
        cfg.rollout.backend,
        lambda: build_engine(
            cfg.rollout,
            model,
            model_path=model_path,
            dtype=shape.dtype,
            max_len=shape.max_len,
            seed=cfg.seed,
            stop_token_ids=shape.stop_token_ids,
            server_devices=allocation.server_devices,
            device=device,
            version=start.version,
            threads=share and share.engine_threads,
        ),
    )
    eval_engine = _start(
        stack,
        "local (the evaluation engine)",
        lambda: LocalEngine(
            model,
            max_slots=cfg.rollout.max_slots,
            max_len=shape.max_len,
            dtype=shape.dtype,
            seed=cfg.seed + 1,
            stop_token_ids=shape.stop_token_ids,
            native_kernels=cfg.rollout.native_kernels,
            device=device,
            version=start.version,
        ),
        start=False,
    )  # its threads and start below, once the workflow is known
    policy = policy_model(cfg, model, init_path, resume)  # after the engines copied the plain weights
    actor = (
        cfg.actor
        if share is None or share.alternating
        else dataclasses.replace(  # re-read it often (cores)
            cfg.actor, mb_max_tokens=min(cfg.actor.mb_max_tokens, SHARED_MB_TOKENS)
        )
    )
    trainer = policy_trainer(
        cfg,
        actor,
        policy,
        model_path,
        init_path,
        resume,
        shape.autocast_dtype,
        dp,
        device,
        threads=share and share.trainer_threads,
    )
    say_trainable(cfg, policy)
    for line in cfg.actor.inert_terms(cfg.rollout.max_staleness):
        log.info("%s", line)
    if dp is not None:  # the engines above copied the whole model before FSDP sharded it
        trainer.gather_weights()
        trainer = RankedTrainer(trainer, dp)
        stack.callback(trainer.close)
    r = cfg.rollout
    publisher = build_publisher(
        r.resolved_transport,
        [engine],
        timeout_s=r.weight_sync_timeout_s,
        weight_dir=r.weight_dir or None,
        dist_backend=r.dist_backend,
        bucket_mb=r.dist_bucket_mb,
        master_address=r.dist_master_addr,
    )
    stack.callback(publisher.close)
    workflow = _workflow(
        cfg,
        WorkflowContext(rollout_tokenizer, reward, shape.sampling, shape.max_len, shape.stop_token_ids, seed=cfg.seed),
    )
    if isinstance(workflow, Closable):
        stack.callback(workflow.close)

    stack.callback(RunDirLock(run_dir_of(cfg)).release)  # a second run of this directory is refused here
    background = eval_background(cfg, evaluates_itself=isinstance(workflow, Evaluating))
    if background[1] != "set":
        log.info("evaluator.background: %s, %s", "beside training" if background[0] else "foreground", background[1])
    run_dir = make_run_dir(cfg, start, background)
    max_staleness, batch_size = cfg.rollout.max_staleness, cfg.train_dataset.batch_size
    policy = (
        AutoStaleness(cfg.rollout.max_staleness_limit)
        if cfg.rollout.max_head_offpolicyness == "auto"
        else FixedStaleness(max_staleness)
    )
    policy.restore(start.staleness or {})  # a resumed auto η goes on where it stood
    buffer = RolloutBuffer(batch_size, policy, cfg.rollout.max_concurrent_rollouts)
    sharing.update(engine=engine)
    # a resumed run: the groups that were ready, then the items that were in flight, then the stream goes on
    buffer.restore(start.version, start.ready, start.accepted, start.rejected, start.drawn - len(start.inflight))
    items = itertools.chain(start.inflight, itertools.islice(data.train, start.drawn, None))
    rollout = RolloutRunner(
        engine,
        buffer,
        workflow,
        items,
        cfg.rollout.request_timeout_s,
        accept=build_group_filter(cfg.actor),
        max_failures_in_a_row=cfg.rollout.max_failures_in_a_row or (max_staleness + 2) * batch_size,
    )
    stack.callback(rollout.stop)
    sinks = cfg.stats_logger
    logger = MetricsLogger(
        run_dir,
        tensorboard=sinks.tensorboard,
        wandb_project=sinks.wandb_project if sinks.wandb else None,
        run_name=f"{cfg.experiment_name}/{cfg.trial_name}",
        config=configlib.to_dict(cfg),
        console=Console(cfg.progress_bar, cfg.total_train_steps),
    )
    stack.callback(logger.close)
    timeline = Timeline(
        run_dir / "timeline.jsonl", engine.stats, start_s=start.timeline_s, gate_closed_s=buffer.gate_closed_s
    )
    stack.callback(timeline.close)
    w = cfg.watchdog
    background_eval = background[0]
    in_trainer_thread = share is not None and not background_eval and not isinstance(workflow, Evaluating)
    if in_trainer_thread:  # single-turn, in the trainer's thread: on its cores and pool (asyncrl/cluster/cores.py)
        eval_engine.threads = share.trainer_threads
    else:
        eval_engine.threads = share.eval_threads() if share else _fixed_eval_threads(cfg)
        eval_engine.start()
    evaluate = _evaluator(
        cfg,
        workflow,
        eval_engine,
        trainer,
        copy.deepcopy(tokenizer) if background_eval else tokenizer,
        data.valid,
        reward,
        shape,
    )
    return Parts(
        run_dir=run_dir,
        plan=LoopPlan(
            cfg.total_train_steps,
            cfg.max_train_time_s,
            cfg.rollout.batch_timeout_s,
            cfg.evaluator.freq_steps,
            cfg.saver.freq_steps,
            cfg.saver.freq_seconds,
            cfg.saver.on_error == "stop",
            tokenizer.pad_token_id,
            cfg.saver.background,
        ),
        start=start,
        staleness=policy,
        trainer=trainer,
        engine=engine,
        publisher=publisher,
        buffer=buffer,
        rollout=rollout,
        evaluate=evaluate,
        background_eval=BackgroundEvaluator(evaluate) if background_eval else None,
        checkpoints=Checkpointer(run_dir, trainer, tokenizer, cfg.saver.keep_last),
        logger=logger,
        timeline=timeline,
        meter=StepMeter(
            timeline.account,
            [
                rollout.stats,
                reward.stats,
                buffer.stats,
                data.stats,
                *([workflow.stats] if isinstance(workflow, Counted) else []),
                MachineLoad(),  # what else the machine ran, per step (the verdict says it first)
            ],
            sources=data.source_of,
            decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
            samples_per_step=cfg.stats_logger.samples_per_step,
        ),
        watchdog=Watchdog(
            w.no_signal_steps,
            w.reward_failure_steps,
            w.reward_failure_action == "stop",
            w.max_nonfinite_steps,
            LiveVerdict(verdict_settings(cfg, background), w.verdict_steps),
            first_reward_failure=lambda: reward.first_failure,
        ),
    )


def _fixed_eval_threads(cfg: TrainConfig) -> int:
    """The evaluation engine's threads with fixed threads: the trainer's, at most what the trainer and the engine
    leave of the process's cores where both run here on the CPU (asyncrl/cluster/cores.py); a warning where they alone
    already hold more OpenMP workers than cores."""
    if not cfg.cpu_split_applies():
        return cfg.actor.threads
    cores, actor, engine = process_cores(), cfg.actor.threads, cfg.rollout.threads
    if actor + engine > cores + 1:
        log.warning(
            "cluster.cpu_split=fixed with actor.threads=%d and rollout.threads=%d on %d cores: torch's "
            "OpenMP workers outnumber the cores, and libgomp then makes them sleep between operators "
            "(each pays a wake-up: asyncrl/cluster/cores.py); keep actor.threads + rollout.threads <= %d, or use "
            "cluster.cpu_split=auto",
            actor,
            engine,
            cores,
            cores + 1,
        )
    return min(actor, spare_threads(cores, actor, engine))


def _core_share(cfg: TrainConfig) -> tuple[CoreShare | None, dict]:
    """With cluster.cpu_split=auto, the cores shared by the trainer and the engine (and the dict the engine is
    put in once built, for it to read)."""
    parts: dict = {}
    sharing = cfg.cpu_sharing()
    if sharing == "fixed":
        return None, parts
    if sharing == "alternating":
        return CoreShare(process_cores(), alternating=True), parts
    return CoreShare(process_cores(), engine_idle=lambda: "engine" in parts and parts["engine"].idle), parts


def _evaluator(cfg: TrainConfig, workflow, engine, trainer, tokenizer, items, reward, shape: RunShape) -> Evaluator:
    """Held-out evaluation: the workflow's own (an agent runs its episodes) or one scored answer per item."""
    threshold = cfg.evaluator.success_threshold
    if isinstance(workflow, Evaluating):
        return Evaluator(
            engine,
            trainer.state_dict,
            lambda e: workflow.evaluate(e, items, tokenizer, shape.eval_params, success_threshold=threshold),
        )
    return Evaluator.single_turn(
        engine, trainer.state_dict, tokenizer, items, reward.eval_fn, shape.eval_params, threshold
    )


def _workflow(cfg: TrainConfig, context: WorkflowContext) -> Workflow:
    """The configured workflow; a factory that refuses its kwargs is a start-up refusal."""
    kwargs = cfg.workflow.kwargs
    if cfg.workflow.name == "agent":  # the agent workflow is configured by its own section
        kwargs = {**dataclasses.asdict(cfg.agent), "serve": _serve_agent_proxy, **kwargs}
    try:
        return build_workflow(cfg.workflow.name, context, kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"workflow: cannot build '{cfg.workflow.name}' with workflow.kwargs={cfg.workflow.kwargs}: {e}"
        ) from e


def _serve_agent_proxy(proxy, host: str, port: int, admin_key: str | None):
    """The agent proxy over HTTP (imported only when an agent run's client is the ``openai`` one)."""
    from asyncrl.server.agent import serve_proxy

    return serve_proxy(proxy, host, port, admin_key)


def _start(stack: contextlib.ExitStack, backend: str, build: Callable[[], Lifecycle], start: bool = True):
    """Build and start an engine (``start``), closed by ``stack``; a model it cannot run, or servers that do
    not come up, are start-up refusals that name ``rollout.backend``."""
    try:
        engine = build()
    except ValueError as e:  # the model's shape (decoder.DecoderShape) or the engine's arguments
        raise ConfigError(f"rollout.backend={backend}: {e}") from e
    stack.callback(engine.stop)
    if not start:
        return engine
    try:
        engine.start()
    except (TimeoutError, RuntimeError, OSError) as e:  # servers that did not come up
        raise ConfigError(f"rollout.backend={backend}: the inference servers did not start: {e}") from e
    return engine
