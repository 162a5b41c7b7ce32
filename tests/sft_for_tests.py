"""What the SFT tests share: prompt + response rows, chat rows, a JSONL writer, a dataset and an SFTConfig for a
test run, the metrics of a run, and the masked spans of an example."""

import json
from pathlib import Path

from asyncrl import configlib
from asyncrl.config import SFTConfig
from asyncrl.data.config import TaskConfig, TrainDatasetConfig, ValidDatasetConfig, dataset_from_config

from conftest import TESTS

TEMPLATES = TESTS / "data_fixtures" / "chat_templates"
PAIRS = [
    {"question": f"What is {a} plus {b}?", "response": f"{a}+{b}={a + b}. The answer is {a + b}.", "answer": str(a + b)}
    for a in range(2, 8)
    for b in range(3, 7)
]  # 24 rows
CHATS = [
    {
        "messages": [
            {"role": "system", "content": "Answer with the sum."},
            {"role": "user", "content": f"Add {a} and {b}."},
            {"role": "assistant", "content": f"{a}+{b}={a + b}."},
            {"role": "user", "content": f"And {a} and {b + 1}?"},
            {"role": "assistant", "content": f"The answer is {a + b + 1}."},
        ],
        "answer": str(a + b + 1),
    }
    for a in range(2, 7)
    for b in range(3, 7)
]  # 20 rows


def write_jsonl(path: Path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def build(path, tokenizer, valid_size=2, **train):
    return dataset_from_config(
        TaskConfig(), TrainDatasetConfig(path=path, **train), ValidDatasetConfig(size=valid_size), tokenizer=tokenizer
    )


def config(tmp_path, model_dir, *overrides) -> SFTConfig:
    return configlib.load(
        SFTConfig,
        None,
        [
            f"model.path={model_dir}",
            f"output_dir={tmp_path / 'out'}",
            "actor.threads=1",
            "train_dataset.batch_size=4",
            "actor.warmup_steps=1",
            "actor.lr=3e-3",
            "valid_dataset.size=2",
            "gconfig.max_new_tokens=8",
            *overrides,
        ],
    )


def metrics(out) -> list[dict]:
    return [json.loads(line) for line in (Path(out) / "sft_metrics.jsonl").read_text().splitlines()]


def spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The runs of consecutive masked tokens."""
    out, run = [], []
    for t, m in zip(ids, mask):
        if m:
            run.append(t)
        elif run:
            out.append(run)
            run = []
    return out + ([run] if run else [])
