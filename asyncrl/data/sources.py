"""Reading rows from local files, each row tagged with where it came from (``file:line`` or ``file row N``).

Formats: JSON Lines (``.jsonl``, and ``.json`` written as lines), a JSON array (``.json``), Parquet (needs
pyarrow, extra ``data``), a directory written by ``datasets``' ``save_to_disk`` (needs datasets) and a hub
dataset already in the local Hugging Face cache, by name (``org/name``, or ``org/name/CONFIG`` for one of its
folders; its split's files are read). Nothing is ever fetched from a hub: a path that is neither a local file
nor a cached dataset is an error. JSON text is UTF-8,
with or without a byte-order mark; JSON Lines are split at ``\n`` only, so a line separator (U+2028) or NEL
inside a string stays in its row, and a line that is not UTF-8 costs that row only.
"""

from __future__ import annotations

import codecs
import json
import re
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
    cached = hub_dataset_dir(path)
    if cached is not None:
        return cached
    raise ConfigError(
        f"{key}: '{path}' does not exist (a local .jsonl/.json/.parquet file, a saved datasets "
        "directory or a hub dataset already in the local Hugging Face cache is expected; nothing is "
        "downloaded)"
    )


def hub_dataset_dir(name: str) -> Path | None:
    """The local snapshot of hub dataset ``org/name`` (``org/name/FOLDER``: that folder of it) in the Hugging Face
    cache, without any download; None when it is not there (or ``name`` is not a hub name)."""
    parts = name.split("/")
    if len(parts) < 2 or not all(re.fullmatch(r"[\w.-]+", part) for part in parts) or name.startswith("."):
        return None
    try:
        from huggingface_hub import snapshot_download

        root = Path(snapshot_download("/".join(parts[:2]), repo_type="dataset", local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, not a valid name, or no huggingface_hub: not a hub dataset here
        return None
    found = root.joinpath(*parts[2:])
    return found if found.exists() else None


def read_rows(path: Path, split: str, key: str) -> Iterator[Row | RowError]:
    """Every row of ``path``; unreadable rows come out as :class:`RowError` so the caller decides."""
    if path.is_dir() and not any((path / f).is_file() for f in SAVED_DATASET_FILES):
        for file in split_files(path, split, key):
            yield from read_rows(file, split, key)
    elif path.is_dir():
        yield from _saved_dataset_rows(path, split, key)
    elif path.suffix == ".parquet":
        yield from _parquet_rows(path, key)
    elif path.suffix in (".jsonl", ".json", ".ndjson"):
        yield from json_lines(path, _read_bytes(path, key))
    else:
        raise ConfigError(f"{key}: cannot read '{path}': expected .jsonl, .json, .parquet or a datasets directory")


SAVED_DATASET_FILES = ("dataset_dict.json", "dataset_info.json", "state.json")  # what save_to_disk writes
DATA_SUFFIXES = (".parquet", ".jsonl", ".json", ".ndjson")


def split_files(folder: Path, split: str, key: str) -> list[Path]:
    """The data files of ``split`` in a folder of files (a hub dataset's snapshot): those whose path names the
    split (``train-00000-of-00001.parquet``, ``data/test.jsonl``, ``train/0.parquet``, ``gsm8k_train.jsonl``), in
    order; ``train_sft-...`` is another split (``train_sft``), not ``train``."""
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.suffix in DATA_SUFFIXES
        and p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )
    named = [p for p in files if re.search(rf"(^|[/_.-]){re.escape(split)}([/.-]|$)", p.relative_to(folder).as_posix())]
    if not named:
        found = ", ".join(p.relative_to(folder).as_posix() for p in files[:6]) or "no .parquet/.jsonl/.json file"
        raise ConfigError(
            f"{key}: '{folder}' has no file of split '{split}' ({found}); set "
            f"{key.rsplit('.', 1)[0]}.split or name the file"
        )
    folders = sorted({p.relative_to(folder).parts[0] for p in named if len(p.relative_to(folder).parts) > 1})
    if len(folders) > 1 and all(not re.search(rf"{re.escape(split)}", f) for f in folders):
        raise ConfigError(
            f"{key}: '{folder}' holds several configurations ({', '.join(folders)}): name one, "
            f"add /{folders[0]} to the dataset name"
        )
    return named


def _read_bytes(path: Path, key: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{key}: cannot read '{path}' ({e.strerror or e})") from None


def json_lines(path: Path, raw: bytes) -> Iterator[Row | RowError]:
    """The rows of a JSON Lines file's bytes (a ``.json`` array too; a byte-order mark first is dropped), a bad
    line a RowError naming it."""
    raw = raw.removeprefix(codecs.BOM_UTF8)
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
        except RecursionError:
            yield RowError(f"{path}:{lineno}: nested deeper than a JSON row may be")


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
    except RecursionError:
        yield RowError(f"{path}: nested deeper than a JSON file may be")
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
    n, batches = 0, pfile.iter_batches()
    while True:
        try:
            batch = next(batches, None)
        except Exception as e:  # noqa: BLE001 - a damaged page: pyarrow raises OSError and others
            raise ConfigError(f"{key}: '{path}' cannot be read after row {n} (a damaged page?): {e}") from e
        if batch is None:
            return
        for record in batch.to_pylist():
            n += 1
            yield Row(f"{path} row {n}", record)


def _saved_dataset_rows(path: Path, split: str, key: str) -> Iterator[Row | RowError]:
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            f"{key}: reading the saved dataset '{path}' needs datasets: pip install 'asyncrl[data]'"
        ) from None
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
