"""Tasks and datasets: where prompts, held-out items and their default reward function come from.

An item is a dict with at least ``question`` (the user turn) and whatever fields its reward function takes
as keyword arguments (e.g. ``answer``, ``tests``); ``solution`` (a reference answer text) is used by SFT.
Training items also carry a unique ``id``.

Sources: a built-in task (:func:`task_dataset`), a local JSONL / JSON / Parquet file or saved ``datasets``
directory in a recognised row format (:func:`file_dataset`, :func:`file_eval_set`; see
:mod:`asyncrl.data.formats`), or a reasoning-gym task (:func:`gym_dataset`). They take plain arguments;
:mod:`asyncrl.data.config` maps the config sections onto them. A bad row costs one row: it is skipped, logged
with its file and line and counted (``skip_bad_rows=False`` makes it an error). With a tokenizer, prompts
longer than ``max_prompt_tokens`` are skipped and counted, held-out ones included, never crashed on. Held-out
items are never trained on.

A mixture (:func:`mixture_dataset`) interleaves the streams of several sources by weight; its items carry the
name of their ``source``, which picks their reward function (:class:`asyncrl.reward.base.MixtureReward`).
"""

from __future__ import annotations

import bisect
import hashlib
import importlib.util
import itertools
import logging
import random
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from asyncrl.data.lookup import LookupTask, lookup_reward
from asyncrl.configlib import ConfigError
from asyncrl.data.arith import ArithTask, arith_reward
from asyncrl.data.formats import apply_template, detect_type, item_prompt_ids, prompt_of, to_item
from asyncrl.data.sources import Row, RowError, read_rows, resolve_path
from asyncrl.reward.base import UNTEMPLATED

log = logging.getLogger(__name__)

TASKS = {"arith": (ArithTask, arith_reward), "lookup": (LookupTask, lookup_reward)}
LOOKUP_OWN = ("direct_things",)  # options of the lookup task alone: the keys task.lookup.*
BAD_ROWS_LOGGED = 5
MAX_SKIPS_IN_A_ROW = 10_000
LIMIT_KEY = "train_dataset.max_prompt_tokens; by default the model's context minus gconfig.max_new_tokens"


@dataclass
class Dataset:
    train: Iterator[dict]  # endless; every item carries a unique "id"
    valid: list[dict]
    reward_fn: Callable[..., float]  # the data's own verifier, used unless reward.fn names another
    stats: Callable[[], dict] = dict  # counters for metrics: data_bad_rows, data_skipped_long, data_epoch
    source_of: "MixtureSchedule | None" = None  # a mixture's: the source of each training item id


def make_task(name: str, options: dict):
    """The built-in task ``name`` built with ``options`` (e.g. ``{"min_terms": 2}``) and its verifier; an
    unknown name or a bad option is a ConfigError naming the ``task.`` key."""
    if name not in TASKS:
        raise ConfigError(f"no built-in task '{name}': task.name (or train_dataset.path 'builtin:NAME') must be "
                          f"one of {sorted(TASKS)}")
    cls, reward_fn = TASKS[name]
    try:
        return cls(**options), reward_fn
    except ValueError as e:  # the message starts with the option's name
        option = str(e).split(" ", 1)[0]
        raise ConfigError(f"task.{'lookup.' if option in LOOKUP_OWN else ''}{e}") from None


def task_dataset(name: str, options: dict, *, seed: int = 0, valid_seed: int = 10_000, valid_size: int = 200,
                 template: str = "", tokenizer=None, max_prompt_tokens: int | None = None) -> Dataset:
    """The built-in task: an endless stream from ``seed`` and ``valid_size`` distinct held-out problems from
    ``valid_seed`` that the stream never yields."""
    gen, reward_fn = make_task(name, options)
    try:
        raw_held_out = gen.split(valid_seed, valid_size)
    except ValueError as e:
        raise ConfigError(f"valid_dataset.size={valid_size}: task '{name}': {e}; lower valid_dataset.size or "
                          "allow more problems (task.max_operand, task.max_terms, task.ops)") from None
    return _generated(raw_held_out, gen.stream(seed), reward_fn, f"task '{name}'", template, tokenizer,
                      max_prompt_tokens)


