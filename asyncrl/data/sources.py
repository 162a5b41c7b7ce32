"""Reading rows from local files, each row tagged with where it came from (``file:line`` or ``file row N``).

Formats: JSON Lines (``.jsonl``, and ``.json`` written as lines), a JSON array (``.json``), Parquet (needs
pyarrow, extra ``data``) and a directory written by ``datasets``' ``save_to_disk`` (needs datasets). Nothing
is ever fetched from a hub: a path that does not exist is an error, not a dataset name. JSON text is UTF-8,
with or without a byte-order mark; JSON Lines are split at ``\n`` only, so a line separator (U+2028) or NEL
inside a string stays in its row, and a line that is not UTF-8 costs that row only.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from asyncrl.configlib import ConfigError

PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # the directory that holds the asyncrl package


@dataclass(frozen=True)
class Row:
    """One raw record and its provenance, e.g. ``data/train.jsonl:17``."""

    where: str
    data: Any


class RowError(ValueError):
    """A malformed row; the message starts with the row's file and line."""


def resolve_path(path: str, key: str) -> Path:
    """``path`` as given, or relative to the directory holding asyncrl (for the shipped sample files)."""
    p = Path(path).expanduser()
    if p.exists():
        return p
    if not p.is_absolute() and (PACKAGE_PARENT / p).exists():
        return PACKAGE_PARENT / p
    raise ConfigError(f"{key}: '{path}' does not exist (a local .jsonl/.json/.parquet file or a saved "
                      "datasets directory is expected; nothing is downloaded)")


def read_rows(path: Path, split: str, key: str) -> Iterator[Row | RowError]:
    """Every row of ``path``; unreadable rows come out as :class:`RowError` so the caller decides."""
    if path.is_dir():
        yield from _saved_dataset_rows(path, split, key)
    elif path.suffix == ".parquet":
        yield from _parquet_rows(path, key)
    elif path.suffix in (".jsonl", ".json", ".ndjson"):
        yield from _json_rows(path, _read_bytes(path, key).removeprefix(codecs.BOM_UTF8))
    else:
        raise ConfigError(f"{key}: cannot read '{path}': expected .jsonl, .json, .parquet or a datasets directory")


def _read_bytes(path: Path, key: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{key}: cannot read '{path}' ({e.strerror or e})") from None


def _json_rows(path: Path, raw: bytes) -> Iterator[Row | RowError]:
    if path.suffix == ".json" and raw.lstrip().startswith(b"["):
        yield from _json_array_rows(path, raw)
        return
    for lineno, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            yield Row(f"{path}:{lineno}", json.loads(line.decode("utf-8")))
        except UnicodeDecodeError as e:
            yield RowError(f"{path}:{lineno}: not UTF-8 text ({e.reason} at byte {e.start} of the line)")
        except json.JSONDecodeError as e:
            yield RowError(f"{path}:{lineno}: not valid JSON ({e.msg}, column {e.colno})")


def _json_array_rows(path: Path, raw: bytes) -> Iterator[Row | RowError]:
    try:
        records = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        yield RowError(f"{path}:{line}: not UTF-8 text ({e.reason})")
        return
    except json.JSONDecodeError as e:
        yield RowError(f"{path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno})")
        return
    for i, record in enumerate(records, 1):
        yield Row(f"{path} item {i}", record)


def _parquet_rows(path: Path, key: str) -> Iterator[Row | RowError]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"{key}: reading '{path}' needs pyarrow: pip install 'asyncrl[data]'") from None
    try:
        pfile = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a damaged file
        raise ConfigError(f"{key}: '{path}' is not a readable Parquet file ({e})") from e
    n = 0
    for batch in pfile.iter_batches():
        for record in batch.to_pylist():
            n += 1
            yield Row(f"{path} row {n}", record)


def _saved_dataset_rows(path: Path, split: str, key: str) -> Iterator[Row | RowError]:
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"{key}: reading the saved dataset '{path}' needs datasets: pip install "
                          "'asyncrl[data]'") from None
    try:
        ds = datasets.load_from_disk(str(path))
    except FileNotFoundError as e:
        raise ConfigError(f"{key}: '{path}' is a directory but not one written by save_to_disk ({e})") from e
    where = str(path)
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            split_key = key.rsplit(".", 1)[0] + ".split"
            raise ConfigError(f"{split_key}: '{path}' has no split '{split}'; it has {sorted(ds)}")
        ds, where = ds[split], f"{path}[{split}]"
    for i, record in enumerate(ds, 1):
        yield Row(f"{where} row {i}", record)
