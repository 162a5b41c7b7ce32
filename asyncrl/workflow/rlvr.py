"""RL with verifiable rewards, single turn: one prompt, n samples, a reward function per sample."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from asyncrl.engine.base import Engine
from asyncrl.reward import RewardService
from asyncrl.types import Completion, SamplingParams, Trajectory, TrajectoryGroup


class Workflow(Protocol):
    """One async seam: run an item against an engine; ``None`` rejects it (it is not trained on)."""

    async def run(self, item: dict, engine: Engine) -> TrajectoryGroup | None: ...


def chat_prompt_ids(tokenizer, question: str) -> list[int]:
    """Token ids of a single user turn under the tokenizer's chat template, ready for the assistant."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=False)
    return tokenizer(text, add_special_tokens=False).input_ids


class RLVRWorkflow:
    def __init__(self, tokenizer, reward: RewardService, params: SamplingParams):
        self.tokenizer, self.reward, self.params = tokenizer, reward, params

    async def run(self, item: dict, engine: Engine) -> TrajectoryGroup | None:
        prompt_ids = item.get("prompt_ids") or chat_prompt_ids(self.tokenizer, item["question"])
        completions = await engine.generate(prompt_ids, self.params)
        completions = [await self._resume_aborted(c, engine) for c in completions]
        trajectories = []
        for c in completions:
            text = self.tokenizer.decode(c.output_ids, skip_special_tokens=True)
            reward = await self.reward.ascore(item, text)
            trajectories.append(Trajectory(c.prompt_ids, c.output_ids, c.logprobs, c.versions, reward,
                                           c.finish_reason, text))
        return TrajectoryGroup(trajectories, item_id=item.get("id"))

    async def _resume_aborted(self, c: Completion, engine: Engine) -> Completion:
        """An update in 'abort' mode ends a request early: resubmit prompt + partial output and join."""
        while c.finish_reason == "abort" and len(c.output_ids) < self.params.max_new_tokens:
            rest = dataclasses.replace(self.params, n=1, max_new_tokens=self.params.max_new_tokens - len(c.output_ids))
            (more,) = await engine.generate(c.prompt_ids + c.output_ids, rest)
            c = Completion(c.prompt_ids, c.output_ids + more.output_ids, c.logprobs + more.logprobs,
                           c.versions + more.versions, more.finish_reason)
        if c.finish_reason == "abort":
            c = dataclasses.replace(c, finish_reason="length")
        return c
