"""``asyncrl rm``: train a reward model from preference pairs, for ``reward.model`` (docs/rewards.md).

Rows are ``{"prompt", "chosen", "rejected"}`` (``question`` for ``prompt`` too). The model is the given causal LM's
trunk with a new score head of one output (``AutoModelForSequenceClassification``); it reads
``pair_text(prompt, response)`` (asyncrl/reward/model.py: what ``reward.model`` scores) and is trained with the
Bradley–Terry loss ``-log sigmoid(r(chosen) - r(rejected))``. Held-out pairwise accuracy (the share of pairs
ranked right) and the mean margin are logged to ``OUTPUT_DIR/rm_metrics.jsonl``; the model and its tokenizer
are saved to ``OUTPUT_DIR``.
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path

import torch

from asyncrl.commands.sft.loss import cosine_lr
from asyncrl.config import RMConfig
from asyncrl.configlib import ConfigError
from asyncrl.data.sources import RowError, json_lines
from asyncrl.loop.lock import RunDirLock
from asyncrl.models.hf import resolve_model_path
from asyncrl.reward.model import load_reward_model, pair_text, scores

log = logging.getLogger(__name__)

Pair = tuple[str, str, str]  # (prompt, chosen, rejected)


def read_pairs(path: str) -> list[Pair]:
    """The preference pairs of a JSON Lines file (or a JSON array), read as the datasets are
    (asyncrl.data.sources: UTF-8 with or without a byte-order mark, lines split at newline only); a bad line is a
    ConfigError naming the file, the line and what is wrong with it."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"train_dataset.path: no file '{path}' (asyncrl rm reads JSONL preference pairs)")
    try:
        raw = file.read_bytes()
    except OSError as e:
        raise ConfigError(f"train_dataset.path: cannot read '{path}' ({e.strerror or e})") from None
    pairs = []
    for parsed in json_lines(file, raw):
        if isinstance(parsed, RowError):
            raise ConfigError(str(parsed))
        row = parsed.data
        if not isinstance(row, dict):
            raise ConfigError(f"{parsed.where}: not a JSON object")
        prompt = row.get("prompt", row.get("question"))
        missing = [
            k
            for k, v in (("prompt", prompt), ("chosen", row.get("chosen")), ("rejected", row.get("rejected")))
            if not isinstance(v, str)
        ]
        if missing:
            raise ConfigError(
                f"{parsed.where}: a preference pair needs the text fields prompt (or question), chosen "
                f"and rejected; missing or not text: {', '.join(missing)}"
            )
        pairs.append((prompt, row["chosen"], row["rejected"]))
    if not pairs:
        raise ConfigError(f"train_dataset.path: '{path}' holds no pairs")
    return pairs


