"""Runs of `asyncrl train` for the tests: the keys of a quick run of a tiny model (in process: ``quick_config``),
and as a process, for the tests that kill, signal and resume runs: a prompt file, the command with a tiny budget,
and what a run directory, a checkpoint and the process tree look like from outside."""

import json
import os
import subprocess
import sys
from pathlib import Path

from asyncrl import configlib
from asyncrl.config import TrainConfig

from conftest import ROOT, TESTS

QUICK_RUN = (
    "progress_bar=false",
    "report=false",
    "train_dataset.batch_size=2",
    "gconfig.n_samples=2",
    "valid_dataset.size=4",
    "evaluator.freq_steps=0",
    "rollout.max_slots=8",
    "reward.fn=rewards_for_tests:digit_count_reward",
    "reward.workers=0",
)
"""What the quick runs of the tests share: two groups of two samples a step, four held-out items, no evaluation
before the end, the digit-count reward in process. Each test adds its own keys (later keys win)."""

EVALUATED_RUN = (
    "progress_bar=false",
    "report=false",
    "total_train_steps=5",
    "train_dataset.batch_size=2",
    "gconfig.n_samples=4",
    "gconfig.max_new_tokens=24",
    "valid_dataset.size=8",
    "evaluator.freq_steps=2",
    "rollout.max_slots=16",
    "actor.lr=1e-3",
    "reward.fn=rewards_for_tests:digit_count_reward",
)
"""Five steps of groups of four, evaluated every two steps, the reward in worker processes."""


def quick_overrides(tmp_path, model_path, *overrides, base: tuple[str, ...] = QUICK_RUN) -> list[str]:
    """The override keys of a run of ``model_path`` into ``tmp_path``: ``base``, then ``overrides``."""
    return [f"model.path={model_path}", f"output_dir={tmp_path}", *base, *overrides]


def quick_config(tmp_path, model_path, *overrides, base: tuple[str, ...] = QUICK_RUN) -> TrainConfig:
    """The ``TrainConfig`` of ``quick_overrides``."""
    return configlib.load(TrainConfig, None, quick_overrides(tmp_path, model_path, *overrides, base=base))


CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "trainer.pt", "run.json", "rollouts.pt")


def prompt_files(tmp_path: Path, n: int) -> tuple[Path, Path]:
    """``n`` training prompts and 4 held-out ones, as JSONL question/answer rows."""
    train, valid = tmp_path / "prompts.jsonl", tmp_path / "valid.jsonl"
    train.write_text(
        "".join(json.dumps({"question": f"Compute {i} + 7.", "answer": str(i + 7)}) + "\n" for i in range(n))
    )
    valid.write_text(
        "".join(json.dumps({"question": f"Compute {i} + 1.", "answer": str(i + 1)}) + "\n" for i in range(100, 104))
    )
    return train, valid


def train_command(tmp_path, model, train, valid, steps, *extra):
    """`python -m asyncrl.cli train` of ``model`` for ``steps`` steps into tmp_path/out, a checkpoint every step."""
    return [
        sys.executable,
        "-m",
        "asyncrl.cli",
        "train",
        f"model.path={model}",
        f"output_dir={tmp_path / 'out'}",
        f"train_dataset.path={train}",
        f"valid_dataset.path={valid}",
        "train_dataset.type=qa",
        "reward.fn=rewards_for_tests:digit_count_reward",
        "reward.workers=0",
        f"total_train_steps={steps}",
        "train_dataset.batch_size=2",
        "gconfig.n_samples=2",
        "gconfig.max_new_tokens=12",
        "rollout.max_slots=8",
        "rollout.max_head_offpolicyness=1",
        "saver.freq_steps=1",
        "evaluator.freq_steps=4",
        "evaluator.background=false",  # evaluation records in step order whatever the machine's cores (auto)
        "max_train_time_s=0",
        "progress_bar=false",
        "report=false",
        *extra,
    ]


def train_env():
    """The environment of a run the tests start: offline, and tests/ importable (reward functions by path)."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}"}


def is_complete(checkpoint: Path) -> bool:
    return all((checkpoint / f).is_file() and (checkpoint / f).stat().st_size > 0 for f in CHECKPOINT_FILES)


def latest_checkpoint(run: Path) -> Path | None:
    latest = run / "checkpoints" / "latest"
    return run / "checkpoints" / latest.read_text().strip() if latest.exists() else None


def last_logged_step(run: Path) -> int:
    """The last step in metrics.jsonl (-1 if none yet; a torn last line is skipped)."""
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return -1
    for line in reversed(lines):
        try:
            return json.loads(line)["step"]
        except ValueError:
            continue
    return -1


def descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout.split()
    pairs = list(zip(map(int, out[::2]), map(int, out[1::2])))
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in pairs if pp == parent]
        found += kids
        frontier += kids
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
