"""Rows of a file to items: the loader (a row format, detected or given, a field mapping, a prompt template, bad
rows skipped and counted or refused), and the check every item passes before it is used: its prompt tokenised
with the chat template (``prompt_ids``) and dropped when over the limit, with the counters of both.

A bad row costs one row: it is skipped, logged with its file and line and counted (``skip_bad_rows=False``
makes it an error). With a tokenizer, prompts longer than ``max_prompt_tokens`` are skipped and counted,
held-out ones included, never crashed on.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from asyncrl.configlib import ConfigError
from asyncrl.data.formats import detect_type, item_prompt_ids, to_item
from asyncrl.data.sources import Row, RowError, read_rows

log = logging.getLogger(__name__)

BAD_ROWS_LOGGED = 5
MAX_SKIPS_IN_A_ROW = 10_000
LIMIT_KEY = "train_dataset.max_prompt_tokens; by default the model's context minus gconfig.max_new_tokens"


CONTEXT_COLUMNS = ("context", "input")
"""Columns that hold the text a question is about (Dolly, Alpaca): only a prompt template puts them in the prompt."""


class RowLoader:
    """Rows -> items with a row format (``row_type``, 'auto' = detected from the first usable row), a field
    mapping and a prompt template; bad rows skipped and counted or raised (``skip_bad_rows``)."""

    def __init__(self, row_type: str, fields: dict, template: str, skip_bad_rows: bool, counters: "Counters"):
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
            log.warning(
                "%s: the column '%s' is not part of the prompt (only the question is); to ask with it, set "
                "train_dataset.prompt_template, e.g. '{question}\\n\\n{%s}'",
                row.where,
                column,
                column,
            )

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
class Counters:
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
class PromptLimit:
    """Tokenises prompts with the chat template (``prompt_ids``) and drops those over ``max_tokens`` (None = no
    limit)."""

    tokenizer: object
    max_tokens: int | None
    counters: Counters
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
                    log.warning(
                        "skipping a prompt of %d tokens, over the limit of %d (%s); further ones are "
                        "counted in data_skipped_long",
                        len(ids),
                        self.max_tokens,
                        LIMIT_KEY,
                    )
                in_a_row += 1
                if in_a_row >= MAX_SKIPS_IN_A_ROW and not finite:  # an endless stream, every prompt too long
                    raise ConfigError(
                        f"{in_a_row} prompts in a row are longer than {self.max_tokens} tokens ({LIMIT_KEY})"
                    )
                continue
            in_a_row = 0
            yield {**item, "prompt_ids": ids}
