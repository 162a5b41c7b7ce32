"""RL with verifiable rewards, single turn: one prompt, n samples, a reward function per sample."""

from __future__ import annotations

import asyncio
import dataclasses

from asyncrl.api.engine import Engine
from asyncrl.data.formats import item_prompt_ids
from asyncrl.engine.sampling import derive_seed
from asyncrl.types import SamplingParams, Trajectory, TrajectoryGroup


class RLVRWorkflow:
    """The item's prompt (its ``prompt_ids``, else its chat-formatted ``question``), ``params.n`` samples
    in one request, and the reward service's score of each decoded sample (scored concurrently)."""

    def __init__(self, context):
        self.tokenizer, self.reward, self.params = context.tokenizer, context.reward, context.params
        self.seed = context.seed

    def _params(self, item: dict) -> SamplingParams:
        """The run's sampling, seeded per item (run seed, item id): a resumed or replayed run draws the same
        samples for the same item under the same weights."""
        if self.seed is None or item.get("id") is None:
            return self.params
        return dataclasses.replace(self.params, seed=derive_seed(self.seed, int(item["id"])))

    async def run(self, item: dict, engine: Engine) -> TrajectoryGroup | None:
        prompt_ids = item_prompt_ids(self.tokenizer, item)
        completions = await engine.generate(prompt_ids, self._params(item))
        texts = [self.tokenizer.decode(c.output_ids, skip_special_tokens=True) for c in completions]
        rewards = await asyncio.gather(*(self.reward.ascore(item, text) for text in texts))  # scored side by side
        return TrajectoryGroup(
            [
                Trajectory(c.prompt_ids, c.output_ids, c.logprobs, c.versions, r, c.finish_reason, t)
                for c, t, r in zip(completions, texts, rewards)
            ],
            item_id=item.get("id"),
        )
