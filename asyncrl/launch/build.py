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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from asyncrl import configlib
from asyncrl.algo import build_group_filter
from asyncrl.loop.buffer import RolloutBuffer
from asyncrl.loop.checkpoint import (CheckpointError, Checkpointer, RunState, load_run_state, restore_training_state,
                                weights_dir)
from asyncrl.loop.controller import LoopPlan, Parts
from asyncrl.cluster.cores import SHARED_MB_TOKENS, CoreShare, cpu_model, process_cores, spare_threads
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError
from asyncrl.data.config import dataset_from_config
from asyncrl.engine import build_engine
from asyncrl.api.engine import Lifecycle
from asyncrl.engine.config import builtin_context
from asyncrl.engine.local import LocalEngine
from asyncrl.loop.evaluate import BackgroundEvaluator, Evaluator
from asyncrl.trainer.critic import CRITIC_DIR
from asyncrl.cluster.placement import Allocation, PlacementError, allocate
from asyncrl.report.diagnose import MACHINE_FILE
from asyncrl.launch.ranks import RANK_ENV, RankedTrainer
from asyncrl.launch.resume import run_dir_of, start_fresh, truncate_run_files
from asyncrl.models.lora import apply_lora, load_adapter, trainable_summary
from asyncrl.cluster.parallel import DataParallel
from asyncrl.weights.publish import build_publisher
from asyncrl.telemetry.metrics import Console, MetricsLogger, StepMeter
from asyncrl.models.hf import DTYPES, check_model_dir, load_model, load_tokenizer
from asyncrl.reward import build_reward_service
from asyncrl.loop.rollout import RolloutRunner
from asyncrl.loop.staleness import AutoStaleness, FixedStaleness
from asyncrl.telemetry.timeline import Timeline
from asyncrl.trainer import build_trainer
from asyncrl.types import SamplingParams
from asyncrl.telemetry.watchdog import LiveVerdict, Watchdog
from asyncrl.api.workflow import Closable, Counted, Evaluating, Workflow, WorkflowContext
from asyncrl.workflow import build_workflow

log = logging.getLogger(__name__)

def context_len(rollout, max_positions: int, max_new_tokens: int = 0) -> int:
    """Prompt + completion tokens per sequence for ``rollout`` (a ``RolloutConfig``) and a model of
    ``max_positions``: ``rollout.max_context`` if set, else the model's own for vLLM/SGLang servers, and for the
    built-in engine ``builtin_context``."""
    if rollout.max_context:
        if rollout.max_context > max_positions:
            raise ConfigError(f"rollout.max_context={rollout.max_context} exceeds the model's "
                              f"max_position_embeddings of {max_positions}")
        return rollout.max_context
    if rollout.placement.kind in ("vllm", "sglang"):
        return max_positions
    return builtin_context(max_positions, max_new_tokens)


@dataclass(frozen=True)
class RunShape:
    """What several parts derive from the config and the model, computed once."""

    stop_token_ids: tuple[int, ...]
    max_len: int  # prompt + completion tokens per sequence
    dtype: torch.dtype  # generation dtype
    autocast_dtype: torch.dtype | None  # training compute dtype (master weights stay float32)
    sampling: SamplingParams  # rollouts
    eval_params: SamplingParams  # held-out evaluation

    @classmethod
    def of(cls, cfg: TrainConfig, model, tokenizer) -> "RunShape":
        g, eos = cfg.gconfig, (tokenizer.eos_token_id,)
        max_len = context_len(cfg.rollout, model.config.max_position_embeddings, g.max_new_tokens)
        if g.max_new_tokens >= max_len:
            raise ConfigError(f"gconfig.max_new_tokens={g.max_new_tokens} leaves no room for a prompt in the "
                              f"model's context of {max_len} tokens")
        dtype = DTYPES[cfg.model.dtype]
        return cls(eos, max_len, dtype, None if dtype == torch.float32 else dtype,
                   SamplingParams(n=g.n_samples, max_new_tokens=g.max_new_tokens, temperature=g.temperature,
                                  top_p=g.top_p, top_k=g.top_k, stop_token_ids=eos),
                   SamplingParams(max_new_tokens=g.max_new_tokens, greedy=cfg.evaluator.greedy,
                                  temperature=g.temperature, stop_token_ids=eos))


