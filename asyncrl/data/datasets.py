"""Datasets: where a run's prompts, held-out items and default reward function come from, as plain arguments
(:mod:`asyncrl.data.config` maps the config sections onto them).

Sources: a built-in task (:func:`task_dataset`), a local JSONL / JSON / Parquet file or saved ``datasets``
directory in a recognised row format (:func:`file_dataset`, :func:`file_eval_set`; the rows:
:mod:`asyncrl.data.rows`, their formats: :mod:`asyncrl.data.formats`), or a reasoning-gym task
(:func:`gym_dataset`). Held-out items are never trained on; the training stream is endless (epochs of a file,
or generated problems) and numbers its items.
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import random
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from asyncrl.configlib import ConfigError
from asyncrl.data.arith import ArithTask, arith_reward
from asyncrl.data.formats import apply_template, prompt_of
from asyncrl.data.lookup import LookupTask, lookup_reward
from asyncrl.data.rows import LIMIT_KEY, MAX_SKIPS_IN_A_ROW, Counters, PromptLimit, RowLoader
from asyncrl.data.sources import resolve_path
from asyncrl.reward.base import UNTEMPLATED

log = logging.getLogger(__name__)

TASKS = {"arith": (ArithTask, arith_reward), "lookup": (LookupTask, lookup_reward)}
LOOKUP_OWN = ("direct_things",)  # options of the lookup task alone: the keys task.lookup.*


@dataclass
class Dataset:
    train: Iterator[dict]  # endless; every item carries a unique "id"
    valid: list[dict]
    reward_fn: Callable[..., float]  # the data's own verifier, used unless reward.fn names another
    stats: Callable[[], dict] = dict  # counters for metrics: data_bad_rows, data_skipped_long, data_epoch
    source_of: Callable[[int], str | None] | None = None  # a mixture's MixtureSchedule: each training item's source


def make_task(name: str, options: dict):
    """The built-in task ``name`` built with ``options`` (e.g. ``{"min_terms": 2}``) and its verifier; an
    unknown name or a bad option is a ConfigError naming the ``task.`` key."""
    if name not in TASKS:
        raise ConfigError(
            f"no built-in task '{name}': task.name (or train_dataset.path 'builtin:NAME') must be "
            f"one of {sorted(TASKS)}"
        )
    cls, reward_fn = TASKS[name]
    try:
        return cls(**options), reward_fn
    except ValueError as e:  # the message starts with the option's name
        option = str(e).split(" ", 1)[0]
        raise ConfigError(f"task.{'lookup.' if option in LOOKUP_OWN else ''}{e}") from None


def task_dataset(
    name: str,
    options: dict,
    *,
    seed: int = 0,
    valid_seed: int = 10_000,
    valid_size: int = 200,
    template: str = "",
    tokenizer=None,
    max_prompt_tokens: int | None = None,
) -> Dataset:
    """The built-in task: an endless stream from ``seed`` and ``valid_size`` distinct held-out problems from
    ``valid_seed`` that the stream never yields."""
    gen, reward_fn = make_task(name, options)
    try:
        raw_held_out = gen.split(valid_seed, valid_size)
    except ValueError as e:
        raise ConfigError(
            f"valid_dataset.size={valid_size}: task '{name}': {e}; lower valid_dataset.size or "
            "allow more problems (task.max_operand, task.max_terms, task.ops)"
        ) from None
    return _generated(
        raw_held_out, gen.stream(seed), reward_fn, f"task '{name}'", template, tokenizer, max_prompt_tokens
    )


def gym_dataset(
    name: str,
    options: dict,
    *,
    seed: int = 0,
    valid_seed: int = 10_000,
    valid_size: int = 200,
    template: str = "",
    tokenizer=None,
    max_prompt_tokens: int | None = None,
) -> Dataset:
    """A reasoning-gym task built with ``options``: endless seeded chunks and a held-out split from
    ``valid_seed``, scored by the task's own scorer."""
    from asyncrl.data.gym import gym_items, gym_stream
    from asyncrl.reward.gym_reward import gym_reward

    raw_held_out = list(gym_items(name, valid_seed, valid_size, options))
    return _generated(
        raw_held_out,
        gym_stream(name, seed, options),
        gym_reward,
        f"reasoning-gym task '{name}'",
        template,
        tokenizer,
        max_prompt_tokens,
    )


