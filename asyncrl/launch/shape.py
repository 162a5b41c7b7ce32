"""What several parts of a run derive from its config and its model, computed once: the context per sequence,
the stop tokens, the generation and training dtypes, the sampling of rollouts and of held-out evaluation."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError
from asyncrl.data.formats import stop_ids
from asyncrl.engine.config import builtin_context
from asyncrl.models.hf import DTYPES
from asyncrl.types import SamplingParams


def context_len(rollout, max_positions: int, max_new_tokens: int = 0) -> int:
    """Prompt + completion tokens per sequence for ``rollout`` (a ``RolloutConfig``) and a model of
    ``max_positions``: ``rollout.max_context`` if set, else the model's own for vLLM/SGLang servers, and for the
    built-in engine ``builtin_context``."""
    if rollout.max_context:
        if rollout.max_context > max_positions:
            raise ConfigError(
                f"rollout.max_context={rollout.max_context} exceeds the model's "
                f"max_position_embeddings of {max_positions}"
            )
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
        g, eos = cfg.gconfig, stop_ids(tokenizer)
        if len(eos) > 1:
            names = tokenizer.convert_ids_to_tokens(list(eos))
            logging.getLogger(__name__).info(
                "generation stops at %s, the chat template's end of turn, and at the eos %s", names[0], names[1]
            )
        max_len = context_len(cfg.rollout, model.config.max_position_embeddings, g.max_new_tokens)
        if g.max_new_tokens >= max_len:
            raise ConfigError(
                f"gconfig.max_new_tokens={g.max_new_tokens} leaves no room for a prompt in the "
                f"model's context of {max_len} tokens"
            )
        dtype = DTYPES[cfg.model.dtype]
        return cls(
            eos,
            max_len,
            dtype,
            None if dtype == torch.float32 else dtype,
            SamplingParams(
                n=g.n_samples,
                max_new_tokens=g.max_new_tokens,
                temperature=g.temperature,
                top_p=g.top_p,
                top_k=g.top_k,
                stop_token_ids=eos,
            ),
            SamplingParams(
                max_new_tokens=g.max_new_tokens,
                greedy=cfg.evaluator.greedy,
                temperature=g.temperature,
                stop_token_ids=eos,
            ),
        )
