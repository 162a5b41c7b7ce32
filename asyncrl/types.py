"""Data carried between the parts of asyncrl. Data only: no behaviour beyond small derived properties."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

MIN_TEMPERATURE = 1e-4
"""Below this, logits divided by the temperature overflow float32 for ordinary logit ranges: use greedy."""


@dataclass(frozen=True)
class SamplingParams:
    """How one prompt is sampled. ``n`` samples of a prompt share one prefill. A sample ends at one of
    ``stop_token_ids`` (empty: the engine's end-of-sequence tokens), at a ``stop`` string in its decoded
    output, or after ``max_new_tokens``."""

    n: int = 1
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    seed: int | None = None
    """With a seed, sample i's random draws depend only on (seed, i, token position) in the built-in engine:
    the same prompt, weights and seed give the same tokens, however the engine batches or interrupts them."""
    seed_offset: int = 0
    """The index i of this request's first sample: a sample resubmitted after an abort (n=1) keeps drawing as
    sample i of its group, not as another sample 0."""
    stop_context: int = 0
    """How many of the prompt's last tokens are this sample's own earlier output (a sample resubmitted after an
    abort): the built-in engine looks for ``stop`` strings across them too, so that one the abort split is seen."""

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"sampling n must be >= 1, got {self.n}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.greedy and not (math.isfinite(self.temperature) and self.temperature >= MIN_TEMPERATURE):
            raise ValueError(
                f"temperature must be a finite number >= {MIN_TEMPERATURE} for sampling (0 or "
                f"greedy for the most likely token), got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:  # NaN fails too
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.stop_context < 0:
            raise ValueError(f"stop_context must be >= 0, got {self.stop_context}")


@dataclass
class Completion:
    """One generated sample. ``logprobs`` are the behaviour log-probabilities of ``output_ids`` under the
    distribution they were sampled from; ``versions`` the weight version that produced each token."""

    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str  # "stop" | "length" | "abort"
    queued_s: float = 0.0  # how long the request waited for a free slot before its prefill (0 where unknown)


@dataclass
class Trajectory:
    """A completion with its reward, ready for training. ``loss_mask`` (one 0/1 per output token; None = all 1)
    marks output tokens that are context, not trained: e.g. tool results between the assistant turns of a
    whole conversation (their ``behav_logprobs`` are 0 and ``versions`` -1)."""

    prompt_ids: list[int]
    output_ids: list[int]
    behav_logprobs: list[float]
    versions: list[int]
    reward: float
    finish_reason: str = "stop"
    text: str = ""
    loss_mask: list[int] | None = None

    @property
    def n_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


@dataclass
class TrajectoryGroup:
    """The samples of one prompt (a GRPO group). ``admit_version`` is the version when it was admitted."""

    trajectories: list[Trajectory]
    item_id: Any = None
    admit_version: int = 0

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]


@dataclass
class Batch:
    """Padded training tensors. Position t of the target arrays describes token t+1 of ``input_ids``."""

    input_ids: torch.Tensor  # (N, T)
    attention_mask: torch.Tensor  # (N, T)
    loss_mask: torch.Tensor  # (N, T-1) 1 on completion tokens
    behav_logprobs: torch.Tensor  # (N, T-1)
    versions: torch.Tensor  # (N, T-1) -1 on prompt and padding
    rewards: torch.Tensor  # (N,)
    group_ids: torch.Tensor  # (N,) which group each row belongs to
    truncated: torch.Tensor  # (N,) bool: stopped by max_new_tokens

    @property
    def n_tokens(self) -> int:
        return int(self.attention_mask.sum())


@dataclass
class WeightUpdate:
    """New weights for an engine: HF-named tensors and the version they become."""

    version: int
    state_dict: dict[str, torch.Tensor] | None = None
    path: str | None = None  # a directory of safetensors (disk transport)