def split_pairs(cfg: RMConfig) -> tuple[list[Pair], list[Pair]]:
    """(training pairs, held-out pairs): the valid file's, else up to ``valid_dataset.size`` (at most a fifth)
    held out of the training file, never trained on."""
    pairs = read_pairs(cfg.train_dataset.path)
    if cfg.valid_dataset.path:
        return pairs, read_pairs(cfg.valid_dataset.path)[: cfg.valid_dataset.size or None]
    order = list(range(len(pairs)))
    random.Random(cfg.seed).shuffle(order)
    held = min(cfg.valid_dataset.size, len(pairs) // 5)
    return [pairs[i] for i in order[held:]], [pairs[i] for i in order[:held]]


def bradley_terry(model, tokenizer, batch: list[Pair], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, margins r(chosen) - r(rejected)) of a batch: chosen and rejected scored in one pass."""
    texts = [pair_text(p, c) for p, c, _ in batch] + [pair_text(p, r) for p, _, r in batch]
    r = scores(model, tokenizer, texts, max_length)
    margin = r[: len(batch)] - r[len(batch) :]
    return -torch.nn.functional.logsigmoid(margin).mean(), margin


def evaluate_pairs(model, tokenizer, pairs: list[Pair], max_length: int, batch_size: int = 32) -> dict:
    """Held-out pairwise accuracy (chosen scored above rejected) and mean margin."""
    if not pairs:
        return {}
    model.eval()
    margins = []
    with torch.no_grad():
        for i in range(0, len(pairs), batch_size):
            margins += bradley_terry(model, tokenizer, pairs[i : i + batch_size], max_length)[1].tolist()
    model.train()
    return {
        "eval_pair_accuracy": sum(m > 0 for m in margins) / len(margins),
        "eval_margin_mean": sum(margins) / len(margins),
    }


def check_output(out: Path, model_path: str) -> None:
    """Refuse (ConfigError) an ``output_dir`` whose model saving the reward model would overwrite: the model to
    train from, or one that ``asyncrl rm`` did not write (a policy checkpoint, an SFT output). An earlier rm
    output there (``rm_metrics.jsonl`` beside its model) is replaced, as a rerun of the command expects."""
    target = out.resolve()
    source = Path(model_path).resolve() if model_path and Path(model_path).exists() else None
    if source is not None and (source == target or target in source.parents):
        raise ConfigError(
            f"output_dir '{out}' holds the model to train from (model.path={model_path}): saving the reward model "
            "there would overwrite it; give the reward model its own output_dir"
        )
    model_files = [n for n in ("config.json", "model.safetensors", "pytorch_model.bin") if (out / n).exists()]
    if model_files and not (out / "rm_metrics.jsonl").exists():
        raise ConfigError(
            f"output_dir '{out}' holds a model that asyncrl rm did not write ({model_files[0]}, no "
            "rm_metrics.jsonl): saving the reward model there would overwrite it; give it its own output_dir"
        )


def rm(cfg: RMConfig) -> dict:
    """Train, evaluate and save a reward model; returns the last record."""
    cfg.validate()
    check_output(Path(cfg.output_dir), str(cfg.model.path))
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.actor.threads)
    train, valid = split_pairs(cfg)
    tokenizer, model = load_reward_model(resolve_model_path(cfg.model.path), key="model.path", trained=False)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.actor.lr, weight_decay=cfg.actor.weight_decay)
    out = Path(cfg.output_dir)
    lock = RunDirLock(out)  # a second rm of this directory is refused here
    try:
        out.mkdir(parents=True, exist_ok=True)
        return _train(cfg, model, tokenizer, optimizer, train, valid, out)
    finally:
        lock.release()


def _train(cfg: RMConfig, model, tokenizer, optimizer, train: list, valid: list, out: Path) -> dict:
    metrics = (out / "rm_metrics.jsonl").open("w")
    log.info("asyncrl rm: %d training pairs, %d held out, from %s", len(train), len(valid), cfg.model.path)
    rng, order, t0 = random.Random(cfg.seed), [], time.perf_counter()
    record = {"step": 0, **evaluate_pairs(model, tokenizer, valid, cfg.max_length)}
    _log(metrics, record)
    n = cfg.train_dataset.batch_size
    for step in range(1, cfg.total_train_steps + 1):
        if len(order) < n:  # epochs of the pairs, each shuffled
            more = list(range(len(train)))
            rng.shuffle(more)
            order += more
        batch, order = [train[i] for i in order[:n]], order[n:]
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(step - 1, cfg.total_train_steps, cfg.actor.lr, cfg.actor.warmup_steps)
        loss, margin = bradley_terry(model, tokenizer, batch, cfg.max_length)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        record = {
            "step": step,
            "loss": float(loss.detach()),
            "pair_accuracy": float((margin > 0).float().mean()),
            "elapsed_s": time.perf_counter() - t0,
        }
        if step == cfg.total_train_steps or (cfg.evaluator.freq_steps and step % cfg.evaluator.freq_steps == 0):
            record.update(evaluate_pairs(model, tokenizer, valid, cfg.max_length))
        _log(metrics, record, console=step % cfg.log_every == 0 or "eval_pair_accuracy" in record)
    metrics.close()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    log.info("asyncrl rm: saved the reward model to %s (reward.model=%s)", out, out)
    return {**record, "output_dir": str(out)}


def _log(metrics, record: dict, console: bool = True) -> None:
    metrics.write(json.dumps(record) + "\n")
    metrics.flush()
    if not console:
        return
    parts = [f"step {record['step']}"] + [
        f"{k} {v:.4g}" for k, v in record.items() if k not in ("step", "elapsed_s") and isinstance(v, float)
    ]
    log.info("rm: %s", ", ".join(parts))
