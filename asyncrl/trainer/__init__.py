"""The trainer: the policy (and optionally a critic and a frozen reference model) with its optimizer.

- :mod:`.policy`: ``PolicyTrainer`` (a ``asyncrl.api.trainer.Trainer``), algorithm-blind: one step from a batch
  with the functions of an ``asyncrl.algo`` ``Algorithm``;
- :mod:`.forward`: how a batch runs through a model (micro-batches, packed or padded, autocast);
  :mod:`.packing`: the packed layout; :mod:`.logprobs`: log-probs at the engine's sampling distribution;
- :mod:`.critic`: the value head and a separate critic's step; :mod:`.state`: optimizer state and checkpoints;
- :mod:`.config`: the ``actor`` config section; ``build_trainer`` turns it into a ``PolicyTrainer``.
"""

from __future__ import annotations

import os

import torch

from asyncrl.algo.algorithm import build_algorithm
from asyncrl.models.lora import AdaptersOff, is_lora
from asyncrl.trainer.critic import CRITIC_DIR, VALUE_HEAD_FILE, load_value_head
from asyncrl.trainer.policy import PolicyTrainer

__all__ = ["PolicyTrainer", "build_trainer"]


def build_trainer(
    cfg,
    model,
    *,
    model_path: str,
    temperature: float,
    autocast_dtype: torch.dtype | None,
    max_new_tokens: int | None = None,
    top_p: float = 1.0,
    top_k: int = 0,
    dp=None,
    device: str = "cpu",
    init_path: str | None = None,
    threads=None,
) -> PolicyTrainer:
    """The trainer for an ``ActorConfig``. ``model`` is the policy (a peft model: its LoRA adapters train); a
    separate critic (``actor.critic=separate``) loads from ``model_path``, a frozen reference model
    (``actor.ref_model``) from ``init_path`` (the run's starting checkpoint; default ``model_path``; with LoRA:
    the policy with its adapters disabled) or its own directory. ``max_new_tokens`` (gconfig) is DAPO's L_max
    and Dr.GRPO's default normaliser."""
    from asyncrl.models.hf import load_model

    ref_model = None
    if cfg.ref_model == "init" and is_lora(model):
        ref_model = AdaptersOff(model)
    elif cfg.ref_model != "none":
        ref_model = load_model((init_path or model_path) if cfg.ref_model == "init" else cfg.ref_model)
    if cfg.critic_path and not os.path.isfile(os.path.join(cfg.critic_path, VALUE_HEAD_FILE)):
        raise FileNotFoundError(
            f"actor.critic_path: {os.path.join(cfg.critic_path, VALUE_HEAD_FILE)} not found "
            f"(a checkpoint's {CRITIC_DIR}/ directory holds it)"
        )
    critic_model = None
    if cfg.critic == "separate":
        from transformers import AutoModel

        critic_model = AutoModel.from_pretrained(cfg.critic_path or model_path)
    trainer = PolicyTrainer(
        model,
        build_algorithm(cfg, max_new_tokens),
        ref_model=ref_model,
        critic=cfg.critic,
        critic_model=critic_model,
        critic_lr=cfg.critic_lr,
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        weight_decay=cfg.weight_decay,
        warmup_steps=cfg.warmup_steps,
        max_grad_norm=cfg.max_grad_norm,
        mb_max_tokens=cfg.mb_max_tokens,
        ppo_n_minibatches=cfg.ppo_n_minibatches,
        ppo_epochs=cfg.ppo_epochs,
        pack_sequences=cfg.pack_sequences,
        shared_prefix=cfg.shared_prefix,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        autocast_dtype=autocast_dtype,
        dp=dp,
        device=device,
        threads=threads,
    )
    if cfg.critic_path and trainer.value_head is not None:
        load_value_head(cfg.critic_path, trainer.value_head)
    return trainer
