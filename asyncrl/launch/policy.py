"""The training side of a run from its config: which weights it starts from (``model.path``, or a resumed
checkpoint's), the policy model (with LoRA adapters where asked, a resumed run's loaded back), its trainer with the
checkpoint's optimizer state, and what trainer ranks 1..N-1 build (the policy alone, nothing of the rollout side)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from asyncrl.cluster.parallel import DataParallel
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError
from asyncrl.loop.checkpoint import CheckpointError, restore_training_state, weights_dir
from asyncrl.models.hf import DTYPES, check_model_dir, load_model
from asyncrl.models.lora import apply_lora, load_adapter, trainable_summary
from asyncrl.trainer import build_trainer

log = logging.getLogger(__name__)


def model_paths(cfg: TrainConfig, resume: Path | None) -> tuple[str | None, str]:
    """(the starting checkpoint ``model.path``, resolved; the HF directory of the weights the run starts from:
    the same, or the resumed checkpoint's). A resumed run needs ``model.path`` only for LoRA (the base model)
    and the reference model ``init``; otherwise it is None there."""
    lora = cfg.model.lora
    if lora.enabled and cfg.actor.parallel_mode == "fsdp" and cfg.actor.world_size > 1:
        raise ConfigError(
            f"model.lora.rank={lora.rank} with actor.backend={cfg.actor.backend}: LoRA trains with "
            "ddp:dN or one rank (FSDP of adapters is not supported)"
        )
    if resume is None:
        path = check_model_dir(cfg.model.path)
        return path, path
    needed = lora.enabled or cfg.actor.ref_model == "init"
    return (check_model_dir(cfg.model.path) if needed else None), weights_dir(resume)


def policy_model(cfg: TrainConfig, model, init_path: str | None, resume: Path | None):
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


def policy_trainer(
    cfg: TrainConfig,
    actor,
    policy,
    model_path: str,
    init_path: str | None,
    resume: Path | None,
    autocast_dtype: torch.dtype | None,
    dp: DataParallel | None,
    device: str,
    threads=None,
):
    """The trainer of ``policy`` for the ``actor`` section (the run's, or one adjusted for shared cores), with a
    resumed run's optimizer state."""
    trainer = build_trainer(
        actor,
        policy,
        model_path=model_path,
        temperature=cfg.gconfig.temperature,
        autocast_dtype=autocast_dtype,
        max_new_tokens=cfg.gconfig.max_new_tokens,
        top_p=cfg.gconfig.top_p,
        top_k=cfg.gconfig.top_k,
        dp=dp,
        device=device,
        init_path=init_path,
        threads=threads,
    )
    if trainer.sharing_off:
        log.info("actor.shared_prefix: off, %s: every sample computes its own prefix", trainer.sharing_off)
    if resume is not None:
        restore_training_state(trainer, resume)
    return trainer


def say_trainable(cfg: TrainConfig, policy) -> None:
    """One line: how many of the policy's parameters train (with LoRA, the adapters')."""
    counts = trainable_summary(policy)
    log.info(
        "policy: %s trainable parameters of %s (%.2f%%)%s",
        f"{counts['trainable']:,}",
        f"{counts['total']:,}",
        100 * counts["fraction"],
        f", LoRA rank {cfg.model.lora.rank}" if cfg.model.lora.enabled else "",
    )


def build_rank_trainer(cfg: TrainConfig, dp: DataParallel, resume: Path | None = None):
    """Ranks 1..N-1: the policy and its optimizer, nothing of the rollout side."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.actor.threads)
    init_path, model_path = model_paths(cfg, resume)
    model = policy_model(cfg, None, init_path, resume)
    dtype = DTYPES[cfg.model.dtype]
    autocast = None if dtype == torch.float32 else dtype
    trainer = policy_trainer(cfg, cfg.actor, model, model_path, init_path, resume, autocast, dp, str(dp.device))
    trainer.gather_weights()
    return trainer
