"""Held-out accuracy of an agent task: every held-out item runs the task's own episode function (the one RL
trains with) through an agent proxy over an evaluation engine, with the evaluation's sampling (greedy by
default), and its return value is its score.

- :func:`evaluate_episodes` (async): items -> ``{"eval_accuracy", ...}`` through a given :class:`AgentProxy`;
- :func:`evaluate_agent`: the same from the calling thread with an engine and a tokenizer;
- :class:`AgentEvaluator`: ``evaluator(version) -> metrics`` like :class:`asyncrl.loop.evaluate.Evaluator` (installs
  the trainer's weights of that version on its own engine first), for the train loop.
"""

from __future__ import annotations

import asyncio
import logging
import time

from asyncrl.agent.chat import ChatRenderer
from asyncrl.agent.client import InProcessClient
from asyncrl.agent.proxy import AgentProxy
from asyncrl.agent.workflow import LATENCY_OPTIONS, outcome_score
from asyncrl.data.formats import stop_ids
from asyncrl.types import SamplingParams, WeightUpdate

log = logging.getLogger(__name__)


async def evaluate_episodes(
    proxy: AgentProxy,
    items: list[dict],
    episode_fn,
    *,
    options: dict | None = None,
    success_threshold: float = 1.0,
    client_factory=InProcessClient,
    timeout_s: float | None = None,
) -> dict:
    """Run ``episode_fn(client, item, **options)`` once per item, all at once, each with its own key on
    ``proxy`` (whose engine and sampling are the evaluation's) and a client from ``client_factory(proxy, key)``.

    The score of an item is the episode's return value (a number; for ``{completion_id: reward}`` the sum).
    An episode that raises or runs past ``timeout_s`` scores 0 and is counted in ``eval_episode_failures``
    (the first one logged). ``eval_accuracy`` is the fraction of items scoring at least ``success_threshold``."""
    options = dict(options or {})
    t0 = time.perf_counter()
    logged = []

    async def one(item: dict) -> tuple[float, bool, int, int]:
        key = proxy.open()
        failed = False
        try:
            run = episode_fn(client_factory(proxy, key), item, **options)
            outcome = await (asyncio.wait_for(run, timeout_s) if timeout_s else run)
            score = outcome_score(outcome)
        except Exception as e:  # noqa: BLE001 - counted; one failing episode never stops evaluation
            score, failed = 0.0, True
            if not logged:
                logged.append(e)
                log.warning(
                    "evaluation: the episode of item %s failed (%s: %s); it scores 0, and further "
                    "failures are counted in eval_episode_failures",
                    item.get("id"),
                    type(e).__name__,
                    e,
                )
        finally:
            episode = proxy.close(key)
        return score, failed, len(episode.calls), sum(len(c.output_ids) for c in episode.calls)

    results = await asyncio.gather(*(one(item) for item in items))
    n = max(1, len(results))
    return {
        "eval_accuracy": sum(s >= success_threshold for s, *_ in results) / n,
        "eval_reward_mean": sum(s for s, *_ in results) / n,
        "eval_episode_failures": sum(f for _, f, *_ in results),
        "eval_calls_mean": sum(c for *_, c, _ in results) / n,
        "eval_len_mean": sum(t for *_, t in results) / n,
        "eval_items": len(results),
        "eval_time_s": time.perf_counter() - t0,
    }


def make_proxy(engine, tokenizer, params: SamplingParams, max_len: int, tool_parser: str = "hermes") -> AgentProxy:
    """A proxy serving ``engine`` with ``params`` (``params.stop_token_ids[0]``, else the tokenizer's eos,
    ends assistant turns)."""
    stop = params.stop_token_ids[0] if params.stop_token_ids else tokenizer.eos_token_id
    return AgentProxy(ChatRenderer(tokenizer, stop), params, max_len, tool_parser=tool_parser, engine=engine)


def evaluate_agent(
    engine,
    tokenizer,
    items: list[dict],
    episode_fn,
    params: SamplingParams,
    max_len: int,
    *,
    options: dict | None = None,
    tool_parser: str = "hermes",
    success_threshold: float = 1.0,
    timeout_s: float | None = None,
) -> dict:
    """:func:`evaluate_episodes` from a thread without a running event loop (the trainer's, SFT's, a script's):
    ``engine`` started, ``tokenizer`` the calling thread's own, ``max_len`` the engine's context per sequence.
    Tool latency options are dropped (they only slow evaluation down)."""
    episode_fn = _resolve(episode_fn)
    options = {k: v for k, v in (options or {}).items() if k not in LATENCY_OPTIONS}
    proxy = make_proxy(engine, tokenizer, params, max_len, tool_parser)
    return asyncio.run(
        evaluate_episodes(
            proxy, items, episode_fn, options=options, success_threshold=success_threshold, timeout_s=timeout_s
        )
    )


