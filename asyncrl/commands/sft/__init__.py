"""Supervised fine-tuning: loss on the target tokens only, on a built-in task or on the user's own data.

The examples come from the sources ``asyncrl train`` reads (``train_dataset.*``: the built-in task, a JSONL /
JSON / Parquet file or saved ``datasets`` directory with the same row formats and field mapping, a gym task):

- prompt + response: the item's ``question`` as one user turn under the chat template, then its target, the
  ``solution`` (GSM8K / MATH / qa rows; a ``response`` column is read as one), else the ``answer`` text, and
  the end-of-turn token; loss on the target. A row with neither (code without a solution) has nothing to
  train on: skipped and counted in ``sft_skipped_no_target``.
- chat (rows with ``messages``): the chat template renders the whole conversation once; loss on the assistant
  turns only, each its content plus the end-of-turn token (:func:`chat_example`).
- agentic built-in tasks (``lookup``: items carry a ``transcript``): whole multi-turn conversations, tokenised
  exactly as the agent proxy sends them at RL time (:func:`asyncrl.agent.tasks.transcripts.transcript_ids`),
  evaluated by running the task's episode function (:mod:`asyncrl.agent.tasks.evaluate`; :mod:`asyncrl.commands.sft.agent`).

Examples longer than ``max_length`` are skipped and counted (``sft_skipped_long``). A step's loss is the mean
over its target tokens, computed in micro-batches of at most ``MICRO_BATCH_TOKENS`` positions, packed side by
side (``pack``; :mod:`asyncrl.trainer.packing`) or padded: the same number either way (:func:`micro_batch_losses`).
Held-out answers are scored by ``reward.fn`` or the data's own verifier. ``OUTPUT/sft_metrics.jsonl`` holds a
record per step; checkpoints go to ``OUTPUT`` at the end, ``OUTPUT/stepN`` every ``saver.freq_steps`` steps and
``OUTPUT/best`` at each evaluation better than those before (with ``model.lora``: the adapter, and the merged model
in ``merged/`` beside it; see :mod:`asyncrl.models.lora`); a step checkpoint also holds ``sft_state.pt`` (trained weights,
optimizer, data position, RNG), from which the same command resumes a stopped run (``resume=auto``,
:mod:`asyncrl.commands.sft.state`) with the losses it would have had. The training stream is seeded by ``seed``
(``train_dataset.seed`` is not used) and steps take ``train_dataset.batch_size`` examples."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import torch

from asyncrl import configlib
from asyncrl.config import SFTConfig
from asyncrl.configlib import ConfigError
from asyncrl.data.config import dataset_from_config
from asyncrl.loop.evaluate import evaluate
from asyncrl.trainer.logprobs import logprobs_from_logits, token_logprobs
from asyncrl.models.hf import check_model_dir, load_model, load_tokenizer
from asyncrl.trainer.packing import check_packing, micro_batches, pack, packed_forward, plan_micro_batches, unpack
from asyncrl.types import SamplingParams
from asyncrl.data.formats import chat_prompt_ids, item_prompt_ids
from asyncrl.commands.sft.agent import agent_task, scoring_engine
from asyncrl.commands.sft.state import (BEST_DIR, best_before, evaluation_key, records, restore, resume_point, save_best,
                               save_model, save_step, start_over)

log = logging.getLogger(__name__)

MICRO_BATCH_TOKENS = 16_384  # positions (padding included) in one forward pass: bounds activation memory
MAX_SKIPS_IN_A_ROW = 10_000  # examples skipped in a row before a generated source is declared unusable
METRICS_FILE = "sft_metrics.jsonl"

Example = tuple[list[int], "int | list[int]"]  # (token ids, number of prompt tokens | 0/1 mask per token)


# ---- examples ------------------------------------------------------------------------------------------------
def sft_example(tokenizer, question: str, answer: str, prompt_ids: list[int] | None = None) -> tuple[list[int], int]:
    """(token ids of prompt + answer + eos, number of prompt tokens); ``prompt_ids`` if already tokenised."""
    prompt = prompt_ids or chat_prompt_ids(tokenizer, question)
    target = tokenizer(answer, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    return prompt + target, len(prompt)


def chat_example(tokenizer, messages: list[dict]) -> tuple[list[int], list[int], int]:
    """(token ids of the whole conversation under the chat template, a 0/1 mask of the tokens trained on, the
    number of assistant turns left untrained).

    An assistant turn's tokens are found by rendering prefixes of the conversation: they start where the
    render of the turns before it with the generation prompt ends, and end where the render up to and
    including it ends, less what the template writes after the end-of-turn token (ChatML's newline is the
    next turn's prompt, never generated). Both renders must be token prefixes of the whole; a turn for which
    they are not (a template that renders a turn differently once later turns follow, e.g. Qwen3 dropping the
    reasoning of earlier turns) is left untrained and counted, since its tokens are not what the model would
    generate."""
    ids = _render(tokenizer, messages, generation_prompt=False)
    mask = [0] * len(ids)
    eos, untrained = tokenizer.eos_token_id, 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or not (message.get("content") or message.get("tool_calls")):
            continue  # an assistant turn with only tool calls is trained too: calling the tool is the target
        if message.get("weight") == 0:  # marked not to learn (OpenAI's fine-tuning format)
            continue
        try:
            start = _render(tokenizer, messages[:i], generation_prompt=True)
            end = _render(tokenizer, messages[: i + 1], generation_prompt=False)
        except ValueError:
            untrained += 1
            continue
        a, b = len(start), len(end)
        if b <= a or ids[:a] != start or ids[:b] != end:
            untrained += 1
            continue
        span = ids[a:b]
        if eos in span:  # through the last end-of-turn token of the turn
            b = a + len(span) - span[::-1].index(eos)
        mask[a:b] = [1] * (b - a)
    return ids, mask, untrained


def _render(tokenizer, messages: list[dict], generation_prompt: bool) -> list[int]:
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
    except Exception as e:  # noqa: BLE001 - jinja raises many kinds for a chat it rejects
        raise ValueError(f"the chat template rejected the conversation ({type(e).__name__}: {e})") from e
    return tokenizer(text, add_special_tokens=False).input_ids


class NoTarget(ValueError):
    """An item with nothing to train on."""


def item_example(tokenizer, item: dict) -> tuple[Example, int]:
    """(the example of a prompt + response or chat item, assistant turns left untrained); NoTarget if it has
    nothing to train on."""
    if item.get("messages"):
        try:
            ids, mask, untrained = chat_example(tokenizer, item["messages"])
        except ValueError as e:
            raise NoTarget(str(e)) from None
        if not any(mask):
            raise NoTarget(f"none of its {untrained} assistant turn(s) is rendered by the chat template as it "
                           "is within the whole conversation")
        return (ids, mask), untrained
    target = item.get("solution") or item.get("answer")
    if target is None or not str(target).strip():
        raise NoTarget("no solution, response or answer text to train on")
    return sft_example(tokenizer, item["question"], str(target), item.get("prompt_ids")), 0


def sft_batch(examples: list[Example], pad_id: int):
    """Padded tensors of ``examples``: each (ids, number of prompt tokens) or (ids, 0/1 mask per token of the
    tokens trained on); the loss mask is over the predictions of tokens 1..T-1."""
    T = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(len(examples), T, dtype=torch.long)
    loss_mask = torch.zeros(len(examples), T - 1)
    for i, (ids, target) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention_mask[i, : len(ids)] = 1
        if isinstance(target, int):
            loss_mask[i, target - 1 : len(ids) - 1] = 1
        else:
            loss_mask[i, : len(ids) - 1] = torch.tensor(target[1:], dtype=loss_mask.dtype)
    return input_ids, attention_mask, loss_mask


# ---- the loss ------------------------------------------------------------------------------------------------
def micro_batch_losses(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor, *,
                       pack_rows: bool, max_tokens: int = MICRO_BATCH_TOKENS) -> Iterator[torch.Tensor]:
    """The mean negative log-likelihood of the target tokens of a padded batch (``sft_batch``), one term per
    micro-batch: their sum is the loss; back-propagate each as it comes, so that one micro-batch's activations
    are held at a time. A micro-batch computes at most ``max_tokens`` positions. With ``pack_rows`` its
    examples sit side by side in rows (position ids restarting, attention within each example:
    :mod:`asyncrl.trainer.packing`), otherwise each is padded to the longest; the terms are the same either way."""
    lengths = attention_mask.sum(-1).tolist()
    total = loss_mask.sum().clamp(min=1)
    if pack_rows:
        plan = plan_micro_batches(lengths, max_tokens)
    else:
        plan = [[[i] for i in mb] for mb in micro_batches(lengths, max_tokens)]
    for rows in plan:
        ids = [i for row in rows for i in row]
        T = max(lengths[i] for i in ids)
        sub = input_ids[ids, :T]  # (n, T)
        if pack_rows and any(len(row) > 1 for row in rows):
            local = {i: k for k, i in enumerate(ids)}
            packed = pack(sub, [lengths[i] for i in ids], [[local[i] for i in row] for row in rows])
            logits = packed_forward(model, packed).logits[:, :-1]  # (R, W-1, V)
            logp = unpack(logprobs_from_logits(logits, packed.input_ids[:, 1:])[0], packed)  # (n, T-1)
        else:
            logp, _ = token_logprobs(model, sub, attention_mask[ids, :T])  # (n, T-1)
        yield -(logp * loss_mask[ids, : T - 1]).sum() / total


def cosine_lr(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


# ---- the run -------------------------------------------------------------------------------------------------
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
    data = dataset_from_config(cfg.task, dataclasses.replace(cfg.train_dataset, seed=cfg.seed), cfg.valid_dataset,
                               tokenizer=tokenizer, default_max_prompt_tokens=context - 1)
    agent = agent_task(cfg, tokenizer)
    build = (lambda item: (agent.example(item), 0)) if agent else (lambda item: item_example(tokenizer, item))
    examples = _Examples(data.train, build, _max_length(cfg.max_length, context), data.stats, _source_key(cfg))
    score = (agent.scorer(data.valid, cfg.gconfig.max_new_tokens, context) if agent else
             _Scorer(cfg, tokenizer, data.valid, data.reward_fn, context))
    try:
        out = Path(cfg.output_dir)  # created once the model and the data are known good
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"output: cannot create '{out}': {e.strerror or e}") from e
        start = resume_point(cfg, out)
        if start is None:
            start_over(out, cfg.model.path)
        configlib.dump(cfg, out / "sft_config.yaml")
        lora = cfg.model.lora.rank > 0
        if lora:
            from asyncrl.models.lora import apply_lora

            model = apply_lora(model, **dataclasses.asdict(cfg.model.lora))
        record = _train(cfg, model, tokenizer, examples, data.stats, score,
                        _EngineModel(model, model_path, lora), out, start)
    finally:
        score.close()
    examples.summary()
    save_model(model, tokenizer, out, lora)
    held_out = f", held-out accuracy {record['eval_accuracy']:.3f}" if "eval_accuracy" in record else ""
    log.info("sft done: %d steps in %.0f s, loss %.4f%s; the model is in %s", record["step"], record["elapsed_s"],
             record["loss"], held_out, out)
    best = best_before(out, record["step"] + 1)
    if best is not None:
        log.info("the best held-out model (%.3f at step %d) is in %s", best["eval_accuracy"], best["step"],
                 out / BEST_DIR)
    return record


def _train(cfg: SFTConfig, model, tokenizer, examples: "_Examples", data_stats, score, engine_model, out: Path,
           start: Path | None = None) -> dict:
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
        log.info("sft: resuming from %s (step %d of %d)%s; resume=fresh starts over", start, first - 1,
                 cfg.total_train_steps, ": nothing left to train" if first > cfg.total_train_steps else "")
    best = best_before(out, first, evaluation_key(cfg))
    best_accuracy = best["eval_accuracy"] if best else -math.inf
    model.train()
    bar = _progress_bar(cfg, first - 1)
    with (out / METRICS_FILE).open("a" if start is not None else "w") as metrics:
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
            record = {"step": step, "loss": loss, "tokens": int(mask.sum()), "lr": lr, **examples.counts,
                      **data_stats(), "elapsed_s": time.perf_counter() - t0}
            if step == cfg.total_train_steps or (cfg.evaluator.freq_steps and step % cfg.evaluator.freq_steps == 0):
                model.eval()
                record.update(score(engine_model()))
                model.train()
                if record["eval_accuracy"] > best_accuracy:
                    best_accuracy = record["eval_accuracy"]
                    save_best(model, tokenizer, out, step, best_accuracy, engine_model.lora, evaluation_key(cfg))
                _say(bar, f"sft step {step} | loss {loss:.4f} | eval_acc {record['eval_accuracy']:.3f} | "
                          f"{record['elapsed_s']:.0f}s")
            elif step % cfg.log_every == 0:
                _say(bar, f"sft step {step} | loss {loss:.4f} | {record['elapsed_s']:.0f}s")
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}")
            metrics.write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")
            metrics.flush()
            if cfg.saver.freq_steps and step % cfg.saver.freq_steps == 0:
                save_step(model, tokenizer, optimizer, examples, out, step, engine_model.lora)
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
        log.warning("max_length=%d is more than the model's context of %d tokens; examples are limited to %d",
                    configured, context, context)
    return min(configured or context, context)


class _Examples:
    """Training examples from the item stream: items with nothing to train on and examples longer than
    ``max_length`` are skipped, counted and logged once each; a source that yields none is an error."""

    def __init__(self, items: Iterator[dict], build: Callable[[dict], tuple[Example, int]], max_length: int,
                 data_stats: Callable[[], dict], source: str):
        self.items, self.build, self.max_length, self.data_stats = items, build, max_length, data_stats
        self.source = source
        self.counts = {"sft_skipped_long": 0, "sft_skipped_no_target": 0, "sft_turns_untrained": 0}
        self.items_read = 0  # the data position

    def skip(self, n: int) -> None:
        """Pass over the ``n`` items a resumed run had read."""
        for _ in range(n):
            next(self.items)
        self.items_read += n

    def take(self, n: int) -> list[Example]:
        out, in_a_row, epoch = [], 0, self._epoch()
        while len(out) < n:
            item = next(self.items)
            self.items_read += 1
            try:
                example, untrained = self.build(item)
            except NoTarget as e:
                self._skip("sft_skipped_no_target", f"item {_name(item)} has nothing to train on: {e}")
            else:
                if untrained:
                    self._count("sft_turns_untrained", f"item {_name(item)}: {untrained} assistant turn(s) left "
                                "untrained, as the chat template renders them differently within the whole "
                                "conversation", untrained)
                if len(example[0]) <= self.max_length:
                    out.append(example)
                    in_a_row, epoch = 0, self._epoch()
                    continue
                self._skip("sft_skipped_long", f"an example of {len(example[0])} tokens is longer than max_length="
                           f"{self.max_length} (0 = the model's context)")
            in_a_row += 1
            if in_a_row >= MAX_SKIPS_IN_A_ROW or self._epoch() >= epoch + 2:  # a whole pass found nothing
                raise ConfigError(f"{self.source}: no usable training example in {in_a_row} items in a row "
                                  f"({self._counts_text()}): give rows a target (a solution / response or answer "
                                  "column, or chat messages ending with an assistant turn) or raise max_length")
        return out

    def _skip(self, key: str, message: str) -> None:
        self._count(key, message, 1)

    def _count(self, key: str, message: str, n: int) -> None:
        self.counts[key] += n
        if self.counts[key] == n:
            log.warning("%s; further ones are counted in %s (%s)", message, key, METRICS_FILE)

    def _epoch(self) -> int:
        return int(self.data_stats().get("data_epoch", 0))

    def _counts_text(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.counts.items() if v) or "none skipped"

    def summary(self) -> None:
        if any(self.counts.values()):
            log.warning("sft: %s", self._counts_text())


def _name(item: dict) -> str:
    ident = item.get("source_id", item.get("id"))
    question = str(item.get("question", ""))
    return f"{ident} ({question[:40]!r}{'...' if len(question) > 40 else ''})"


class _Scorer:
    """Held-out accuracy of single-turn and chat items: greedy answers of ``max_new_tokens`` scored by the reward
    service (``reward.fn``, else the data's own verifier)."""

    def __init__(self, cfg: SFTConfig, tokenizer, valid: list[dict], default_fn, context: int):
        from asyncrl.reward import build_reward_service
        from asyncrl.reward.math_reward import math_reward

        self.tokenizer, self.context = tokenizer, context
        self.items = _eval_items(valid, tokenizer, context - cfg.gconfig.max_new_tokens)
        self.params = SamplingParams(max_new_tokens=cfg.gconfig.max_new_tokens, greedy=True,
                                     stop_token_ids=(tokenizer.eos_token_id,))
        if not cfg.reward.fn and default_fn is math_reward and any(not it.get("answer") for it in self.items):
            log.warning("some held-out items have no 'answer' for the default verifier, so they score 0 (counted in "
                        "eval_reward_errors): give the rows an answer column or set reward.fn")
        self.reward = build_reward_service(cfg.reward, default_fn)
        self.default, self.threshold = cfg.reward.default, cfg.evaluator.success_threshold

    def __call__(self, model) -> dict:
        longest = max(len(it["prompt_ids"]) for it in self.items)
        engine = scoring_engine(model, min(self.context, longest + self.params.max_new_tokens), len(self.items))
        try:
            return evaluate(engine, self.tokenizer, self.items, self.reward.eval_fn, self.params, self.default,
                            self.threshold)
        finally:
            engine.stop()

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
        log.warning("evaluation: %d held-out prompt(s) are over %d tokens (the model's context minus "
                    "max_new_tokens) and are not evaluated", dropped, max_prompt)
    if not items:
        raise ConfigError(f"valid_dataset: every held-out prompt is longer than {max_prompt} tokens (the model's "
                          "context minus max_new_tokens): lower max_new_tokens or give shorter held-out prompts")
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