def gym_dataset(name: str, options: dict, *, seed: int = 0, valid_seed: int = 10_000, valid_size: int = 200,
                template: str = "", tokenizer=None, max_prompt_tokens: int | None = None) -> Dataset:
    """A reasoning-gym task built with ``options``: endless seeded chunks and a held-out split from
    ``valid_seed``, scored by the task's own scorer."""
    from asyncrl.data.gym import gym_items, gym_stream
    from asyncrl.reward.gym_reward import gym_reward

    raw_held_out = list(gym_items(name, valid_seed, valid_size, options))
    return _generated(raw_held_out, gym_stream(name, seed, options), gym_reward, f"reasoning-gym task '{name}'",
                      template, tokenizer, max_prompt_tokens)


def file_dataset(path: str, *, split: str = "train", row_type: str = "auto", fields: dict | None = None,
                 template: str = "", skip_bad_rows: bool = True, shuffle: bool = True, seed: int = 0,
                 valid_path: str = "", valid_split: str = "test", valid_size: int = 200, valid_seed: int = 10_000,
                 tokenizer=None, max_prompt_tokens: int | None = None) -> Dataset:
    """Rows of a local file, reshuffled each epoch. Held out: the first ``valid_size`` rows of ``valid_path``,
    else up to ``valid_size`` rows (at most a tenth) of the file, never trained on; a file of one row is
    refused then, as its only row would be both."""
    counters = _Counters()
    loader = _RowLoader(row_type, fields or {}, template, skip_bad_rows, counters)
    resolved = resolve_path(path, "train_dataset.path")
    items = loader.load(resolved, split, "train_dataset.path")
    if valid_path:
        held_out = loader.load(resolve_path(valid_path, "valid_dataset.path"), valid_split, "valid_dataset.path")
        held_out = held_out[:valid_size]
        _warn_overlap(held_out, items, valid_path, path)
    elif len(items) < 2:
        raise ConfigError(f"train_dataset.path: '{resolved}' has a single usable row, and held-out rows are never "
                          "trained on: give valid_dataset.path (a separate held-out file) or more rows")
    else:
        items, held_out = hold_out(items, valid_size, valid_seed)
    limit = _PromptLimit(tokenizer, max_prompt_tokens, counters, loader.skip_bad_rows, loader.where)
    held_out, items = list(limit.filter(held_out)), list(limit.filter(items))  # each row checked once
    if not items:
        raise ConfigError(f"train_dataset.path: no training rows left in '{resolved}' after holding out "
                          f"{len(held_out)} for validation and skipping over-long prompts "
                          f"({counters.snapshot()['data_skipped_long']}), malformed rows and rows the chat template "
                          f"refused ({counters.snapshot()['data_bad_rows']}); give valid_dataset.path, more rows "
                          "or a larger train_dataset.max_prompt_tokens")
    return _dataset(_epochs(items, seed, shuffle, counters), held_out, default_reward(loader.row_type), counters)


def file_eval_set(path: str, *, size: int = 200, split: str = "test", row_type: str = "auto",
                  fields: dict | None = None, template: str = "", skip_bad_rows: bool = True, tokenizer=None,
                  max_prompt_tokens: int | None = None) -> tuple[list[dict], Callable[..., float], dict]:
    """The first ``size`` usable rows of ``path`` (over-long prompts skipped), the verifier of their format and
    the rows skipped (``data_bad_rows`` in the file, ``data_skipped_long`` among the first ``size``), for
    evaluation alone: no training source needed."""
    counters = _Counters()
    loader = _RowLoader(row_type, fields or {}, template, skip_bad_rows, counters)
    items = loader.load(resolve_path(path, "valid_dataset.path"), split, "valid_dataset.path")
    held_out = list(_PromptLimit(tokenizer, max_prompt_tokens, counters, skip_bad_rows,
                                 loader.where).filter(items[:size]))
    if not held_out:
        counts = counters.snapshot()
        raise ConfigError(f"valid_dataset.path: no usable row among the first {size}: {counts['data_skipped_long']} "
                          f"longer than {max_prompt_tokens} tokens ({LIMIT_KEY}), {counts['data_bad_rows']} malformed "
                          "or refused by the chat template (the first is logged)")
    skipped = {k: v for k, v in counters.snapshot().items() if k != "data_epoch"}
    return held_out, default_reward(loader.row_type), skipped


