"""The whole bring-your-own-task path of docs/your-task.md, run as a user runs it: a JSONL of an invented task
(sorting words, not arithmetic) and a reward function by import path; `asyncrl init-model --corpus`,
`asyncrl eval`, `asyncrl sft`, `asyncrl train`, `asyncrl eval` again. Held-out accuracy must rise after SFT
and again after RL (shorter budgets than the docs' walk-through)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

ASYNCRL = str(Path(sys.executable).with_name("asyncrl"))
REWARD = "reward.fn=examples.your_task.reward:sorted_words"


def run(*args: str) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def summary(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def evaluate(model: Path, data: Path, out: Path) -> dict:
    record = summary(
        run(
            ASYNCRL,
            "eval",
            "--model",
            str(model),
            f"valid_dataset.path={data / 'test.jsonl'}",
            REWARD,
            "gconfig.max_new_tokens=16",
            f"output={out}",
        )
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == record["n"] == 100
    assert record["eval_accuracy"] == pytest.approx(sum(r["n_correct"] for r in rows) / 100)
    return record


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_jsonl_and_reward_to_a_trained_policy(tmp_path):
    data, init, sft = tmp_path / "data", tmp_path / "init", tmp_path / "sft"
    run(
        sys.executable,
        "examples/your_task/make_data.py",
        "--out",
        str(data),
        "--sft",
        "3000",
        "--train",
        "5000",
        "--test",
        "100",
    )
    run(ASYNCRL, "init-model", "--corpus", str(data / "train.jsonl"), "--out", str(init))
    before = evaluate(init, data, tmp_path / "eval0.jsonl")

    run(
        ASYNCRL,
        "sft",
        "--config",
        "examples/your_task/sft.yaml",
        f"model.path={init}",
        f"train_dataset.path={data / 'sft.jsonl'}",
        f"valid_dataset.path={data / 'test.jsonl'}",
        "total_train_steps=150",
        "evaluator.freq_steps=0",
        f"output_dir={sft}",
    )
    after_sft = evaluate(sft, data, tmp_path / "eval1.jsonl")

    out = summary(
        run(
            ASYNCRL,
            "train",
            "--config",
            "examples/your_task/train.yaml",
            f"model.path={sft}",
            f"train_dataset.path={data / 'train.jsonl'}",
            f"valid_dataset.path={data / 'test.jsonl'}",
            f"output_dir={tmp_path / 'runs'}",
            "total_train_steps=20",
            "evaluator.freq_steps=0",
            "rollout.max_head_offpolicyness=0",
            "saver.freq_steps=20",
            "progress_bar=false",
            "report=false",
        )
    )
    assert out["step"] == 20
    checkpoints = tmp_path / "runs" / "your_task" / "default" / "checkpoints"
    latest = checkpoints / (checkpoints / "latest").read_text().strip()
    after_rl = evaluate(latest, data, tmp_path / "eval2.jsonl")

    # Measured (2 cores, a loaded machine; the commands above with evaluations along the way): SFT's held-out
    # accuracy 0.0 / 0.23 / 0.31 at steps 50 / 100 / 150; RL from 0.31: 0.35 / 0.38 / 0.40 / 0.40 at steps
    # 10 / 20 / 30 / 40 (docs/your-task.md's η = 2 run: +0.045 at 10, +0.075 at 20). So 150 SFT steps clear the
    # +0.15 by twice over and 20 RL steps the +0.03 by about twice; 10 RL steps would not.
    accuracy = [r["eval_accuracy"] for r in (before, after_sft, after_rl)]
    assert accuracy[0] < 0.05 and accuracy[1] > accuracy[0] + 0.15 and accuracy[2] > accuracy[1] + 0.03, accuracy
