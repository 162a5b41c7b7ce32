"""What the built-in engine holds per request (the request, its sequences, a weight update waiting for a token
boundary), the checks a request must pass, and the engine's constants."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

import torch

from asyncrl.engine.layout import Weights
from asyncrl.engine.sampling import derive_seed
from asyncrl.types import SamplingParams, WeightUpdate

INTERRUPT_MODES = ("recompute", "abort", "drain")

MAX_VERSION = 2**63 - 1
"""Weight versions are int64 wherever they are stored (tensors of per-token versions, safetensors metadata)."""

CPU = torch.device("cpu")  # where the loop builds its per-step token ids and positions

NO_STOP_TOKENS = (-1,)
"""``SamplingParams.stop_token_ids`` that no token matches: a sample runs to ``max_new_tokens`` (an empty tuple
means the engine's default, the model's end-of-sequence tokens)."""


class VersionConflict(ValueError):
    """A weight update whose version is below the one being served: versions never go backwards, so that every
    token's version says which weights produced it, and a late update cannot undo a newer one."""


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: Future
    done: list = field(default_factory=list)
    submitted: float = field(default_factory=time.perf_counter)
    queued_s: float = 0.0  # from submission to admission


def settle(future: Future, result=None, error: BaseException | None = None) -> None:
    """Resolve a request's future unless it is done, tolerating a cancel from another thread between the check
    and the call (the caller stopped waiting: nothing to tell)."""
    if future.done():
        return
    try:
        future.set_exception(error) if error is not None else future.set_result(result)
    except InvalidStateError:
        pass


@dataclass
class SampleState:
    req: Request
    index: int
    tokens: list[int]  # prompt + output; the last output token is not in the KV cache yet
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    draw_seed: int | None = None  # the seed of this sample's draws (its request's seed and its index)

    def __post_init__(self):
        if self.req.params.seed is not None:
            self.draw_seed = derive_seed(self.req.params.seed, self.req.params.seed_offset + self.index)

    @property
    def cached(self) -> int:  # positions held in the KV cache
        return len(self.tokens) - 1

    @property
    def output_start(self) -> int:
        """Where the tokens a stop string may span begin in ``tokens``: the output, and the sample's own earlier
        output at the end of its prompt (``SamplingParams.stop_context``) when it was resubmitted after an abort."""
        return max(0, len(self.req.prompt_ids) - self.req.params.stop_context)


@dataclass
class PendingUpdate:
    """A weight update prepared off the loop, waiting for the next token boundary."""

    version: int
    weights: Weights
    applied: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None  # why installing failed (set before ``applied``)


def check_request(
    prompt_ids: list[int], params: SamplingParams, *, max_slots: int, max_len: int, vocab: int, has_tokenizer: bool
) -> None:
    """Raise ValueError with the reason if an engine of ``max_slots`` slots, ``max_len`` positions per sequence
    and ``vocab`` tokens cannot serve the request."""
    if not prompt_ids:
        raise ValueError("prompt_ids is empty")
    if params.n > max_slots:
        raise ValueError(f"n={params.n} samples exceed the engine's {max_slots} slots")
    if len(prompt_ids) + params.max_new_tokens > max_len:
        raise ValueError(
            f"prompt of {len(prompt_ids)} tokens + max_new_tokens {params.max_new_tokens} exceeds the "
            f"engine's max_len {max_len}"
        )
    if max(prompt_ids) >= vocab or min(prompt_ids) < 0:
        raise ValueError(f"prompt token ids must lie in [0, {vocab})")
    if params.stop and not has_tokenizer:
        raise ValueError("stop strings need an engine with a tokenizer")


def state_dict_of(update: WeightUpdate) -> dict[str, torch.Tensor]:
    """The weights an update carries, read from its path if it has no tensors."""
    if update.state_dict is not None:
        return update.state_dict
    if update.path is not None:
        from asyncrl.weights.wire import read_weights

        return read_weights(update.path)
    raise ValueError(f"weight update to version {update.version} carries neither a state_dict nor a path")


def ends_with_stop_string(tokenizer, output_ids: list[int], stops: tuple[str, ...]) -> bool:
    """Whether the decoded output now contains one of ``stops``. Only the tail that the newest token can
    have completed is decoded (a stop string of m characters spans at most m tokens, plus a few for byte
    tokens that decode to partial characters)."""
    window = max(len(s) for s in stops) + 4
    text = tokenizer.decode(output_ids[-window:], skip_special_tokens=False)
    return any(s in text for s in stops)
