"""``asyncrl sft``: load the model and the data, train the steps with evaluations and step checkpoints, resume a
stopped run, save the model (and the best held-out one)."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import time
from pathlib import Path

import torch

from asyncrl import configlib
from asyncrl.commands.sft.agent import agent_task, scoring_engine
from asyncrl.commands.sft.examples import Examples, item_example, sft_batch
from asyncrl.commands.sft.loss import cosine_lr, micro_batch_losses
from asyncrl.commands.sft.state import (
    BEST_DIR,
    METRICS_FILE,
    best_before,
    evaluation_key,
    records,
    restore,
    resume_point,
    save_best,
    save_model,
    save_step,
    start_over,
)
from asyncrl.config import SFTConfig
from asyncrl.configlib import ConfigError
from asyncrl.data.config import dataset_from_config
from asyncrl.data.formats import item_prompt_ids, stop_ids
from asyncrl.loop.evaluate import evaluate
from asyncrl.loop.lock import RunDirLock
from asyncrl.loop.stop import StopAtStep, StopRequested
from asyncrl.models.hf import check_model_dir, load_model, load_tokenizer
from asyncrl.trainer.packing import check_packing
from asyncrl.types import SamplingParams

log = logging.getLogger(__name__)


def sft(cfg: SFTConfig) -> dict:
    torch.set_num_threads(cfg.actor.threads)
    torch.manual_seed(cfg.seed)
    model_path = check_model_dir(cfg.model.path)
    tokenizer, model = load_tokenizer(model_path), load_model(model_path)
    context = model.config.max_position_embeddings
    if cfg.pack:
        try:
            check_packing(model)
        except RuntimeError as e:
            raise ConfigError(f"pack: {str(e).replace('actor.pack_sequences=false', 'pack=false')}") from None
    # prompts need room for a target here; held-out ones for max_new_tokens (checked by _eval_items)
    data = dataset_from_config(
        cfg.task,
        dataclasses.replace(cfg.train_dataset, seed=cfg.seed),
        cfg.valid_dataset,
        tokenizer=tokenizer,
        default_max_prompt_tokens=context - 1,
    )
    agent = agent_task(cfg, tokenizer)
    build = (lambda item: (agent.example(item), 0)) if agent else (lambda item: item_example(tokenizer, item))
    examples = Examples(data.train, build, _max_length(cfg.max_length, context), data.stats, _source_key(cfg))
    score = (
        agent.scorer(data.valid, cfg.gconfig.max_new_tokens, context)
        if agent
        else _Scorer(cfg, tokenizer, data.valid, data.reward_fn, context)
    )
    lock = None
    try:
        try:
            out = Path(cfg.output_dir)  # created once the model and the data are known good
            try:
                out.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ConfigError(f"output: cannot create '{out}': {e.strerror or e}") from e
            lock = RunDirLock(out)  # a second sft of this directory is refused here
            start = resume_point(cfg, out)
            if start is None:
                start_over(out, cfg.model.path)
            configlib.dump(cfg, out / "sft_config.yaml")
            lora = cfg.model.lora.rank > 0
            if lora:
                from asyncrl.models.lora import apply_lora

                model = apply_lora(model, **dataclasses.asdict(cfg.model.lora))
            record = _train(
                cfg, model, tokenizer, examples, data.stats, score, _EngineModel(model, model_path, lora), out, start
            )
        finally:
            score.close()
        examples.summary()
        save_model(model, tokenizer, out, lora)
    finally:
        if lock is not None:
            lock.release()
    held_out = f", held-out accuracy {record['eval_accuracy']:.3f}" if "eval_accuracy" in record else ""
    log.info(
        "sft done: %d steps in %.0f s, loss %.4f%s; the model is in %s",
        record["step"],
        record["elapsed_s"],
        record["loss"],
        held_out,
        out,
    )
    best = best_before(out, record["step"] + 1)
    if best is not None:
        log.info(
            "the best held-out model (%.3f at step %d) is in %s", best["eval_accuracy"], best["step"], out / BEST_DIR
        )
    return record


def _train(
    cfg: SFTConfig,
    model,
    tokenizer,
    examples: "Examples",
    data_stats,
    score,
    engine_model,
    out: Path,
    start: Path | None = None,
) -> dict:
    """The optimizer steps, with evaluations, step checkpoints and a metrics record per step; the last record.
    From ``start`` (a step checkpoint): its weights, optimizer, data position and RNG, and the metrics up to it."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.actor.lr, betas=(0.9, 0.95), weight_decay=cfg.actor.weight_decay)
    first, t0, record = 1, time.perf_counter(), {}
    if start is not None:
        first = restore(start, model, optimizer, examples) + 1
        kept = [r for r in records(out / METRICS_FILE) if r.get("step", 0) < first]
        (out / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in kept))
        record = kept[-1] if kept else {}
        t0 -= float(record.get("elapsed_s", 0.0))
        log.info(
            "sft: resuming from %s (step %d of %d)%s; resume=fresh starts over",
            start,
            first - 1,
            cfg.total_train_steps,
            ": nothing left to train" if first > cfg.total_train_steps else "",
        )
    best = best_before(out, first, evaluation_key(cfg))
    best_accuracy = best["eval_accuracy"] if best else -math.inf
    model.train()
    bar = _progress_bar(cfg, first - 1)
    with StopAtStep() as stop, (out / METRICS_FILE).open("a" if start is not None else "w") as metrics:
        for step in range(first, cfg.total_train_steps + 1):
            lr = cosine_lr(step - 1, cfg.total_train_steps, cfg.actor.lr, cfg.actor.warmup_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch = examples.take(cfg.train_dataset.batch_size)
            input_ids, attention_mask, mask = sft_batch(batch, tokenizer.pad_token_id)
            optimizer.zero_grad(set_to_none=True)
            loss = 0.0
            for part in micro_batch_losses(model, input_ids, attention_mask, mask, pack_rows=cfg.pack):
                part.backward()
                loss += part.item()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            record = {
                "step": step,
                "loss": loss,
                "tokens": int(mask.sum()),
                "lr": lr,
                **examples.counts,
                **data_stats(),
                "elapsed_s": time.perf_counter() - t0,
            }
            if step == cfg.total_train_steps or (cfg.evaluator.freq_steps and step % cfg.evaluator.freq_steps == 0):
                model.eval()
                record.update(score(engine_model()))
                model.train()
                if record["eval_accuracy"] > best_accuracy:
                    best_accuracy = record["eval_accuracy"]
                    save_best(model, tokenizer, out, step, best_accuracy, engine_model.lora, evaluation_key(cfg))
                _say(
                    bar,
                    f"sft step {step} | loss {loss:.4f} | eval_acc {record['eval_accuracy']:.3f} | "
                    f"{record['elapsed_s']:.0f}s",
                )
            elif step % cfg.log_every == 0:
                _say(bar, f"sft step {step} | loss {loss:.4f} | {record['elapsed_s']:.0f}s")
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}")
            metrics.write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")
            metrics.flush()
            if stop.signum is not None or (cfg.saver.freq_steps and step % cfg.saver.freq_steps == 0):
                save_step(model, tokenizer, optimizer, examples, out, step, engine_model.lora, cfg.saver.keep_last)
            if stop.signum is not None and step < cfg.total_train_steps:  # Ctrl-C, SIGTERM: at this step's end
                stopped = StopRequested(stop.signum)
                stopped.checkpoint = str(out / f"step{step}")
                raise stopped
    if bar is not None:
        bar.close()
    return record


