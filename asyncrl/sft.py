"""Supervised fine-tuning on the task's references: loss on the answer tokens only.

Single-turn tasks (``arith``, files) train on (prompt, reference solution) pairs. Agentic tasks (``lookup``:
items carry a ``transcript``) train on whole multi-turn conversations, tokenised exactly as the agent proxy
sends them at RL time (:func:`asyncrl.agent.tasks.transcripts.transcript_ids`), with loss on the assistant
tokens only; their held-out accuracy runs the task's episode function (:mod:`asyncrl.agent.tasks.evaluate`).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import torch

from asyncrl import configlib
from asyncrl.config import SFTConfig
from asyncrl.configlib import ConfigError
from asyncrl.data import make_task
from asyncrl.data.config import TrainDatasetConfig, dataset_from_config, task_options
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


def sft_batch(examples: list[tuple[list[int], int | list[int]]], pad_id: int):
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
    agent = _agent_task(cfg, tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    params = SamplingParams(max_new_tokens=96, greedy=True, stop_token_ids=(tokenizer.eos_token_id,))
    model.train()
    t0, record = time.perf_counter(), {}
    for step in range(cfg.steps):
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(step, cfg.steps, cfg.lr, cfg.warmup_steps)
        items = _take(stream, cfg.batch_size)
        examples = ([agent.example(it) for it in items] if agent else
                    [sft_example(tokenizer, it["question"], it["solution"]) for it in items])
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
                if agent:
                    record.update(agent.evaluate(engine, valid, params, model.config.max_position_embeddings))
                else:
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


class _AgentTask:
    """An agentic built-in task: its transcripts tokenised as the proxy would, its episodes for evaluation."""

    def __init__(self, tokenizer, tools: list[dict] | None, episode: str):
        from asyncrl.agent.chat import ChatRenderer

        self.renderer = ChatRenderer(tokenizer, tokenizer.eos_token_id)
        self.tokenizer, self.tools, self.episode = tokenizer, tools, episode

    def example(self, item: dict) -> tuple[list[int], list[int]]:
        from asyncrl.agent.tasks.transcripts import transcript_ids

        return transcript_ids(self.renderer, item["transcript"], self.tools)

    def evaluate(self, engine, items: list[dict], params: SamplingParams, max_len: int) -> dict:
        from asyncrl.agent.tasks.evaluate import evaluate_agent

        return evaluate_agent(engine, self.tokenizer, items, self.episode, params, max_len)


def _agent_task(cfg: SFTConfig, tokenizer) -> _AgentTask | None:
    """The agentic task being fine-tuned on (one whose generator names its episode function), else None."""
    gen, _ = make_task(cfg.task.name, task_options(cfg.task))
    episode = getattr(gen, "episode", None)
    if not episode:
        return None
    tools = getattr(gen, "tools", None)
    if not _renders_tools(tokenizer, tools):
        raise ConfigError(f"model.path: task '{cfg.task.name}' trains on tool-use transcripts, and this model's chat "
                          "template does not show the tools (make the model with `asyncrl init-model --task "
                          f"{cfg.task.name}`)")
    return _AgentTask(tokenizer, tools, episode)


def _renders_tools(tokenizer, tools: list[dict] | None) -> bool:
    if not getattr(tokenizer, "chat_template", None):
        return False
    if not tools:
        return True
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=tools, tokenize=False)
    return all(t["function"]["name"] in text for t in tools)


def _take(stream, n: int) -> list[dict]:
    return [next(stream) for _ in range(n)]
