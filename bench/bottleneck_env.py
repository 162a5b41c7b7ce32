"""What bench/bottlenecks.py plants: a workflow whose samples are short but for a rare very long one, and a
slow reward function."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from asyncrl.data.arith import arith_reward
from asyncrl.data.formats import item_prompt_ids
from asyncrl.engine.requests import NO_STOP_TOKENS
from asyncrl.types import Trajectory, TrajectoryGroup


class LongTail:
    """The built-in task's single-turn rollout, but one item in ``every`` is answered with ``long_tokens``
    tokens (no stop token), the others with at most ``short_tokens``: a rare very long sample in most batches."""

    def __init__(self, context, every: int = 16, short_tokens: int = 32, long_tokens: int = 400):
        self.tokenizer, self.reward, self.params = context.tokenizer, context.reward, context.params
        self.every, self.short, self.long = every, short_tokens, min(long_tokens, context.params.max_new_tokens)

    async def run(self, item: dict, engine) -> TrajectoryGroup:
        long = int(item["id"]) % self.every == 0
        params = dataclasses.replace(
            self.params,
            max_new_tokens=self.long if long else self.short,
            **({"stop_token_ids": NO_STOP_TOKENS} if long else {}),
        )
        completions = await engine.generate(item_prompt_ids(self.tokenizer, item), params)
        texts = [self.tokenizer.decode(c.output_ids, skip_special_tokens=True) for c in completions]
        rewards = await asyncio.gather(*(self.reward.ascore(item, t) for t in texts))
        return TrajectoryGroup(
            [
                Trajectory(c.prompt_ids, c.output_ids, c.logprobs, c.versions, r, c.finish_reason, t)
                for c, t, r in zip(completions, texts, rewards)
            ],
            item_id=item.get("id"),
        )


def slow_arith_reward(prompt: str, completion: str, answer: str, **_) -> float:
    """The built-in verifier after 150 ms of waiting, as a remote checker would take: with one worker, the 128
    rewards of a default step take ~19 s, well above a training step on the slowest CPU seen (~6 s), so the plant
    is the bottleneck on every machine (50 ms was not on an AVX2-only EPYC: 6.4 s, beside its 6 s trainer)."""
    time.sleep(0.15)
    return arith_reward(prompt, completion, answer)