def _progress_bar(cfg: SFTConfig, done: int):
    """A tqdm bar on a terminal (progress_bar); None when the output goes to a file or a pipe."""
    if not (cfg.progress_bar and sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.total_train_steps, initial=done, desc="sft", unit="step", dynamic_ncols=True)


def _say(bar, line: str) -> None:
    if bar is None:
        log.info("%s", line)
    else:
        bar.write(line)


def _source_key(cfg: SFTConfig) -> str:
    """The config key (and value) the training examples come from, for errors."""
    if cfg.train_dataset.mixture:
        return "train_dataset.mixture"
    return f"train_dataset.path '{cfg.train_dataset.path}'" if cfg.train_dataset.path else f"task '{cfg.task.name}'"


def _max_length(configured: int, context: int) -> int:
    if configured > context:
        log.warning(
            "max_length=%d is more than the model's context of %d tokens; examples are limited to %d",
            configured,
            context,
            context,
        )
    return min(configured or context, context)


class _Scorer:
    """Held-out accuracy of single-turn and chat items: greedy answers of ``max_new_tokens`` scored by the reward
    service (``reward.fn``, else the data's own verifier)."""

    def __init__(self, cfg: SFTConfig, tokenizer, valid: list[dict], default_fn, context: int):
        from asyncrl.reward import build_reward_service
        from asyncrl.reward.math_reward import math_reward

        self.tokenizer, self.context = tokenizer, context
        self.items = _eval_items(valid, tokenizer, context - cfg.gconfig.max_new_tokens)
        self.params = SamplingParams(
            max_new_tokens=cfg.gconfig.max_new_tokens, greedy=True, stop_token_ids=stop_ids(tokenizer)
        )
        if not cfg.reward.fn and default_fn is math_reward and any(not it.get("answer") for it in self.items):
            log.warning(
                "some held-out items have no 'answer' for the default verifier, so they score 0 (counted in "
                "eval_reward_errors): give the rows an answer column or set reward.fn"
            )
        self.reward = build_reward_service(cfg.reward, default_fn)
        self.default, self.threshold = cfg.reward.default, cfg.evaluator.success_threshold

    def __call__(self, model) -> dict:
        longest = max(len(it["prompt_ids"]) for it in self.items)
        engine = scoring_engine(model, min(self.context, longest + self.params.max_new_tokens), len(self.items))
        first: list[Exception] = []

        def reward(prompt, completion, **fields):
            try:
                return self.reward.eval_fn(prompt, completion, **fields)
            except Exception as e:
                if not first:
                    first.append(e)
                raise

        try:
            record = evaluate(engine, self.tokenizer, self.items, reward, self.params, self.default, self.threshold)
        finally:
            engine.stop()
        if first and record["eval_reward_errors"] == record["eval_items"]:  # no accuracy to select a model by
            fields = sorted(k for k in self.items[0] if k != "prompt_ids")
            raise ConfigError(
                f"reward.fn: the reward failed on every one of the {record['eval_items']} held-out items, so the "
                f"accuracy would read 0 whatever the model learns ({first[0]}); the items have the fields {fields}"
            )
        return record

    def close(self) -> None:
        self.reward.close()