def file_dataset(
    path: str,
    *,
    split: str = "train",
    row_type: str = "auto",
    fields: dict | None = None,
    template: str = "",
    skip_bad_rows: bool = True,
    shuffle: bool = True,
    seed: int = 0,
    valid_path: str = "",
    valid_split: str = "test",
    valid_size: int = 200,
    valid_seed: int = 10_000,
    tokenizer=None,
    max_prompt_tokens: int | None = None,
) -> Dataset:
    """Rows of a local file, reshuffled each epoch. Held out: the first ``valid_size`` rows of ``valid_path``,
    else up to ``valid_size`` rows (at most a tenth) of the file, never trained on; a file of one row is
    refused then, as its only row would be both."""
    counters = Counters()
    loader = RowLoader(row_type, fields or {}, template, skip_bad_rows, counters)
    resolved = resolve_path(path, "train_dataset.path")
    items = loader.load(resolved, split, "train_dataset.path")
    if valid_path:
        held_out = loader.load(resolve_path(valid_path, "valid_dataset.path"), valid_split, "valid_dataset.path")
        held_out = held_out[:valid_size]
        _warn_overlap(held_out, items, valid_path, path)
    elif len(items) < 2:
        raise ConfigError(
            f"train_dataset.path: '{resolved}' has a single usable row, and held-out rows are never "
            "trained on: give valid_dataset.path (a separate held-out file) or more rows"
        )
    else:
        items, held_out = hold_out(items, valid_size, valid_seed)
    limit = PromptLimit(tokenizer, max_prompt_tokens, counters, loader.skip_bad_rows, loader.where)
    held_out, items = list(limit.filter(held_out)), list(limit.filter(items))  # each row checked once
    if not items:
        raise ConfigError(
            f"train_dataset.path: no training rows left in '{resolved}' after holding out "
            f"{len(held_out)} for validation and skipping over-long prompts "
            f"({counters.snapshot()['data_skipped_long']}), malformed rows and rows the chat template "
            f"refused ({counters.snapshot()['data_bad_rows']}); give valid_dataset.path, more rows "
            "or a larger train_dataset.max_prompt_tokens"
        )
    return _dataset(_epochs(items, seed, shuffle, counters), held_out, default_reward(loader.row_type), counters)


def file_eval_set(
    path: str,
    *,
    size: int = 200,
    split: str = "test",
    row_type: str = "auto",
    fields: dict | None = None,
    template: str = "",
    skip_bad_rows: bool = True,
    tokenizer=None,
    max_prompt_tokens: int | None = None,
) -> tuple[list[dict], Callable[..., float], dict]:
    """The first ``size`` usable rows of ``path`` (over-long prompts skipped), the verifier of their format and
    the rows skipped (``data_bad_rows`` in the file, ``data_skipped_long`` among the first ``size``), for
    evaluation alone: no training source needed."""
    counters = Counters()
    loader = RowLoader(row_type, fields or {}, template, skip_bad_rows, counters)
    items = loader.load(resolve_path(path, "valid_dataset.path"), split, "valid_dataset.path")
    held_out = list(
        PromptLimit(tokenizer, max_prompt_tokens, counters, skip_bad_rows, loader.where).filter(items[:size])
    )
    if not held_out:
        counts = counters.snapshot()
        raise ConfigError(
            f"valid_dataset.path: no usable row among the first {size}: {counts['data_skipped_long']} "
            f"longer than {max_prompt_tokens} tokens ({LIMIT_KEY}), {counts['data_bad_rows']} malformed "
            "or refused by the chat template (the first is logged)"
        )
    skipped = {k: v for k, v in counters.snapshot().items() if k != "data_epoch"}
    return held_out, default_reward(loader.row_type), skipped


