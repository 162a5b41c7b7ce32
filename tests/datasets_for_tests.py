"""Rows, files and datasets built from the dataset sections, for the tests of asyncrl.data."""

import itertools
import json
from pathlib import Path

from asyncrl.data.config import TaskConfig, TrainDatasetConfig, ValidDatasetConfig, dataset_from_config

ROWS = [{"question": f"Compute {i} + 1.", "answer": str(i + 1)} for i in range(20)]
SAMPLES = "asyncrl/assets/data"  # the shipped sample files, relative to the repository root


def write_jsonl(path: Path, rows, **dumps) -> str:
    """One row a line: a dict as JSON (``json.dumps(row, **dumps)``), a string as it is (a malformed row)."""
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r, **dumps)) + "\n" for r in rows), encoding="utf-8"
    )
    return str(path)


def build(path="", valid_path="", valid_size=5, task=None, tokenizer=None, default_max_prompt_tokens=None, **train):
    """The dataset of the built-in task (or ``task``) or of the file at ``path``, as a run would build it."""
    return dataset_from_config(
        task or TaskConfig(),
        TrainDatasetConfig(path=path, **train),
        ValidDatasetConfig(path=valid_path, size=valid_size),
        tokenizer=tokenizer,
        default_max_prompt_tokens=default_max_prompt_tokens,
    )


def take(stream, n):
    return list(itertools.islice(stream, n))


def questions(data, n=200) -> set[str]:
    """The questions of the first ``n`` training items and of the held-out split."""
    return {it["question"] for it in itertools.islice(data.train, n)} | {it["question"] for it in data.valid}
