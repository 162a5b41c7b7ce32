"""Reward models: a sequence-classification checkpoint (``AutoModelForSequenceClassification``, one logit) scores
(prompt, response) pairs (``reward.model``; ``asyncrl rm`` trains one from preference pairs; docs/rewards.md).

The model lives in the run's process, on its own device (``reward.model_device``), loaded once. Calls come from
the reward service's threads, one per sample as its group finishes generating; a scoring thread takes whatever
calls are waiting (up to ``batch_size``) and scores them in one forward pass, so samples that finish together
are scored together while the engine generates the rest. The reward is the model's raw score (a Bradley–Terry
logit: only differences mean something, which group-normalised advantages use), optionally mixed with the
verifiable reward (``reward.model_weight``).
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from asyncrl.reward.base import as_reward

SEPARATOR = "\n"


def pair_text(prompt: str, response: str) -> str:
    """The text a reward model reads for a (prompt, response): what ``asyncrl rm`` trains on and
    ``reward.model`` scores."""
    return f"{prompt}{SEPARATOR}{response}"


def load_reward_model(path: str, device: str = "cpu", key: str = "reward.model", trained: bool = True):
    """(tokenizer, model) of a sequence-classification checkpoint with one output, padding on the right; with
    ``trained`` False also from a causal LM checkpoint, its trunk with a new score head (what ``asyncrl rm`` starts
    from; scoring with that untrained head would reward noise, so it is refused otherwise). ``path`` is a
    directory (``asyncrl.models.hf.resolve_model_path`` resolves other names)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from asyncrl.configlib import ConfigError

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"reward.model_device={device}: this machine has no CUDA device (use cpu)")
    local = path.startswith(("/", ".", "~")) or path.count("/") > 1  # a hub name is NAME or OWNER/NAME
    if local and not Path(path).expanduser().is_dir():
        raise ConfigError(
            f"{key}: '{path}' is not a directory (reward models are never downloaded: give the output_dir of "
            "asyncrl rm, or a hub name already in the local cache)"
        )
    try:
        config = AutoConfig.from_pretrained(path)
        saved = config.to_diff_dict()  # what config.json says (num_labels defaults to 2 where it says nothing)
        classes, outputs = config.architectures or [], len(saved["id2label"]) if "id2label" in saved else 1
    except (OSError, ValueError, KeyError):
        classes, outputs = [], 1  # said below, when the model itself does not load
    if trained and classes and outputs != 1 and any(c.endswith("ForSequenceClassification") for c in classes):
        raise ConfigError(
            f"{key}: '{path}' has a score head of {outputs} outputs; a reward model has one (asyncrl rm trains one)"
        )
    if trained and classes and not any(c.endswith("ForSequenceClassification") for c in classes):
        raise ConfigError(
            f"{key}: '{path}' is not a reward model (its config.json names {classes}, not a "
            "*ForSequenceClassification): its score head would be new and random; train one with "
            "asyncrl rm"
        )

    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    if not trained:  # asyncrl rm: the new score head and the unused lm_head are expected, not a load report
        hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model, info = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, output_loading_info=True)
    except (OSError, ValueError, KeyError, RuntimeError) as e:  # RuntimeError: a score head of another size
        raise ConfigError(
            f"{key}: cannot load a sequence-classification model from '{path}': "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from e
    finally:
        hf_logging.set_verbosity(verbosity)
    new_head = sorted(k for k in info.get("missing_keys", ()) if k.split(".")[0] in ("score", "classifier"))
    if trained and new_head:
        raise ConfigError(
            f"{key}: '{path}' has no trained score head (its weights lack {new_head[0]}; its config.json names a "
            "sequence classifier, but the weights are a language model's): it would score with a random head; "
            "train one with asyncrl rm"
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    tokenizer.truncation_side = "left"  # a text past max_length loses the start of its prompt, never its answer
    model.config.pad_token_id = tokenizer.pad_token_id
    return tokenizer, model.to(device)


def scores(model, tokenizer, texts: list[str], max_length: int = 1024) -> torch.Tensor:
    """The model's score of each text, (len(texts),) float32 (with the gradient when enabled)."""
    device = next(model.parameters()).device
    enc = tokenizer(
        texts, return_tensors="pt", padding=True, truncation=True, max_length=max_length, add_special_tokens=False
    )
    return (
        model(input_ids=enc["input_ids"].to(device), attention_mask=enc["attention_mask"].to(device))
        .logits[:, 0]
        .float()
    )


class RewardModel:
    """Scores (prompt, response) pairs with a reward model, batching the calls that wait together."""

    def __init__(self, path: str, device: str = "cpu", batch_size: int = 16, max_length: int = 1024):
        self.tokenizer, self.model = load_reward_model(path, device)
        self.model.eval()
        self.batch_size, self.max_length = batch_size, max_length
        self.batches = self.scored = 0
        self._calls: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="reward-model", daemon=True)
        self._thread.start()

    def __call__(self, prompt: str, response: str) -> float:
        done: Future = Future()
        self._calls.put((pair_text(prompt, response), done))
        return done.result()

    def _serve(self) -> None:
        while True:
            first = self._calls.get()
            if first is None:
                return
            calls = [first]
            while len(calls) < self.batch_size:
                try:
                    call = self._calls.get_nowait()
                except queue.Empty:
                    break
                if call is None:
                    self._calls.put(None)  # end after this batch
                    break
                calls.append(call)
            try:
                with torch.no_grad():
                    values = scores(self.model, self.tokenizer, [t for t, _ in calls], self.max_length).tolist()
                for (_, done), v in zip(calls, values):
                    done.set_result(v)
                self.batches, self.scored = self.batches + 1, self.scored + len(calls)
            except Exception as e:  # noqa: BLE001 - each call fails with it, the service counts them
                for _, done in calls:
                    done.set_exception(e)

    def close(self) -> None:
        self._calls.put(None)
        self._thread.join(timeout=30)


@dataclass(frozen=True)
class ModelReward:
    """A reward function: the reward model's score, mixed with ``verifier``'s reward by ``weight``
    (``(1 - weight) * verifier + weight * model``; weight 1: the model alone)."""

    model: Callable[[str, str], float]
    verifier: Callable[..., Any] | None = None
    weight: float = 1.0

    def __call__(self, prompt: str, completion: str, **fields: Any) -> float:
        score = self.model(prompt, completion)
        if self.verifier is None or self.weight >= 1.0:
            return score
        return (1 - self.weight) * as_reward(self.verifier(prompt, completion, **fields)) + self.weight * score