def hold_out(items: list[dict], size: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Split ``items`` (at least two) into (train, held out): up to ``size`` held out (at most a tenth, at least
    one) chosen by ``seed``; a training row that repeats a held-out row's prompt is left out of training too."""
    n = max(1, min(size, len(items) // 10))
    chosen = set(random.Random(seed).sample(range(len(items)), n))
    held_out = [it for i, it in enumerate(items) if i in chosen]
    prompts = {prompt_key(it) for it in held_out}
    train = [it for i, it in enumerate(items) if i not in chosen and prompt_key(it) not in prompts]
    repeats = len(items) - n - len(train)
    if repeats:
        log.warning(
            "%d training rows repeat the prompt of a held-out row: they are left out of training, so that "
            "the held-out accuracy measures prompts the model never trained on",
            repeats,
        )
    return train, held_out


def prompt_key(item) -> str:
    """What an item asks, for telling repeats apart: a chat row's turns before its final assistant reply (two
    replies to one prompt are one prompt), else its question before any template (one problem worded by two
    mixture entries' templates is one problem)."""
    if not isinstance(item, dict):
        return repr(item)
    if UNTEMPLATED in item:
        return repr(item[UNTEMPLATED])
    return repr(prompt_of(item) if item.get("messages") else item.get("question"))


def default_reward(row_type: str) -> Callable[..., float]:
    """The verifier that fits a row format."""
    if row_type == "code":
        from asyncrl.reward.code_reward import code_reward

        return code_reward
    from asyncrl.reward.math_reward import math_reward

    if importlib.util.find_spec("math_verify") is None:
        log.warning("math-verify is not installed: only plain numbers are compared (pip install 'asyncrl[math]')")
    return math_reward


# ---- assembling a dataset -------------------------------------------------------------------------------
def _generated(
    raw_held_out: list[dict],
    raw_stream: Iterator[dict],
    reward_fn,
    source: str,
    template: str,
    tokenizer,
    max_prompt_tokens: int | None,
) -> Dataset:
    """A generated source: held-out questions are compared as generated (before the template) and skipped."""
    counters = Counters()
    limit = PromptLimit(tokenizer, max_prompt_tokens, counters)
    exclude = {it["question"] for it in raw_held_out}
    held_out = list(limit.filter(_templated(raw_held_out, template, source)))
    stream = limit.filter(_templated(_excluding(raw_stream, exclude, source), template, source))
    return _dataset(stream, held_out, reward_fn, counters)


def _dataset(stream: Iterator[dict], held_out: list[dict], reward_fn, counters: "Counters") -> Dataset:
    """The Dataset, with the stream's first item drawn now so that a stream that cannot yield (everything held
    out or too long, a template that does not fit) is a ConfigError before anything runs."""
    if not held_out:
        raise ConfigError(f"valid_dataset: the held-out split is empty (every row was bad or longer than {LIMIT_KEY})")
    first = next(stream)
    numbered = ({**it, "id": i} for i, it in enumerate(itertools.chain([first], stream)))
    return Dataset(numbered, held_out, reward_fn, counters.snapshot)


def _excluding(items: Iterable[dict], exclude: set[str], source: str) -> Iterator[dict]:
    """``items`` whose question is not in ``exclude``; a ConfigError when the source keeps repeating those."""
    in_a_row = 0
    for item in items:
        if item["question"] in exclude:
            in_a_row += 1
            if in_a_row >= MAX_SKIPS_IN_A_ROW:
                raise ConfigError(
                    f"{source}: {in_a_row} problems in a row were held-out ones; the task has too "
                    "few distinct problems for valid_dataset.size"
                )
            continue
        in_a_row = 0
        yield item


def _templated(items: Iterable[dict], template: str, source: str) -> Iterator[dict]:
    """Items with ``question`` rebuilt by ``template`` (unchanged when it is empty)."""
    for item in items:
        if template:
            try:
                item = {
                    **item,
                    "question": apply_template(template, item),
                    UNTEMPLATED: item.get(UNTEMPLATED, item["question"]),
                }
            except ValueError as e:
                raise ConfigError(f"{e} (the items of {source})") from None
        yield item


def _warn_overlap(held_out: list[dict], items: list[dict], valid_path: str, path: str) -> None:
    shared = {it["question"] for it in held_out} & {it["question"] for it in items}
    if shared:
        log.warning(
            "%d of the %d held-out questions of valid_dataset.path '%s' are also training rows of '%s': "
            "the model trains on them",
            len(shared),
            len(held_out),
            valid_path,
            path,
        )


def _epochs(items: list[dict], seed: int, shuffle: bool, counters: "Counters") -> Iterator[dict]:
    for epoch in itertools.count():
        counters.set("data_epoch", epoch)
        order = list(range(len(items)))
        if shuffle:
            random.Random(seed + epoch).shuffle(order)
        for i in order:
            yield items[i]
