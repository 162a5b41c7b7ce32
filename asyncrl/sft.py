"""Supervised fine-tuning on (prompt, reference solution) pairs: loss on the answer tokens only."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import torch

from asyncrl import configlib
from asyncrl.config import SFTConfig
from asyncrl.configlib import ConfigError
from asyncrl.data.config import TrainDatasetConfig, dataset_from_config
from asyncrl.engine.local import LocalEngine
from asyncrl.evaluate import evaluate
from asyncrl.logprobs import token_logprobs
from asyncrl.models import check_model_dir, load_model, load_tokenizer
from asyncrl.types import SamplingParams
from asyncrl.workflow.rlvr import chat_prompt_ids

log = logging.getLogger(__name__)


def sft_example(tokenizer, question: str, answer: str) -> tuple[list[int], int]:
    """(token ids of prompt + answer + eos, number of prompt tokens)."""
    prompt = chat_prompt_ids(tokenizer, question)
    target = tokenizer(answer, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    return prompt + target, len(prompt)


def sft_batch(examples: list[tuple[list[int], int]], pad_id: int):
    T = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(len(examples), T, dtype=torch.long)
    loss_mask = torch.zeros(len(examples), T - 1)
    for i, (ids, n_prompt) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention_mask[i, : len(ids)] = 1
        loss_mask[i, n_prompt - 1 : len(ids) - 1] = 1
    return input_ids, attention_mask, loss_mask


def cosine_lr(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def sft(cfg: SFTConfig) -> dict:
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    model_path = check_model_dir(cfg.model.path)
    tokenizer, model = load_tokenizer(model_path), load_model(model_path)
    data = dataset_from_config(cfg.task, TrainDatasetConfig(seed=cfg.seed), cfg.valid_dataset)
    out = Path(cfg.output)  # created once the model and the data are known good
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"output: cannot create '{out}': {e.strerror or e}") from e
    configlib.dump(cfg, out / "sft_config.yaml")
    valid, stream, reward_fn = data.valid, data.train, data.reward_fn
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    params = SamplingParams(max_new_tokens=96, greedy=True, stop_token_ids=(tokenizer.eos_token_id,))
    model.train()
    t0, record = time.perf_counter(), {}
    for step in range(cfg.steps):
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(step, cfg.steps, cfg.lr, cfg.warmup_steps)
        examples = [sft_example(tokenizer, it["question"], it["solution"]) for it in _take(stream, cfg.batch_size)]
        input_ids, attention_mask, mask = sft_batch(examples, tokenizer.pad_token_id)
        logp, _ = token_logprobs(model, input_ids, attention_mask)
        loss = -(logp * mask).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        record = {"step": step + 1, "loss": loss.item(), "elapsed_s": time.perf_counter() - t0}
        last = step + 1 == cfg.steps
        if last or (cfg.eval_every and (step + 1) % cfg.eval_every == 0):
            model.eval()
            engine = LocalEngine(model, max_slots=64, max_len=model.config.max_position_embeddings).start()
            try:
                record.update(evaluate(engine, tokenizer, valid, reward_fn, params))
            finally:
                engine.stop()
            model.train()
            log.info("sft step %d | loss %.4f | eval_acc %.3f | %.0fs", step + 1, record["loss"],
                     record["eval_accuracy"], record["elapsed_s"])
        elif (step + 1) % 50 == 0:
            log.info("sft step %d | loss %.4f | %.0fs", step + 1, record["loss"], record["elapsed_s"])
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return record


def _take(stream, n: int) -> list[dict]:
    return [next(stream) for _ in range(n)]
