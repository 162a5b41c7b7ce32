"""Continuing samples that an abort cut short, shared by the engines: the tokens so far are resubmitted as the
prompt of a new request until the sample stops or reaches its budget (the new chunks are generated, and
stamped, under whatever weights serve then)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Awaitable, Callable

from asyncrl.types import Completion, SamplingParams


def join(done: Completion, more: Completion) -> Completion:
    """A sample continued after an interruption: the tokens so far, then the new chunk."""
    return Completion(
        done.prompt_ids,
        done.output_ids + more.output_ids,
        done.logprobs + more.logprobs,
        done.versions + more.versions,
        more.finish_reason,
        done.queued_s + more.queued_s,
    )


MAX_EMPTY_RESUMES = 100
"""Resubmissions in a row that bring no new token before a sample is given up as stuck."""


async def continue_aborted(
    c: Completion,
    params: SamplingParams,
    resubmit: Callable[[list[int], SamplingParams], Awaitable[Completion]],
    index: int = 0,
) -> Completion:
    """Finish sample ``index`` of a request that an abort cut short: resubmit prompt + output so far
    (``resubmit(ids, params)`` returns one completion; it draws as sample ``index``) until it stops or reaches
    ``params.max_new_tokens``. The new chunks are generated (and stamped) under whatever weights serve then."""
    empty = 0
    while c.finish_reason == "abort" and len(c.output_ids) < params.max_new_tokens:
        rest = dataclasses.replace(
            params,
            n=1,
            max_new_tokens=params.max_new_tokens - len(c.output_ids),
            seed_offset=params.seed_offset + index,
            stop_context=params.stop_context + len(c.output_ids),
        )
        more = await resubmit(c.prompt_ids + c.output_ids, rest)
        empty = 0 if more.output_ids else empty + 1
        if empty >= MAX_EMPTY_RESUMES:
            raise RuntimeError(
                f"a sample was aborted {empty} times in a row without a new token: the engine keeps aborting it"
            )
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
