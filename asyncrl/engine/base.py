"""The engine seams. Workflows see three members (``Engine``); starting and stopping (``Lifecycle``, used by
the launcher) and the counters (``Metered``, read by the timeline and the step meter) are separate small
Protocols, used only by what needs them. Also the continuation of samples an abort cut short, shared by the
clients of remote servers."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol, runtime_checkable

from asyncrl.types import Completion, SamplingParams, WeightUpdate


@runtime_checkable
class Engine(Protocol):
    """An inference engine: generates with per-token versions and takes new weights mid-flight.

    ``generate`` returns ``params.n`` finished samples (finish reason ``stop`` or ``length``): a sample cut
    short by a weight update is continued by the engine itself, never by its caller. ``update_weights``
    returns once the new weights serve every later token (in-flight requests continue under them)."""

    @property
    def version(self) -> int: ...

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]: ...

    def update_weights(self, update: WeightUpdate, timeout: float | None = None) -> None: ...


@runtime_checkable
class Lifecycle(Protocol):
    """Something that runs threads, processes or connections between ``start`` and ``stop``."""

    def start(self): ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class EngineStats:
    """An engine's cumulative counters, read together as one snapshot. Its time splits into generating
    (``busy_s`` = ``prefill_s`` + ``decode_s`` + ``reprefill_s``), held for a weight update (``paused_s``),
    waiting for work (``idle_s``): the built-in engine counts every moment of its loop as one of them, up to the
    moment they are read. Remote engines see requests, not the servers' steps: their generating time is all
    ``decode_s``."""

    generated_tokens: int = 0
    busy_s: float = 0.0  # time spent generating
    interruptions: int = 0  # weight updates (or aborts) that hit in-flight requests
    prefill_s: float = 0.0  # admitting requests: their prompts' forward pass and first token
    decode_s: float = 0.0  # one token for every running sequence
    reprefill_s: float = 0.0  # recomputing running sequences' KV caches under new weights
    paused_s: float = 0.0  # held: paused, or installing new weights
    idle_s: float = 0.0  # no request to serve

    def plus(self, **deltas) -> "EngineStats":
        """These counters with ``deltas`` added (``busy_s`` follows the three phases it is made of)."""
        unknown = set(deltas) - {f.name for f in dataclasses.fields(self)} - {"busy_s"}
        if unknown or "busy_s" in deltas:
            raise TypeError(f"not EngineStats phases: {sorted(unknown | ({'busy_s'} & set(deltas)))}")
        busy = sum(deltas.get(k, 0.0) for k in ("prefill_s", "decode_s", "reprefill_s"))
        return EngineStats(**{f.name: getattr(self, f.name) + deltas.get(f.name, 0) for f in dataclasses.fields(self)
                              if f.name != "busy_s"}, busy_s=self.busy_s + busy)


@runtime_checkable
class Metered(Protocol):
    """An engine whose counters can be read at any time, from any thread."""

    def stats(self) -> EngineStats: ...


def join(done: Completion, more: Completion) -> Completion:
    """A sample continued after an interruption: the tokens so far, then the new chunk."""
    return Completion(done.prompt_ids, done.output_ids + more.output_ids, done.logprobs + more.logprobs,
                      done.versions + more.versions, more.finish_reason, done.queued_s + more.queued_s)


MAX_EMPTY_RESUMES = 100
"""Resubmissions in a row that bring no new token before a sample is given up as stuck."""


async def continue_aborted(c: Completion, params: SamplingParams,
                           resubmit: Callable[[list[int], SamplingParams], Awaitable[Completion]],
                           index: int = 0) -> Completion:
    """Finish sample ``index`` of a request that an abort cut short: resubmit prompt + output so far
    (``resubmit(ids, params)`` returns one completion; it draws as sample ``index``) until it stops or reaches
    ``params.max_new_tokens``. The new chunks are generated (and stamped) under whatever weights serve then."""
    empty = 0
    while c.finish_reason == "abort" and len(c.output_ids) < params.max_new_tokens:
        rest = dataclasses.replace(params, n=1, max_new_tokens=params.max_new_tokens - len(c.output_ids),
                                   seed_offset=params.seed_offset + index,
                                   stop_context=params.stop_context + len(c.output_ids))
        more = await resubmit(c.prompt_ids + c.output_ids, rest)
        empty = 0 if more.output_ids else empty + 1
        if empty >= MAX_EMPTY_RESUMES:
            raise RuntimeError(f"a sample was aborted {empty} times in a row without a new token: the engine "
                               "keeps aborting it")
        c = join(c, more)
    if c.finish_reason == "abort":
        c = dataclasses.replace(c, finish_reason="length")
    return c


async def continue_all(completions: list[Completion], params: SamplingParams, resubmit) -> list[Completion]:
    """``continue_aborted`` for every sample of a group at once: the group takes as long as its slowest
    remainder, not the sum of them. If one fails, the others are cancelled (the group is lost anyway)."""
    if all(c.finish_reason != "abort" for c in completions):
        return list(completions)
    tasks = [asyncio.ensure_future(continue_aborted(c, params, resubmit, i)) for i, c in enumerate(completions)]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
