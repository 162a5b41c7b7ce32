"""examples/agent_lookup.yaml as a user runs it: RL from builtin:tiny-agent raises held-out accuracy."""

import json

import pytest

from conftest import ROOT


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_rl_from_the_shipped_tiny_agent_raises_held_out_accuracy(tmp_path):
    """examples/agent_lookup.yaml as a user runs it, 10 steps at actor.lr=2e-4 instead of 10 minutes at 5e-5:
    held-out accuracy (100 problems, greedy) rises by more than 10 points. Measured (2 cores, a loaded machine,
    2.5 min a run): 0.43 -> 0.75 at step 10 in three runs (seed 1, the default, as here; seed 1 evaluated every 5
    steps, still 0.43 at step 5; seed 2), a margin of three times the 10 points. At 5e-5 the rise comes between
    steps 20 and 40 (docs/agents.md: 0.42 -> 0.755 in 40 steps, on 200)."""
    import os
    import subprocess
    import sys

    try:
        from asyncrl.models.hf import resolve_model_path

        resolve_model_path("builtin:tiny-agent")
    except FileNotFoundError:
        pytest.skip("builtin:tiny-agent is not shipped")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncrl.cli",
            "train",
            "--config",
            "examples/agent_lookup.yaml",
            f"output_dir={tmp_path}",
            "total_train_steps=10",
            "actor.lr=2e-4",
            "max_train_time_s=0",
            "valid_dataset.size=100",
            "evaluator.freq_steps=10",
            "saver.freq_steps=0",
            "progress_bar=false",
            "report=false",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=840,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [
        json.loads(line) for line in (tmp_path / "agent_lookup" / "default" / "metrics.jsonl").read_text().splitlines()
    ]
    accuracy = [(m["step"], m["eval_accuracy"]) for m in metrics if "eval_accuracy" in m]
    assert accuracy[0][0] == 0 and accuracy[-1][0] == 10, accuracy
    assert accuracy[-1][1] > accuracy[0][1] + 0.10, accuracy