@contextlib.contextmanager
def assemble(cfg: TrainConfig, dp: DataParallel | None = None, resume: Path | None = None) -> Iterator[Parts]:
    """The parts of the run ``cfg`` describes (rank 0's, when ``dp`` has several ranks), continuing from the
    checkpoint ``resume`` if given; each is closed when the block exits, however it exits."""
    with contextlib.ExitStack() as stack:
        yield _build(cfg, stack, dp, resume)


def build_rank_trainer(cfg: TrainConfig, dp: DataParallel, resume: Path | None = None):
    """Ranks 1..N-1: the policy and its optimizer, nothing of the rollout side."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.actor.threads)
    init_path, model_path = _paths(cfg, resume)
    model = _policy(cfg, None, init_path, resume)
    shape_dtype = DTYPES[cfg.model.dtype]
    trainer = build_trainer(cfg.actor, model, model_path=model_path, temperature=cfg.gconfig.temperature,
                            autocast_dtype=None if shape_dtype == torch.float32 else shape_dtype,
                            max_new_tokens=cfg.gconfig.max_new_tokens, top_p=cfg.gconfig.top_p,
                            top_k=cfg.gconfig.top_k, dp=dp, device=str(dp.device), init_path=init_path)
    if resume is not None:
        restore_training_state(trainer, resume)
    trainer.gather_weights()
    return trainer


def _allocation(cfg: TrainConfig, device: str) -> Allocation:
    """Which GPUs the servers this process starts get (after the trainer ranks'); refused at start-up if the
    machine has too few. Ranks started by the Ray launcher see only their own GPU and start no servers."""
    kind = torch.device(device).type
    if RANK_ENV in os.environ:
        kind = "cpu"  # nothing to place here: Ray placed every process
    try:
        return allocate(cfg.rollout.backend, cfg.actor.backend, kind,
                        torch.cuda.device_count() if kind == "cuda" else 0)
    except PlacementError as e:
        raise ConfigError(str(e)) from None


def _build(cfg: TrainConfig, stack: contextlib.ExitStack, dp: DataParallel | None, resume: Path | None) -> Parts:
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.actor.threads)
    device = str(dp.device) if dp is not None else cfg.cluster.resolved_device()
    allocation = _allocation(cfg, device)
    init_path, model_path = _paths(cfg, resume)
    start = load_run_state(resume) if resume else RunState(version=0)
    if resume and cfg.actor.critic != "none":  # the critic comes back from the checkpoint too
        cfg = dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, critic_path=str(resume / CRITIC_DIR)))
    tokenizer = load_tokenizer(model_path)  # the trainer thread's (evaluation, checkpoints)
    rollout_tokenizer = load_tokenizer(model_path)  # the rollout thread's: fast tokenizers are not thread-safe
    model = load_model(model_path)  # master weights in float32; model.dtype sets the compute dtype (engines' copy)
    shape = RunShape.of(cfg, model, tokenizer)
    room = shape.max_len - cfg.gconfig.max_new_tokens  # prompt tokens that fit beside a full completion
    if (cfg.train_dataset.max_prompt_tokens or 0) > room:
        raise ConfigError(f"train_dataset.max_prompt_tokens={cfg.train_dataset.max_prompt_tokens} exceeds the "
                          f"{room} tokens a prompt can have beside gconfig.max_new_tokens={cfg.gconfig.max_new_tokens} "
                          f"in the engine's context of {shape.max_len}; lower it or leave it unset")
    data = dataset_from_config(cfg.task, cfg.train_dataset, cfg.valid_dataset, tokenizer=rollout_tokenizer,
                               default_max_prompt_tokens=room)
    reward = build_reward_service(cfg.reward, data.reward_fn)
    stack.callback(reward.close)
    share, sharing = _core_share(cfg)
    engine = _start(stack, cfg.rollout.backend, lambda: build_engine(
        cfg.rollout, model, model_path=model_path, dtype=shape.dtype, max_len=shape.max_len, seed=cfg.seed,
        stop_token_ids=shape.stop_token_ids, server_devices=allocation.server_devices, device=device,
        version=start.version, threads=share and share.engine_threads))
    eval_engine = _start(stack, "local (the evaluation engine)", lambda: LocalEngine(
        model, max_slots=cfg.rollout.max_slots, max_len=shape.max_len, dtype=shape.dtype, seed=cfg.seed + 1,
        stop_token_ids=shape.stop_token_ids, native_kernels=cfg.rollout.native_kernels, device=device,
        version=start.version), start=False)  # its threads and start below, once the workflow is known
    policy = _policy(cfg, model, init_path, resume)  # after the engines copied the plain weights
    actor = cfg.actor if share is None or share.alternating else dataclasses.replace(  # re-read it often (cores)
        cfg.actor, mb_max_tokens=min(cfg.actor.mb_max_tokens, SHARED_MB_TOKENS))
    trainer = build_trainer(actor, policy, model_path=model_path, temperature=cfg.gconfig.temperature,
                            autocast_dtype=shape.autocast_dtype, max_new_tokens=cfg.gconfig.max_new_tokens,
                            top_p=cfg.gconfig.top_p, top_k=cfg.gconfig.top_k, dp=dp, device=device,
                            init_path=init_path, threads=share and share.trainer_threads)
    counts = trainable_summary(policy)
    log.info("policy: %s trainable parameters of %s (%.2f%%)%s", f"{counts['trainable']:,}", f"{counts['total']:,}",
             100 * counts["fraction"], f", LoRA rank {cfg.model.lora.rank}" if cfg.model.lora.enabled else "")
    if resume is not None:
        restore_training_state(trainer, resume)
    if dp is not None:  # the engines above copied the whole model before FSDP sharded it
        trainer.gather_weights()
        trainer = RankedTrainer(trainer, dp)
        stack.callback(trainer.close)
    r = cfg.rollout
    publisher = build_publisher(r.resolved_transport, [engine], timeout_s=r.weight_sync_timeout_s,
                                weight_dir=r.weight_dir or None, dist_backend=r.dist_backend,
                                bucket_mb=r.dist_bucket_mb, master_address=r.dist_master_addr)
    stack.callback(publisher.close)
    workflow = _workflow(cfg, WorkflowContext(rollout_tokenizer, reward, shape.sampling, shape.max_len,
                                              shape.stop_token_ids, seed=cfg.seed))
    if isinstance(workflow, Closable):
        stack.callback(workflow.close)

    run_dir = _run_dir(cfg, start)
    max_staleness, batch_size = cfg.rollout.max_staleness, cfg.train_dataset.batch_size
    policy = (AutoStaleness(cfg.rollout.max_staleness_limit) if cfg.rollout.max_head_offpolicyness == "auto"
              else FixedStaleness(max_staleness))
    policy.restore(start.staleness or {})  # a resumed auto η goes on where it stood
    buffer = RolloutBuffer(batch_size, policy, cfg.rollout.max_concurrent_rollouts)
    sharing.update(engine=engine)
    # a resumed run: the groups that were ready, then the items that were in flight, then the stream goes on
    buffer.restore(start.version, start.ready, start.accepted, start.rejected, start.drawn - len(start.inflight))
    items = itertools.chain(start.inflight, itertools.islice(data.train, start.drawn, None))
    rollout = RolloutRunner(engine, buffer, workflow, items, cfg.rollout.request_timeout_s,
                            accept=build_group_filter(cfg.actor),
                            max_failures_in_a_row=cfg.rollout.max_failures_in_a_row or (max_staleness + 2) * batch_size)
    stack.callback(rollout.stop)
    sinks = cfg.stats_logger
    logger = MetricsLogger(run_dir, tensorboard=sinks.tensorboard,
                           wandb_project=sinks.wandb_project if sinks.wandb else None,
                           run_name=f"{cfg.experiment_name}/{cfg.trial_name}", config=configlib.to_dict(cfg),
                           console=Console(cfg.progress_bar, cfg.total_train_steps))
    stack.callback(logger.close)
    timeline = Timeline(run_dir / "timeline.jsonl", engine.stats, start_s=start.timeline_s,
                        gate_closed_s=buffer.gate_closed_s)
    stack.callback(timeline.close)
    w = cfg.watchdog
    background_eval = cfg.evaluator.background and not isinstance(workflow, Evaluating)
    if cfg.evaluator.background and not background_eval:
        log.info("evaluator.background: the agent workflow evaluates in the foreground (its episodes share the "
                 "rollout side's proxy and tools)")
    in_trainer_thread = share is not None and not background_eval and not isinstance(workflow, Evaluating)
    if in_trainer_thread:  # single-turn, in the trainer's thread: on its cores and pool (asyncrl/cluster/cores.py)
        eval_engine.threads = share.trainer_threads
    else:
        eval_engine.threads = share.eval_threads() if share else _fixed_eval_threads(cfg)
        eval_engine.start()
    evaluate = _evaluator(cfg, workflow, eval_engine, trainer, copy.deepcopy(tokenizer) if background_eval else
                          tokenizer, data.valid, reward, shape)
    return Parts(
        run_dir=run_dir,
        plan=LoopPlan(cfg.total_train_steps, cfg.max_train_time_s, cfg.rollout.batch_timeout_s,
                      cfg.evaluator.freq_steps, cfg.saver.freq_steps, cfg.saver.freq_seconds,
                      cfg.saver.on_error == "stop", tokenizer.pad_token_id, cfg.saver.background),
        start=start, staleness=policy,
        trainer=trainer, engine=engine, publisher=publisher, buffer=buffer, rollout=rollout,
        evaluate=evaluate, background_eval=BackgroundEvaluator(evaluate) if background_eval else None,
        checkpoints=Checkpointer(run_dir, trainer, tokenizer, cfg.saver.keep_last), logger=logger, timeline=timeline,
        meter=StepMeter(timeline.account, [rollout.stats, reward.stats, buffer.stats, data.stats,
                                       *([workflow.stats] if isinstance(workflow, Counted) else [])],
                        sources=data.source_of,
                        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                        samples_per_step=cfg.stats_logger.samples_per_step),
        watchdog=Watchdog(w.no_signal_steps, w.reward_failure_steps, w.reward_failure_action == "stop",
                          w.max_nonfinite_steps, LiveVerdict(verdict_settings(cfg), w.verdict_steps),
                          first_reward_failure=lambda: reward.first_failure),
    )


def _fixed_eval_threads(cfg: TrainConfig) -> int:
    """The evaluation engine's threads with fixed threads: the trainer's, at most what the trainer and the engine
    leave of the process's cores where both run here on the CPU (asyncrl/cluster/cores.py); a warning where they alone
    already hold more OpenMP workers than cores."""
    if not cfg.cpu_split_applies():
        return cfg.actor.threads
    cores, actor, engine = process_cores(), cfg.actor.threads, cfg.rollout.threads
    if actor + engine > cores + 1:
        log.warning("cluster.cpu_split=fixed with actor.threads=%d and rollout.threads=%d on %d cores: torch's "
                    "OpenMP workers outnumber the cores, and libgomp then makes them sleep between operators "
                    "(each pays a wake-up: asyncrl/cluster/cores.py); keep actor.threads + rollout.threads <= %d, or use "
                    "cluster.cpu_split=auto", actor, engine, cores, cores + 1)
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


def verdict_settings(cfg: TrainConfig) -> dict:
    """What the verdict's rules know of the configuration (those ``asyncrl diagnose`` reads off a run directory:
    ``asyncrl.report.diagnose.run_settings``)."""
    return {"max_staleness": cfg.rollout.max_head_offpolicyness, "n_samples": cfg.gconfig.n_samples,
            "max_new_tokens": cfg.gconfig.max_new_tokens, "workers": cfg.reward.workers, "lr": cfg.actor.lr,
            "eval_background": cfg.evaluator.background, "save_background": cfg.saver.background,
            "transport": cfg.rollout.resolved_transport, "device": cfg.cluster.resolved_device().split(":")[0],
            **({"cpu_split": cfg.cluster.cpu_split} if cfg.cpu_split_applies() else {})}


def _paths(cfg: TrainConfig, resume: Path | None) -> tuple[str | None, str]:
    """(the starting checkpoint ``model.path``, resolved; the HF directory of the weights the run starts from:
    the same, or the resumed checkpoint's). A resumed run needs ``model.path`` only for LoRA (the base model)
    and the reference model ``init``; otherwise it is None there."""
    lora = cfg.model.lora
    if lora.enabled and cfg.actor.parallel_mode == "fsdp" and cfg.actor.world_size > 1:
        raise ConfigError(f"model.lora.rank={lora.rank} with actor.backend={cfg.actor.backend}: LoRA trains with "
                          "ddp:dN or one rank (FSDP of adapters is not supported)")
    if resume is None:
        path = check_model_dir(cfg.model.path)
        return path, path
    needed = lora.enabled or cfg.actor.ref_model == "init"
    return (check_model_dir(cfg.model.path) if needed else None), weights_dir(resume)


def _policy(cfg: TrainConfig, model, init_path: str | None, resume: Path | None):
    """The model the trainer trains: ``model`` (loaded from the run's weights if None), or with ``model.lora``
    the base model (``model.path``) with LoRA adapters, a resumed run's loaded from its checkpoint. The adapters
    start from ``cfg.seed`` whatever was drawn before (DDP starts every rank from rank 0's anyway)."""
    lora = cfg.model.lora
    if not lora.enabled:
        return model if model is not None else load_model(weights_dir(resume) if resume else init_path)
    if model is None or resume is not None:  # the engines' model holds merged weights: train the base
        model = load_model(init_path)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = apply_lora(model, lora.rank, lora.alpha, lora.dropout, lora.target_modules)
    if resume is not None:
        try:
            load_adapter(model, resume)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"cannot resume the LoRA adapter of {resume}: {e}") from e
    return model


def _evaluator(cfg: TrainConfig, workflow, engine, trainer, tokenizer, items, reward, shape: RunShape) -> Evaluator:
    """Held-out evaluation: the workflow's own (an agent runs its episodes) or one scored answer per item."""
    threshold = cfg.evaluator.success_threshold
    if isinstance(workflow, Evaluating):
        return Evaluator(engine, trainer.state_dict, lambda e: workflow.evaluate(
            e, items, tokenizer, shape.eval_params, success_threshold=threshold))
    return Evaluator.single_turn(engine, trainer.state_dict, tokenizer, items, reward.eval_fn, shape.eval_params,
                                 threshold)


def _workflow(cfg: TrainConfig, context: WorkflowContext) -> Workflow:
    """The configured workflow; a factory that refuses its kwargs is a start-up refusal."""
    kwargs = cfg.workflow.kwargs
    if cfg.workflow.name == "agent":  # the agent workflow is configured by its own section
        kwargs = {**dataclasses.asdict(cfg.agent), "serve": _serve_agent_proxy, **kwargs}
    try:
        return build_workflow(cfg.workflow.name, context, kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"workflow: cannot build '{cfg.workflow.name}' with workflow.kwargs="
                          f"{cfg.workflow.kwargs}: {e}") from e


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


def _run_dir(cfg: TrainConfig, start: RunState) -> Path:
    """``output_dir/experiment_name/trial_name`` with the resolved config in it: a resumed run's files cut back
    to its checkpoint, else an earlier run moved aside."""
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
    write_machine(cfg, run_dir)
    return run_dir


def write_machine(cfg: TrainConfig, run_dir: Path) -> None:
    """``run_dir/machine.json``: where the run (last) ran, which its config alone does not say
    (``cluster.device=auto`` resolves on the machine): the device, the CPU, the process's cores, whether trainer
    and engine share them (``cpu_split``, null where the split does not apply), torch's version. ``asyncrl
    diagnose`` reads it, so that a run directory copied to another machine is judged for the machine it ran on."""
    import json

    facts = {"device": cfg.cluster.resolved_device(), "cpu": cpu_model(), "cores": process_cores(),
             "cpu_split": cfg.cluster.cpu_split if cfg.cpu_split_applies() else None, "torch": torch.__version__}
    try:
        (run_dir / MACHINE_FILE).write_text(json.dumps(facts) + "\n")
    except OSError as e:
        raise ConfigError(f"output_dir: cannot write {run_dir / MACHINE_FILE}: {e.strerror or e}") from e