def _eval_items(valid: list[dict], tokenizer, max_prompt: int) -> list[dict]:
    """Held-out items with their prompt ids (a chat item's: every turn before its final assistant turn);
    prompts over ``max_prompt`` tokens are dropped with a warning."""
    items, dropped = [], 0
    for it in valid:
        it = {**it, "prompt_ids": item_prompt_ids(tokenizer, it)}
        if len(it["prompt_ids"]) > max_prompt:
            dropped += 1
            continue
        items.append(it)
    if dropped:
        log.warning(
            "evaluation: %d held-out prompt(s) are over %d tokens (the model's context minus "
            "max_new_tokens) and are not evaluated",
            dropped,
            max_prompt,
        )
    if not items:
        raise ConfigError(
            f"valid_dataset: every held-out prompt is longer than {max_prompt} tokens (the model's "
            "context minus max_new_tokens): lower max_new_tokens or give shorter held-out prompts"
        )
    return items


class _EngineModel:
    """The model an evaluation engine is built from: the trained model itself, or for a LoRA model its merged
    weights in a plain copy of the base model (loaded at the first evaluation, reused after)."""

    def __init__(self, model, model_path: str, lora: bool):
        self.model, self.model_path, self.lora, self.plain = model, model_path, lora, None

    def __call__(self):
        if not self.lora:
            return self.model
        from asyncrl.models.lora import merged_state_dict

        if self.plain is None:
            self.plain = load_model(self.model_path).eval()
        self.plain.load_state_dict(merged_state_dict(self.model))
        return self.plain


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")  # as metrics.jsonl writes them
    return value