class AgentEvaluator:
    """Held-out accuracy of the trainer's weights at a given version, by running the agent episodes on an
    engine of its own (a drop-in for :class:`asyncrl.loop.evaluate.Evaluator` when ``workflow.name`` is agent)."""

    def __init__(
        self,
        engine,
        tokenizer,
        items: list[dict],
        episode,
        params: SamplingParams,
        max_len: int,
        weights,
        *,
        options: dict | None = None,
        tool_parser: str = "hermes",
        success_threshold: float = 1.0,
        timeout_s: float | None = None,
    ):
        self.engine, self.tokenizer, self.items, self.episode_fn = engine, tokenizer, items, _resolve(episode)
        self.params, self.max_len, self.weights = params, max_len, weights
        self.options, self.tool_parser, self.success_threshold = dict(options or {}), tool_parser, success_threshold
        self.timeout_s = timeout_s
        self.installed: int | None = None

    def __call__(self, version: int) -> dict:
        if version != self.installed:
            self.engine.update_weights(WeightUpdate(version, state_dict=self.weights()))
            self.installed = version
        return evaluate_agent(
            self.engine,
            self.tokenizer,
            self.items,
            self.episode_fn,
            self.params,
            self.max_len,
            options=self.options,
            tool_parser=self.tool_parser,
            success_threshold=self.success_threshold,
            timeout_s=self.timeout_s,
        )


def _resolve(episode):
    if isinstance(episode, str):
        from asyncrl.agent.config import resolve_episode

        return resolve_episode(episode)
    return episode


def main(argv: list[str] | None = None) -> int:
    """``python -m asyncrl.agent.tasks.evaluate --model PATH``: held-out accuracy of a checkpoint on the lookup
    task, by running its episodes greedily through the in-process proxy (LocalEngine + AgentProxy +
    InProcessClient), as RL's evaluation would."""
    import argparse
    import json
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(prog="python -m asyncrl.agent.tasks.evaluate", description=main.__doc__)
    parser.add_argument("--model", default="builtin:tiny-agent")
    parser.add_argument("--task", default="lookup")
    parser.add_argument("--min-terms", type=int, default=2)
    parser.add_argument("--max-terms", type=int, default=3)
    parser.add_argument("--max-operand", type=int, default=9, help="largest number in a box (task.max_operand)")
    parser.add_argument("--size", type=int, default=200, help="held-out problems (valid_dataset.size)")
    parser.add_argument("--seed", type=int, default=10_000, help="held-out split seed (valid_dataset.seed)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--sample", action="store_true", help="sample at temperature 1 instead of greedy")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--show", type=int, default=0, help="print this many conversations")
    args = parser.parse_args(argv)

    import torch

    from asyncrl.data.datasets import make_task
    from asyncrl.engine.local import LocalEngine
    from asyncrl.models.hf import load_model, load_tokenizer

    torch.set_num_threads(args.threads)
    gen, _ = make_task(
        args.task, {"min_terms": args.min_terms, "max_terms": args.max_terms, "max_operand": args.max_operand}
    )
    items = gen.split(args.seed, args.size)
    tokenizer, model = load_tokenizer(args.model), load_model(args.model)
    max_len = min(model.config.max_position_embeddings, 1024)
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens, greedy=not args.sample, stop_token_ids=stop_ids(tokenizer)
    )
    engine = LocalEngine(model, max_slots=64, max_len=max_len, stop_token_ids=params.stop_token_ids).start()
    try:
        episode_fn = _resolve(gen.episode)
        if args.show:
            episode_fn = _showing(episode_fn, args.show)
        record = evaluate_agent(engine, tokenizer, items, episode_fn, params, max_len)
    finally:
        engine.stop()
    print(json.dumps({"model": args.model, "n": len(items), **record}))
    return 0


def _showing(episode_fn, n: int):
    """``episode_fn`` that prints the conversations of its first ``n`` items (their messages, via the client)."""
    shown = []

    async def run(client, item, **options):
        create = client.chat.completions.create
        last = {}

        async def recording(**kwargs):
            reply = await create(**kwargs)
            last["messages"] = list(kwargs["messages"]) + [reply.choices[0].message.model_dump(exclude_none=True)]
            return reply

        client.chat.completions.create = recording
        reward = await episode_fn(client, item, **options)
        if len(shown) < n:
            shown.append(item)
            print(f"--- {item['question']}  facts={item['facts']} answer={item['answer']} reward={reward}")
            for m in last.get("messages", [])[1:]:
                calls = [f"{c['function']['name']}({c['function']['arguments']})" for c in m.get("tool_calls", [])]
                print(f"  {m['role']}: {m.get('content')!r} {' '.join(calls)}")
        return reward

    return run


if __name__ == "__main__":
    raise SystemExit(main())
