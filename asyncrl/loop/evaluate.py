"""Held-out evaluation: one answer per item from any engine, scored by a reward function.

``eval_accuracy`` is the fraction of items whose reward reaches ``success_threshold`` (1.0: a fully correct
answer under the usual 0/1 verifiers); ``eval_reward_mean`` is the plain mean reward. Items tagged with a
``source`` (a training mixture's held-out items, or a file's own ``source`` column) also get both per source:
``eval_accuracy/NAME``, ``eval_reward_mean/NAME``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from asyncrl.api.engine import Engine, InlineGenerating
from asyncrl.data.formats import item_prompt_ids
from asyncrl.reward import RewardFailure, call_reward
from asyncrl.reward.service import item_label
from asyncrl.types import SamplingParams, WeightUpdate

log = logging.getLogger(__name__)


def evaluate(
    engine: Engine,
    tokenizer,
    items: list[dict],
    reward_fn,
    params: SamplingParams,
    default: float = 0.0,
    success_threshold: float = 1.0,
) -> dict:
    """Generate one answer per item with ``engine`` (started: this thread waits; a local engine not started
    generates in this thread, on its torch threads) and score it.

    Prompts are the items' ``prompt_ids`` where present, else the chat-formatted ``question`` (``tokenizer``
    must belong to the calling thread: fast tokenizers are not safe to share across threads). A failed score
    is counted in ``eval_reward_errors``, logged the first time, and scores the reward service's configured
    default (carried by :class:`RewardFailure` from ``RewardService.eval_fn``), else ``default``."""
    t0 = time.perf_counter()
    prompts = [item_prompt_ids(tokenizer, it) for it in items]
    if isinstance(engine, InlineGenerating) and not engine.started:
        results = [group[0] for group in engine.generate_batch(prompts, params)]
    else:
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
                log.warning(
                    "evaluation: the reward of item %s failed (%s: %s); it scores %s, and further "
                    "failures are counted in eval_reward_errors",
                    item_label(item),
                    type(e).__name__,
                    e,
                    scores[-1],
                )
        lengths.append(len(c.output_ids))
    return {
        "eval_accuracy": sum(s >= success_threshold for s in scores) / len(scores),
        "eval_reward_mean": sum(scores) / len(scores),
        "eval_reward_errors": errors,
        "eval_len_mean": sum(lengths) / len(lengths),
        "eval_items": len(scores),
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
    def single_turn(
        cls,
        engine,
        weights,
        tokenizer,
        items: list[dict],
        reward_fn,
        params: SamplingParams,
        success_threshold: float = 1.0,
    ) -> "Evaluator":
        evaluator = cls(
            engine,
            weights,
            lambda e: evaluate(e, tokenizer, items, reward_fn, params, success_threshold=success_threshold),
        )
        evaluator.tokenizer, evaluator.items = tokenizer, items
        return evaluator

    def __call__(self, version: int) -> dict:
        self.install(version)
        return self.score(self.engine)

    def install(self, version: int) -> None:
        """The trainer's weights now, as ``version``, into this evaluator's engine (which copies them)."""
        if version != self.installed:
            self.engine.update_weights(WeightUpdate(version, state_dict=self.weights()))
            self.installed = version


class BackgroundEvaluator:
    """Evaluations beside training (``evaluator.background``): ``start(version)`` puts that version's weights
    into the evaluator's own engine now (a copy: training goes on without changing them) and scores in a thread
    of its own; ``finished()`` hands back ``(version, elapsed_s, metrics)`` of an evaluation that ended, for the
    log. One at a time: ``start`` waits for the one before (whose result ``finished`` still hands back). The
    evaluator must own its tokenizer (fast tokenizers are not shared across threads)."""

    def __init__(self, evaluator: Evaluator):
        self.evaluator = evaluator
        self._thread: threading.Thread | None = None
        self._done: list[tuple[int, float, dict]] = []
        self._lock = threading.Lock()
        self._failed: BaseException | None = None

    def start(self, version: int, elapsed_s: float) -> None:
        self._join()
        self.evaluator.install(version)
        self._thread = threading.Thread(
            target=self._score, args=(version, elapsed_s), daemon=True, name=f"evaluation-{version}"
        )
        self._thread.start()

    def finished(self, wait: bool = False) -> list[tuple[int, float, dict]]:
        """The evaluations that ended since the last call (with ``wait``: after the one running ends); an
        evaluation that failed raises here."""
        if wait or (self._thread is not None and not self._thread.is_alive()):
            self._join()
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed
        with self._lock:
            done, self._done = self._done, []
        return done

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _score(self, version: int, elapsed_s: float) -> None:
        try:
            metrics = self.evaluator.score(self.evaluator.engine)
            with self._lock:
                self._done.append((version, elapsed_s, metrics))
        except BaseException as e:  # noqa: BLE001 - handed to the trainer thread by finished()
            self._failed = e
