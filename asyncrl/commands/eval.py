"""``asyncrl eval``: n answers per held-out prompt, each scored by a reward function, summarised as pass@k and
mean@n, with every item's answers written to a JSONL file.

A sample succeeds when its reward reaches ``evaluator.success_threshold`` (``SUCCESS_THRESHOLD``, 1.0, by default:
a fully correct answer under the usual 0/1 verifiers). With c successes
among the n samples of a prompt, pass@k is the unbiased estimate 1 - C(n-c, k) / C(n, k) of "one of k samples
succeeds" (Chen et al. 2021, the Codex paper), averaged over prompts; mean@n is the prompt's mean reward over
its n samples, averaged over prompts. ``eval_accuracy`` (kept from the one-answer evaluation) is pass@1, the
fraction of successful samples, so with n_samples=1 it is exactly the share of items answered correctly.

Sampled answers are reproducible: item i draws with the seed ``derive_seed(seed, i)`` (the engine's
counter-based draws), so the same checkpoint, data and seed give the same answers however the engine batches.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from asyncrl.configlib import ConfigError
from asyncrl.data.formats import item_prompt_ids, stop_ids
from asyncrl.engine.sampling import derive_seed
from asyncrl.reward import RewardFailure, call_reward
from asyncrl.types import Completion, SamplingParams

log = logging.getLogger(__name__)

SUCCESS_THRESHOLD = 1.0
MIN_ENGINE_SLOTS = 64


def check_sampling(n_samples: int, ks: list[int], greedy: bool, temperature: float, top_p: float) -> None:
    """A ConfigError, in one line naming the keys, for settings that cannot give the metrics asked for."""
    if n_samples < 1:
        raise ConfigError(f"gconfig.n_samples must be >= 1, got {n_samples}")
    if greedy and n_samples > 1:
        raise ConfigError(
            f"gconfig.n_samples={n_samples} with evaluator.greedy=true gives {n_samples} identical "
            "answers: set evaluator.greedy=false to sample them (at gconfig.temperature), or "
            "gconfig.n_samples=1"
        )
    if not isinstance(ks, (list, tuple)) or not ks:
        raise ConfigError(f"k must be a list of integers such as [1, 4], got {ks!r}")
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n_samples:
            raise ConfigError(
                f"k: each k of pass@k must be an integer with 1 <= k <= gconfig.n_samples ({n_samples}), "
                f"got {k!r} in {list(ks)}"
            )
    if not greedy and not (math.isfinite(temperature) and temperature > 0):
        raise ConfigError(f"gconfig.temperature must be > 0 when sampling (evaluator.greedy=false), got {temperature}")
    if not 0 < top_p <= 1:
        raise ConfigError(f"gconfig.top_p must be in (0, 1], got {top_p}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``c`` successes among ``n`` samples: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


# ---- generation and scoring (plain arguments; usable with any engine) ---------------------------------------
def generate_groups(
    engine, tokenizer, items: list[dict], params: SamplingParams, seed: int | None = None
) -> list[list[Completion]]:
    """``params.n`` completions per item from ``engine`` (started; this thread waits). Prompts are the items'
    ``prompt_ids`` where present, else the chat-formatted ``question``; with ``seed``, item i samples with
    ``derive_seed(seed, i)``."""
    prompts = [item_prompt_ids(tokenizer, it) for it in items]
    per_item = [
        params if seed is None or params.greedy else replace(params, seed=derive_seed(seed, i))
        for i in range(len(items))
    ]

    async def all_groups():
        return await asyncio.gather(*(engine.generate(p, q) for p, q in zip(prompts, per_item)))

    return list(asyncio.run(all_groups()))


def score_groups(
    reward_fn, items: list[dict], texts: list[list[str]], default: float = 0.0, threads: int = 1
) -> tuple[list[list[float]], list[list[str | None]]]:
    """The reward of every text of every item, and per text the error that replaced it (None when scored).

    A failed score takes the default carried by :class:`RewardFailure` (the reward service's ``eval_fn``),
    else ``default``; the first failure is logged. ``threads`` > 1 scores side by side (for a reward service
    with worker processes)."""
    jobs = [(i, j) for i, group in enumerate(texts) for j in range(len(group))]

    def one(job):
        i, j = job
        try:
            return call_reward(reward_fn, items[i], texts[i][j]), None
        except Exception as e:  # noqa: BLE001 - counted; a failing reward never stops evaluation
            return (e.default if isinstance(e, RewardFailure) else default), f"{type(e).__name__}: {e}"

    with ThreadPoolExecutor(max(1, threads)) as pool:
        results = list(pool.map(one, jobs))
    rewards = [[0.0] * len(group) for group in texts]
    errors: list[list[str | None]] = [[None] * len(group) for group in texts]
    for (i, j), (value, error) in zip(jobs, results):
        rewards[i][j], errors[i][j] = value, error
    first = next(((i, e) for i, row in enumerate(errors) for e in row if e), None)
    if first:
        log.warning(
            "evaluation: the reward of item %d failed (%s); it scores the default, and further failures "
            "are counted in eval_reward_errors",
            first[0],
            first[1],
        )
    return rewards, errors


def summarize(rewards: list[list[float]], ks: list[int], threshold: float = SUCCESS_THRESHOLD) -> dict:
    """pass@k for each k and mean@n over prompts (every prompt has the same n samples)."""
    n = len(rewards[0])
    correct = [sum(r >= threshold for r in group) for group in rewards]
    means = [sum(group) / len(group) for group in rewards]
    out = {f"pass@{k}": sum(pass_at_k(n, c, k) for c in correct) / len(rewards) for k in sorted(set(ks))}
    out[f"mean@{n}"] = sum(means) / len(means)
    out["eval_accuracy"] = sum(correct) / (n * len(rewards))  # = pass@1
    out["eval_reward_mean"] = out[f"mean@{n}"]
    return out


def _by_source(items: list[dict], rewards: list[list[float]], threshold: float) -> dict:
    """eval_accuracy/NAME and eval_reward_mean/NAME over the samples of the items tagged with a ``source``, as
    the trainer's evaluation reports them."""
    from asyncrl.loop.evaluate import by_source

    return by_source(
        [it for it, group in zip(items, rewards) for _ in group], [r for g in rewards for r in g], threshold
    )


def item_records(
    items: list[dict],
    texts: list[list[str]],
    rewards: list[list[float]],
    errors: list[list[str | None]],
    ks: list[int],
    finish: list[list[str]],
    threshold: float = SUCCESS_THRESHOLD,
) -> list[dict]:
    """One JSON-ready record per item: its index, id, question, answer, completions, rewards and pass@k."""
    records = []
    for i, item in enumerate(items):
        n, c = len(rewards[i]), sum(r >= threshold for r in rewards[i])
        record = {"index": i}
        item_id = item.get("source_id", item.get("id"))
        if item_id is not None:
            record["id"] = item_id
        record["question"] = item["question"]
        if "answer" in item:
            record["answer"] = item["answer"]
        if item.get("source") is not None:
            record["source"] = item["source"]
        record |= {
            "completions": texts[i],
            "rewards": rewards[i],
            "finish_reasons": finish[i],
            "n_correct": c,
            **{f"pass@{k}": pass_at_k(n, c, k) for k in sorted(set(ks))},
        }
        failed = [e for e in errors[i] if e]
        if failed:
            record["reward_errors"] = failed
        records.append(record)
    return records


def write_jsonl(path: str, records: list[dict]) -> None:
    """``records`` as JSON Lines at ``path`` (its directory created), replaced whole once complete."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        os.replace(tmp, target)
    except OSError as e:
        raise ConfigError(f"output: cannot write '{path}' ({e.strerror or e})") from None


# ---- the command ------------------------------------------------------------------------------------------
def run_eval(cfg) -> dict:
    """Evaluate ``cfg.model.path`` (a checkpoint directory, or a LoRA adapter directory: base + adapter merged)
    on the held-out items of ``cfg``; returns the summary record."""
    import torch

    from asyncrl.data.config import eval_set_from_config
    from asyncrl.engine.config import builtin_context
    from asyncrl.engine.local import LocalEngine
    from asyncrl.models.hf import DTYPES, load_checkpoint
    from asyncrl.reward import build_reward_service

    check_sampling(cfg.gconfig.n_samples, cfg.k, cfg.evaluator.greedy, cfg.gconfig.temperature, cfg.gconfig.top_p)
    if cfg.model.dtype not in DTYPES:
        raise ConfigError(f"model.dtype must be one of {list(DTYPES)}, got '{cfg.model.dtype}'")
    if cfg.model.lora.enabled:
        log.info("model.lora is ignored by eval: an adapter directory in model.path carries its own config")
    torch.set_num_threads(cfg.threads)
    tokenizer, model = load_checkpoint(cfg.model.path)
    max_len = builtin_context(model.config.max_position_embeddings, cfg.gconfig.max_new_tokens)  # as in training
    room = max_len - cfg.gconfig.max_new_tokens  # prompt tokens that fit beside a full answer
    if (cfg.train_dataset.max_prompt_tokens or 0) > room:
        raise ConfigError(
            f"train_dataset.max_prompt_tokens={cfg.train_dataset.max_prompt_tokens} exceeds the {room} "
            f"tokens a prompt can have beside gconfig.max_new_tokens={cfg.gconfig.max_new_tokens} in "
            f"the engine's context of {max_len}; lower it or leave it unset"
        )
    items, default_fn, skipped = eval_set_from_config(
        cfg.task, cfg.valid_dataset, cfg.train_dataset, tokenizer=tokenizer, default_max_prompt_tokens=room
    )
    if any(skipped.values()):
        log.warning(
            "evaluating %d items; rows skipped: %d malformed (data_bad_rows), %d with a prompt over %d "
            "tokens (data_skipped_long)",
            len(items),
            skipped["data_bad_rows"],
            skipped["data_skipped_long"],
            cfg.train_dataset.max_prompt_tokens or room,
        )
    try:
        engine = LocalEngine(
            model,
            max_slots=max(MIN_ENGINE_SLOTS, cfg.gconfig.n_samples),
            max_len=max_len,
            dtype=DTYPES[cfg.model.dtype],
            seed=cfg.seed,
            threads=cfg.threads,
        )
    except ValueError as e:  # a model shape the built-in engine does not run
        raise ConfigError(f"model.path: {e}") from e
    g = cfg.gconfig
    params = SamplingParams(
        n=g.n_samples,
        max_new_tokens=g.max_new_tokens,
        greedy=cfg.evaluator.greedy,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=g.top_k,
        stop_token_ids=stop_ids(tokenizer),
    )
    reward = build_reward_service(cfg.reward, default_fn)
    t0 = time.perf_counter()
    try:
        engine.start()
        groups = generate_groups(engine, tokenizer, items, params, seed=cfg.seed)
        engine.stop()
        texts = [[tokenizer.decode(c.output_ids, skip_special_tokens=True) for c in g] for g in groups]
        rewards, errors = score_groups(
            reward.eval_fn, items, texts, cfg.reward.default, threads=max(1, cfg.reward.workers)
        )
    finally:
        engine.stop()
        reward.close()
    lengths = [len(c.output_ids) for g in groups for c in g]
    threshold = cfg.evaluator.success_threshold
    record = {
        "model": cfg.model.path,
        "n": len(items),
        "n_samples": cfg.gconfig.n_samples,
        **summarize(rewards, cfg.k, threshold),
        "eval_reward_errors": sum(e is not None for row in errors for e in row),
        "eval_len_mean": sum(lengths) / len(lengths),
        **_by_source(items, rewards, threshold),
        "eval_time_s": time.perf_counter() - t0,
        **skipped,
    }
    if cfg.output:
        write_jsonl(
            cfg.output,
            item_records(
                items, texts, rewards, errors, cfg.k, [[c.finish_reason for c in g] for g in groups], threshold
            ),
        )
        record["output"] = cfg.output
        log.info("wrote the answers to %d items to %s", len(items), cfg.output)
    return record
