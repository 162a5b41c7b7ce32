"""Held-out evaluation: one answer per item from any engine, scored by a reward function.

``eval_accuracy`` is the fraction of items whose reward reaches ``success_threshold`` (1.0: a fully correct
answer under the usual 0/1 verifiers); ``eval_reward_mean`` is the plain mean reward. Items tagged with a
``source`` (a training mixture's held-out items, or a file's own ``source`` column) also get both per source:
``eval_accuracy/NAME``, ``eval_reward_mean/NAME``.
"""

from __future__ import annotations

import asyncio
import logging
import time

from asyncrl.engine.base import Engine
from asyncrl.reward import RewardFailure, call_reward
from asyncrl.reward.service import item_label
from asyncrl.types import SamplingParams, WeightUpdate
from asyncrl.data.formats import item_prompt_ids

log = logging.getLogger(__name__)


def evaluate(engine: Engine, tokenizer, items: list[dict], reward_fn, params: SamplingParams,
             default: float = 0.0, success_threshold: float = 1.0) -> dict:
    """Generate one answer per item with ``engine`` (started; this thread waits) and score it.

    Prompts are the items' ``prompt_ids`` where present, else the chat-formatted ``question`` (``tokenizer``
    must belong to the calling thread: fast tokenizers are not safe to share across threads). A failed score
    is counted in ``eval_reward_errors``, logged the first time, and scores the reward service's configured
    default (carried by :class:`RewardFailure` from ``RewardService.eval_fn``), else ``default``."""
    t0 = time.perf_counter()
    prompts = [item_prompt_ids(tokenizer, it) for it in items]
    results = asyncio.run(_generate_all(engine, prompts, params))
    scores, lengths, errors = [], [], 0
    for item, c in zip(items, results):
        text = tokenizer.decode(c.output_ids, skip_special_tokens=True)
        try:
            scores.append(call_reward(reward_fn, item, text))
        except Exception as e:  # noqa: BLE001 - counted; a failing reward never stops evaluation
            errors += 1
            scores.append(e.default if isinstance(e, RewardFailure) else default)
            if errors == 1:
                log.warning("evaluation: the reward of item %s failed (%s: %s); it scores %s, and further "
                            "failures are counted in eval_reward_errors", item_label(item), type(e).__name__, e,
                            scores[-1])
        lengths.append(len(c.output_ids))
    return {
        "eval_accuracy": sum(s >= success_threshold for s in scores) / len(scores),
        "eval_reward_mean": sum(scores) / len(scores),
        "eval_reward_errors": errors,
        "eval_len_mean": sum(lengths) / len(lengths),
        **by_source(items, scores, success_threshold),
        "eval_time_s": time.perf_counter() - t0,
    }


def by_source(items: list[dict], scores: list[float], success_threshold: float = 1.0) -> dict:
    """``eval_accuracy/NAME`` and ``eval_reward_mean/NAME`` for the items tagged with a ``source``."""
    per: dict[str, list[float]] = {}
    for item, score in zip(items, scores):
        if item.get("source") is not None:
            per.setdefault(str(item["source"]), []).append(score)
    out = {}
    for name, s in per.items():
        out[f"eval_accuracy/{name}"] = sum(x >= success_threshold for x in s) / len(s)
        out[f"eval_reward_mean/{name}"] = sum(s) / len(s)
    return out


async def _generate_all(engine: Engine, prompts: list[list[int]], params: SamplingParams):
    groups = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    return [g[0] for g in groups]


class Evaluator:
    """Held-out scores of the trainer's weights at a given version, on an engine of its own (so rollouts never
    wait for it, and every answer comes from exactly that version). ``score(engine) -> metrics`` evaluates:
    by default one answer per item scored by ``reward_fn`` (``evaluate``); an agent workflow runs its
    episodes instead."""

    def __init__(self, engine, weights, score):
        self.engine, self.weights, self.score = engine, weights, score
        self.installed: int | None = None  # the version this evaluator last gave its engine

    @classmethod
    def single_turn(cls, engine, weights, tokenizer, items: list[dict], reward_fn, params: SamplingParams,
                    success_threshold: float = 1.0) -> "Evaluator":
        evaluator = cls(engine, weights, lambda e: evaluate(e, tokenizer, items, reward_fn, params,
                                                            success_threshold=success_threshold))
        evaluator.tokenizer, evaluator.items = tokenizer, items
        return evaluator

    def __call__(self, version: int) -> dict:
        if version != self.installed:
            self.engine.update_weights(WeightUpdate(version, state_dict=self.weights()))
            self.installed = version
        return self.score(self.engine)
