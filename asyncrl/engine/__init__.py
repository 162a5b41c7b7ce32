"""Inference engines behind one Protocol (``base.Engine``), built from the ``rollout`` config section."""

from __future__ import annotations

import torch

from asyncrl.engine.config import RolloutConfig
from asyncrl.engine.local import LocalEngine
from asyncrl.publish import InProcessPublisher


def build_engine(cfg: RolloutConfig, model, *, model_path: str, dtype: torch.dtype, max_len: int, seed: int,
                 stop_token_ids: tuple[int, ...]):
    """The rollout engine for ``cfg.backend`` (not started). ``model`` is the trainer's live model (for
    in-process engines); ``model_path`` the resolved checkpoint directory it was loaded from."""
    return LocalEngine(model, max_slots=cfg.max_slots, max_len=max_len, dtype=dtype, seed=seed,
                       interrupt_mode=cfg.interrupt_mode, stop_token_ids=stop_token_ids, threads=cfg.threads)


def build_publisher(cfg: RolloutConfig, engines: list):
    """The weight transport that reaches ``engines``."""
    return InProcessPublisher(engines, timeout_s=cfg.weight_sync_timeout_s)