def hold_out(items: list[dict], size: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Split ``items`` (at least two) into (train, held out): up to ``size`` held out (at most a tenth, at least
    one) chosen by ``seed``; a training row that repeats a held-out row's prompt is left out of training too."""
    n = max(1, min(size, len(items) // 10))
    chosen = set(random.Random(seed).sample(range(len(items)), n))
    held_out = [it for i, it in enumerate(items) if i in chosen]
    prompts = {_prompt_key(it) for it in held_out}
    train = [it for i, it in enumerate(items) if i not in chosen and _prompt_key(it) not in prompts]
    repeats = len(items) - n - len(train)
    if repeats:
        log.warning("%d training rows repeat the prompt of a held-out row: they are left out of training, so that "
                    "the held-out accuracy measures prompts the model never trained on", repeats)
    return train, held_out


def _prompt_key(item) -> str:
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


# ---- mixtures of sources ------------------------------------------------------------------------------
class MixtureSchedule:
    """Which source each position of a mixture's stream draws from: a weighted choice made from a hash of
    (``seed``, position), so any position's source is known without replaying the stream (a resumed run, the
    metrics of a trained item id) and the same seed always gives the same interleave."""

    def __init__(self, names: list[str], weights: list[float], seed: int):
        total = sum(weights)
        self.names, self.seed = list(names), seed
        self.bounds = list(itertools.accumulate(w / total for w in weights))

    def index(self, position: int) -> int:
        digest = hashlib.blake2b(f"{self.seed}:{position}".encode(), digest_size=8).digest()
        u = int.from_bytes(digest, "big") / 2.0 ** 64  # uniform in [0, 1)
        return min(bisect.bisect_right(self.bounds, u), len(self.names) - 1)

    def __call__(self, item_id) -> str | None:
        """The source of the training item ``item_id`` (its position in the stream); None for anything else."""
        if isinstance(item_id, bool) or not isinstance(item_id, int) or item_id < 0:
            return None
        return self.names[self.index(item_id)]


def mixture_dataset(sources: dict[str, tuple[float, Dataset]], *, seed: int = 0,
                    reward_fn: Callable[..., float] | None = None) -> Dataset:
    """One dataset from several: position i of the stream comes from a source chosen by weight
    (:class:`MixtureSchedule`), items are renumbered by position (ids stay unique integers, as the rollout
    seeds need) and tagged with their ``source`` (a row's own ``source`` column becomes ``row_source``); the
    held-out list is the union of the sources', each item tagged too. ``sources`` maps a name to (weight > 0,
    dataset); ``reward_fn`` is the mixture's reward (by default each item is scored by its source's own
    verifier). The counters are summed (``data_epoch``: the largest) and given per source as
    ``KEY/NAME``. Drawing the first n items always gives the same items, so a resumed run that skips the
    items it drew continues where it stopped."""
    if not sources:
        raise ConfigError("train_dataset.mixture: no sources")
    names = list(sources)
    schedule = MixtureSchedule(names, [w for w, _ in sources.values()], seed)
    streams = [data.train for _, data in sources.values()]
    valid, held = [], set()  # the sources' held-out items, each prompt once (one file in two entries: once)
    for name, (_, data) in sources.items():
        for item in data.valid:
            key = _prompt_key(item)
            if key not in held:
                held.add(key)
                valid.append(_tagged(item, name))

    def unheld(k: int) -> dict:
        """Source k's next item whose prompt no source holds out (another entry may read the same data)."""
        for _ in range(MAX_SKIPS_IN_A_ROW):
            item = next(streams[k])
            if _prompt_key(item) not in held:
                return item
        raise ConfigError(f"train_dataset.mixture: source '{names[k]}' yields only prompts that the mixture holds "
                          f"out ({MAX_SKIPS_IN_A_ROW} in a row)")

    def interleaved() -> Iterator[dict]:
        for position in itertools.count():
            k = schedule.index(position)
            yield {**_tagged(unheld(k), names[k]), "id": position}

    def stats() -> dict:
        per_source = {name: data.stats() for name, (_, data) in sources.items()}
        out = {"data_bad_rows": 0, "data_skipped_long": 0, "data_epoch": 0}
        for name, counters in per_source.items():
            for key, value in counters.items():
                out[key] = max(out.get(key, 0), value) if key == "data_epoch" else out.get(key, 0) + value
                out[f"{key}/{name}"] = value
        return out

    if reward_fn is None:
        from asyncrl.reward.base import MixtureReward, SourceReward

        reward_fn = MixtureReward({name: SourceReward(data.reward_fn) for name, (_, data) in sources.items()})
    return Dataset(interleaved(), valid, reward_fn, stats, schedule)


def _tagged(item: dict, source: str) -> dict:
    """``item`` with its mixture ``source``; a row's own ``source`` column is kept as ``row_source``."""
    if "source" in item:
        item = {**item, "row_source": item["source"]}
    return {**item, "source": source}


def split_sizes(total: int, weights: list[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainders), at least 1 each."""
    shares = [total * w / sum(weights) for w in weights]
    sizes = [int(s) for s in shares]
    for i in sorted(range(len(shares)), key=lambda i: sizes[i] - shares[i])[: total - sum(sizes)]:
        sizes[i] += 1
    return [max(1, n) for n in sizes]


# ---- assembling a dataset -------------------------------------------------------------------------------
def _generated(raw_held_out: list[dict], raw_stream: Iterator[dict], reward_fn, source: str, template: str,
               tokenizer, max_prompt_tokens: int | None) -> Dataset:
    """A generated source: held-out questions are compared as generated (before the template) and skipped."""
    counters = _Counters()
    limit = _PromptLimit(tokenizer, max_prompt_tokens, counters)
    exclude = {it["question"] for it in raw_held_out}
    held_out = list(limit.filter(_templated(raw_held_out, template, source)))
    stream = limit.filter(_templated(_excluding(raw_stream, exclude, source), template, source))
    return _dataset(stream, held_out, reward_fn, counters)


def _dataset(stream: Iterator[dict], held_out: list[dict], reward_fn, counters: "_Counters") -> Dataset:
    """The Dataset, with the stream's first item drawn now so that a stream that cannot yield (everything held
    out or too long, a template that does not fit) is a ConfigError before anything runs."""
    if not held_out:
        raise ConfigError(f"valid_dataset: the held-out split is empty (every row was bad or longer than "
                          f"{LIMIT_KEY})")
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
                raise ConfigError(f"{source}: {in_a_row} problems in a row were held-out ones; the task has too "
                                  "few distinct problems for valid_dataset.size")
            continue
        in_a_row = 0
        yield item


def _templated(items: Iterable[dict], template: str, source: str) -> Iterator[dict]:
    """Items with ``question`` rebuilt by ``template`` (unchanged when it is empty)."""
    for item in items:
        if template:
            try:
                item = {**item, "question": apply_template(template, item),
                        UNTEMPLATED: item.get(UNTEMPLATED, item["question"])}
            except ValueError as e:
                raise ConfigError(f"{e} (the items of {source})") from None
        yield item


def _warn_overlap(held_out: list[dict], items: list[dict], valid_path: str, path: str) -> None:
    shared = {it["question"] for it in held_out} & {it["question"] for it in items}
    if shared:
        log.warning("%d of the %d held-out questions of valid_dataset.path '%s' are also training rows of '%s': "
                    "the model trains on them", len(shared), len(held_out), valid_path, path)


def _epochs(items: list[dict], seed: int, shuffle: bool, counters: "_Counters") -> Iterator[dict]:
    for epoch in itertools.count():
        counters.set("data_epoch", epoch)
        order = list(range(len(items)))
        if shuffle:
            random.Random(seed + epoch).shuffle(order)
        for i in order:
            yield items[i]


CONTEXT_COLUMNS = ("context", "input")
"""Columns that hold the text a question is about (Dolly, Alpaca): only a prompt template puts them in the prompt."""


class _RowLoader:
    """Rows -> items with a row format (``row_type``, 'auto' = detected from the first usable row), a field
    mapping and a prompt template; bad rows skipped and counted or raised (``skip_bad_rows``)."""

    def __init__(self, row_type: str, fields: dict, template: str, skip_bad_rows: bool, counters: "_Counters"):
        self.row_type = None if row_type == "auto" else row_type
        self.fields, self.template, self.skip_bad_rows, self.counters = fields, template, skip_bad_rows, counters
        self.bad: list[str] = []
        self.places: dict[int, str] = {}  # id of an item -> its file and line, for what is said of it later
        self.warned_context = False

    def where(self, item: dict) -> str | None:
        return self.places.get(id(item))

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
            if self.row_type is None and isinstance(row.data, dict):  # the first row that is an object decides
                self.row_type = detect_type(row.data, self.fields)
                log.info("train_dataset.type=auto: %s looks like '%s' rows", row.where, self.row_type)
            item = to_item(row.data, self.row_type, self.fields, self.template)
            self.places[id(item)] = row.where
            self._check_context(row)
            return item
        except ValueError as e:
            return self._bad(f"{row.where}: {e}")

    def _check_context(self, row: Row) -> None:
        """Say once that a row's context column (Dolly's ``context``, Alpaca's ``input``) is not in the prompt
        unless ``prompt_template`` puts it there: the model would be asked about a text it never sees."""
        if self.template or self.warned_context or not isinstance(row.data, dict):
            return
        column = next((c for c in CONTEXT_COLUMNS if isinstance(row.data.get(c), str) and row.data[c].strip()), None)
        if column is not None and self.row_type != "chat":
            self.warned_context = True
            log.warning("%s: the column '%s' is not part of the prompt (only the question is); to ask with it, set "
                        "train_dataset.prompt_template, e.g. '{question}\\n\\n{%s}'", row.where, column, column)

    def _bad(self, message: str) -> None:
        if not self.skip_bad_rows:
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
    """Tokenises prompts with the chat template (``prompt_ids``) and drops those over ``max_tokens`` (None = no
    limit)."""

    tokenizer: object
    max_tokens: int | None
    counters: _Counters
    skip_bad_rows: bool = True  # a row the chat template rejects: skipped and counted, else a ConfigError
    where: Callable[[dict], str | None] = lambda item: None  # an item's file and line, where known
    warned: bool = False

    def filter(self, items: Iterable[dict]) -> Iterator[dict]:
        if self.tokenizer is None:
            if self.max_tokens and not self.warned:
                self.warned = True
                log.warning("a prompt limit of %d tokens needs a tokenizer; prompts are not checked", self.max_tokens)
            yield from items
            return
        in_a_row, finite = 0, isinstance(items, (list, tuple))
        for item in items:
            try:
                ids = item_prompt_ids(self.tokenizer, item)
            except Exception as e:  # noqa: BLE001 - a chat template rejects a conversation in many ways (jinja)
                place = self.where(item) or f"item {item.get('source_id', item.get('id'))}"
                why = f"{place}: the chat template rejects the row ({type(e).__name__}: {str(e)[:200]})"
                if not self.skip_bad_rows:
                    raise ConfigError(why + " (train_dataset.skip_bad_rows=true skips such rows)") from None
                if self.counters.add("data_bad_rows") == 1:
                    log.warning("skipping a row: %s; further ones are counted in data_bad_rows", why)
                continue
            if self.max_tokens and len(ids) > self.max_tokens:
                if self.counters.add("data_skipped_long") == 1:
                    log.warning("skipping a prompt of %d tokens, over the limit of %d (%s); further ones are "
                                "counted in data_skipped_long", len(ids), self.max_tokens, LIMIT_KEY)
                in_a_row += 1
                if in_a_row >= MAX_SKIPS_IN_A_ROW and not finite:  # an endless stream, every prompt too long
                    raise ConfigError(f"{in_a_row} prompts in a row are longer than {self.max_tokens} tokens "
                                      f"({LIMIT_KEY})")
                continue
            in_a_row = 0
            yield {**item, "prompt_ids": ids}
