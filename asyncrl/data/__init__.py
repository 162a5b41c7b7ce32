"""Tasks and datasets: where prompts, held-out items and their default reward function come from.

An item is a dict with at least ``question`` (the user turn) and whatever fields its reward function takes
as keyword arguments (e.g. ``answer``, ``tests``); ``solution`` (a reference answer text) is used by SFT.
Training items also carry a unique ``id``.

Sources (``train_dataset.path``): the built-in arithmetic task (default), a local JSONL / JSON / Parquet
file or saved ``datasets`` directory in a recognised row format (see :mod:`asyncrl.data.formats`), or a
reasoning-gym task (``gym:NAME``). A bad row costs one row: it is skipped, logged with its file and line and
counted (``train_dataset.skip_bad_rows=false`` makes it an error). With a tokenizer, prompts longer than
``train_dataset.max_prompt_tokens`` are skipped and counted, never crashed on.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import logging
import random
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from asyncrl.configlib import ConfigError
from asyncrl.data.arith import ArithTask, arith_reward
from asyncrl.data.config import TaskConfig, TrainDatasetConfig, ValidDatasetConfig
from asyncrl.data.formats import detect_type, to_item
from asyncrl.data.gym import PREFIX as GYM_PREFIX
from asyncrl.data.sources import Row, RowError, read_rows, resolve_path

log = logging.getLogger(__name__)

TASKS = {"arith": (ArithTask, arith_reward)}
BUILTIN_PREFIX = "builtin:"
BAD_ROWS_LOGGED = 5
MAX_SKIPS_IN_A_ROW = 10_000


@dataclass
class Dataset:
    train: Iterator[dict]  # endless; every item carries a unique "id"
    valid: list[dict]
    reward_fn: Callable[..., float]  # the data's own verifier, used unless reward.fn names another
    stats: Callable[[], dict] = dict  # counters for metrics: data_bad_rows, data_skipped_long, data_epoch


def build_task(cfg: TaskConfig):
    """The built-in task object and its verifier."""
    if cfg.name not in TASKS:
        raise ConfigError(f"task.name '{cfg.name}' is not one of {sorted(TASKS)} (or train_dataset.path "
                          f"'{BUILTIN_PREFIX}{cfg.name}')")
    cls, reward_fn = TASKS[cfg.name]
    task = cls(min_terms=cfg.min_terms, max_terms=cfg.max_terms, max_operand=cfg.max_operand, ops=cfg.ops,
               direct_frac=cfg.direct_frac)
    return task, reward_fn


def build_dataset(task: TaskConfig, train: TrainDatasetConfig, valid: ValidDatasetConfig,
                  tokenizer=None) -> Dataset:
    """The training stream, the held-out list and the default reward for the configured source.

    ``tokenizer`` (optional) enables ``train_dataset.max_prompt_tokens`` and pre-tokenises prompts with the
    chat template into ``prompt_ids``."""
    train.validate()
    counters = _Counters()
    limit = _PromptLimit(tokenizer, train.max_prompt_tokens, counters)
    if valid.path and (not train.path or train.path.startswith((BUILTIN_PREFIX, GYM_PREFIX))):
        raise ConfigError("valid_dataset.path is read with the training file's format: give train_dataset.path "
                          "a file too, or leave valid_dataset.path empty for the task's own held-out split")
    if not train.path or train.path.startswith(BUILTIN_PREFIX):
        name = train.path[len(BUILTIN_PREFIX):] or task.name
        gen, reward_fn = build_task(dataclasses.replace(task, name=name))
        raw_held_out = gen.split(valid.seed, valid.size)
        exclude = {it["question"] for it in raw_held_out}  # the generator compares untemplated questions
        held_out = list(limit.filter(_templated(raw_held_out, train, f"task '{name}'")))
        stream = limit.filter(_templated(gen.stream(train.seed, exclude), train, f"task '{name}'"))
    elif train.path.startswith(GYM_PREFIX):
        stream, held_out, reward_fn = _gym_source(train, valid, limit)
    else:
        stream, held_out, reward_fn = _file_source(train, valid, limit, counters)
    if not held_out:
        raise ConfigError("valid_dataset: the held-out split is empty (every row was bad or longer than "
                          "train_dataset.max_prompt_tokens)")
    numbered = ({**it, "id": i} for i, it in zip(itertools.count(), stream))
    return Dataset(numbered, held_out, reward_fn, counters.snapshot)


def build_eval_set(task: TaskConfig, valid: ValidDatasetConfig, train: TrainDatasetConfig | None = None,
                   tokenizer=None) -> tuple[list[dict], Callable[..., float]]:
    """Held-out items and their default reward for evaluation alone (``asyncrl eval``): the file
    ``valid_dataset.path`` (read with ``train``'s type, fields and template; no training source needed), else
    the held-out split of the training source (the built-in task by default)."""
    train = train or TrainDatasetConfig()
    if not valid.path:
        data = build_dataset(task, train, valid, tokenizer)
        return data.valid, data.reward_fn
    train.validate()
    counters = _Counters()
    loader = _RowLoader(train, counters)
    items = loader.load(resolve_path(valid.path, "valid_dataset.path"), valid.split, "valid_dataset.path")
    held_out = list(_PromptLimit(tokenizer, train.max_prompt_tokens, counters).filter(items[: valid.size]))
    if not held_out:
        raise ConfigError("valid_dataset.path: every row is longer than train_dataset.max_prompt_tokens")
    return held_out, default_reward(loader.row_type)


# ---- sources --------------------------------------------------------------------------------------------
def _gym_source(train: TrainDatasetConfig, valid: ValidDatasetConfig, limit: "_PromptLimit"):
    from asyncrl.data.gym import gym_items, gym_stream
    from asyncrl.reward.gym_reward import gym_reward

    name = train.path[len(GYM_PREFIX):]
    raw_held_out = list(gym_items(name, valid.seed, valid.size, train.gym_options))
    exclude = {it["question"] for it in raw_held_out}  # gym_stream compares untemplated questions
    held_out = list(limit.filter(_templated(raw_held_out, train, f"reasoning-gym task '{name}'")))
    stream = _templated(gym_stream(name, train.seed, train.gym_options, exclude), train,
                        f"reasoning-gym task '{name}'")
    return limit.filter(stream), held_out, gym_reward


def _templated(items: Iterable[dict], train: TrainDatasetConfig, source: str) -> Iterator[dict]:
    """Items with ``question`` rebuilt by ``train_dataset.prompt_template`` (unchanged when it is empty)."""
    for item in items:
        if train.prompt_template:
            try:
                item = {**item, "question": train.prompt_template.format(**item)}
            except (KeyError, IndexError, ValueError) as e:
                raise ConfigError(f"train_dataset.prompt_template: cannot format it with the items of {source} "
                                  f"(fields {sorted(item)}): {type(e).__name__}: {e}") from None
        yield item


def _file_source(train: TrainDatasetConfig, valid: ValidDatasetConfig, limit: "_PromptLimit",
                 counters: "_Counters"):
    path = resolve_path(train.path, "train_dataset.path")
    loader = _RowLoader(train, counters)
    items = loader.load(path, train.split, "train_dataset.path")
    row_type = loader.row_type
    if valid.path:
        vpath = resolve_path(valid.path, "valid_dataset.path")
        held_out = loader.load(vpath, valid.split, "valid_dataset.path")[: valid.size]
    else:
        items, held_out = hold_out(items, valid.size, valid.seed)
    held_out, items = list(limit.filter(held_out)), list(limit.filter(items))  # each row checked once
    if not items:
        raise ConfigError(f"train_dataset.path: no training rows left in '{path}' after holding out "
                          f"{len(held_out)} for validation and skipping over-long prompts "
                          f"({counters.snapshot()['data_skipped_long']}); give valid_dataset.path, more rows "
                          "or a larger train_dataset.max_prompt_tokens")
    return _epochs(items, train.seed, train.shuffle, counters), held_out, default_reward(row_type)


def hold_out(items: list[dict], size: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Split off up to ``size`` items (at most a tenth, at least one) chosen by ``seed``; the rest trains."""
    if len(items) < 2:
        return items, list(items)
    n = max(1, min(size, len(items) // 10))
    chosen = set(random.Random(seed).sample(range(len(items)), n))
    return ([it for i, it in enumerate(items) if i not in chosen],
            [it for i, it in enumerate(items) if i in chosen])


def _epochs(items: list[dict], seed: int, shuffle: bool, counters: "_Counters") -> Iterator[dict]:
    for epoch in itertools.count():
        counters.set("data_epoch", epoch)
        order = list(range(len(items)))
        if shuffle:
            random.Random(seed + epoch).shuffle(order)
        for i in order:
            yield items[i]


def default_reward(row_type: str) -> Callable[..., float]:
    """The verifier that fits a row format."""
    if row_type == "code":
        from asyncrl.reward.code_reward import code_reward

        return code_reward
    from asyncrl.reward.math_reward import math_reward

    if importlib.util.find_spec("math_verify") is None:
        log.warning("math-verify is not installed: only plain numbers are compared (pip install 'asyncrl[math]')")
    return math_reward


class _RowLoader:
    """Rows -> items with the configured format and mapping; bad rows skipped or raised (``skip_bad_rows``)."""

    def __init__(self, train: TrainDatasetConfig, counters: "_Counters"):
        self.cfg, self.counters = train, counters
        self.row_type = None if train.type == "auto" else train.type
        self.bad: list[str] = []

    def load(self, path, split: str, key: str) -> list[dict]:
        items = []
        for row in read_rows(path, split, key):
            item = self._item(row)
            if item is not None:
                items.append(item)
        if not items:
            shown = "\n  ".join(self.bad[:BAD_ROWS_LOGGED]) or "(the file has no rows)"
            raise ConfigError(f"{key}: no usable rows in '{path}':\n  {shown}")
        return items

    def _item(self, row: Row | RowError) -> dict | None:
        if isinstance(row, RowError):
            return self._bad(str(row))
        try:
            if self.row_type is None:
                self.row_type = detect_type(row.data, self.cfg.fields) if isinstance(row.data, dict) else "qa"
                log.info("train_dataset.type=auto: %s looks like '%s' rows", row.where, self.row_type)
            return to_item(row.data, self.row_type, self.cfg.fields, self.cfg.prompt_template)
        except ValueError as e:
            return self._bad(f"{row.where}: {e}")

    def _bad(self, message: str) -> None:
        if not self.cfg.skip_bad_rows:
            raise ConfigError(message + " (train_dataset.skip_bad_rows=true skips such rows)")
        self.bad.append(message)
        n = self.counters.add("data_bad_rows")
        if n <= BAD_ROWS_LOGGED:
            log.warning("skipping bad row %s", message)
        elif n == BAD_ROWS_LOGGED + 1:
            log.warning("more bad rows skipped; counted in data_bad_rows")
        return None


# ---- prompt length limit and counters -----------------------------------------------------------------
@dataclass
class _Counters:
    values: dict = field(default_factory=lambda: {"data_bad_rows": 0, "data_skipped_long": 0, "data_epoch": 0})
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, key: str, n: int = 1) -> int:
        with self.lock:
            self.values[key] += n
            return self.values[key]

    def set(self, key: str, value: int) -> None:
        with self.lock:
            self.values[key] = value

    def snapshot(self) -> dict:
        with self.lock:
            return dict(self.values)


@dataclass
class _PromptLimit:
    """Tokenises prompts with the chat template (``prompt_ids``) and drops those over ``max_tokens``."""

    tokenizer: object
    max_tokens: int
    counters: _Counters
    warned: bool = False

    def filter(self, items: Iterable[dict]) -> Iterator[dict]:
        if self.tokenizer is None:
            if self.max_tokens and not self.warned:
                self.warned = True
                log.warning("train_dataset.max_prompt_tokens=%d needs a tokenizer; prompts are not checked",
                            self.max_tokens)
            yield from items
            return
        from asyncrl.workflow.rlvr import chat_prompt_ids

        in_a_row = 0
        for item in items:
            ids = chat_prompt_ids(self.tokenizer, item["question"])
            if self.max_tokens and len(ids) > self.max_tokens:
                if self.counters.add("data_skipped_long") == 1:
                    log.warning("skipping a prompt of %d tokens (train_dataset.max_prompt_tokens=%d); further "
                                "ones are counted in data_skipped_long", len(ids), self.max_tokens)
                in_a_row += 1
                if in_a_row >= MAX_SKIPS_IN_A_ROW:  # an endless generator whose prompts are all too long
                    raise RuntimeError(f"{in_a_row} prompts in a row are longer than "
                                       f"train_dataset.max_prompt_tokens={self.max_tokens}")
                continue
            in_a_row = 0
            yield {**item, "prompt_ids": ids}
