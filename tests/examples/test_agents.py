"""The example agents of examples/agents, written with the official openai package and with the OpenAI Agents
SDK, train through the proxy unchanged: scripted engine replies (a lookup call, then the answer) reach them as
OpenAI tool calls over HTTP, their tool results come back, and the recorded tokens are the engine's."""

import asyncio
import importlib
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT))

pytest.importorskip("openai")
pytest.importorskip("fastapi")

from asyncrl.agent.workflow import AgentWorkflow  # noqa: E402

from engines_for_tests import ScriptedEngine, agent_context  # noqa: E402

ITEM = {
    "id": 3,
    "question": "How many apples do Zob and Quil have together?",
    "answer": "52",
    "facts": {"apples of Zob": 37, "apples of Quil": 15},
}


def _call(key: str) -> str:
    return f'<tool_call>{{"name": "lookup", "arguments": {{"key": "{key}"}}}}</tool_call>'


@pytest.mark.parametrize("module", ["examples.agents.openai_lookup", "examples.agents.agents_sdk_lookup"])
def test_example_agent_trains_through_the_proxy(tokenizer, module):
    if "sdk" in module:
        pytest.importorskip("agents")
    engine = ScriptedEngine(
        tokenizer, [_call("apples of Zob"), _call("apples of Quil"), "37 + 15 = 52\nThe answer is 52."]
    )
    from asyncrl.server.agent import serve_proxy

    workflow = AgentWorkflow(
        agent_context(tokenizer), episode=f"{module}:episode", client="openai", export="individual", serve=serve_proxy
    )
    try:
        group = asyncio.run(workflow.run(ITEM, engine))
    finally:
        workflow.close()
    assert len(engine.received) == 3, workflow.stats()
    tokens = [tokenizer.decode(p) for p in engine.received]
    assert "37" in tokens[1] and "15" in tokens[2]  # the tool results reached the model's next prompt
    assert [t.output_ids for t in group.trajectories] == engine.generated
    assert [t.reward for t in group.trajectories] == [1.0, 1.0, 1.0]
    assert workflow.stats()["agent_episode_failures"] == 0


def test_examples_import_without_running(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert callable(importlib.import_module("examples.agents.openai_lookup").episode)


@pytest.mark.slow
def test_the_agents_sdk_example_runs_rl_steps_end_to_end(tmp_path):
    """`asyncrl train` with the Agents SDK agent over HTTP (agent.client=openai) on the lookup task: a fresh tiny
    agent model (init-model --task lookup), two steps; the run trains on the calls the SDK made."""
    pytest.importorskip("agents")
    import json
    import os
    import subprocess

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    model = tmp_path / "agent-init"
    subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "init-model", "--task", "lookup", "--out", str(model)],
        check=True,
        capture_output=True,
        env=env,
        timeout=300,
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncrl.cli",
            "train",
            "--config",
            "examples/agent_lookup.yaml",
            f"model.path={model}",
            f"output_dir={tmp_path}",
            "progress_bar=false",
            "report=false",
            "agent.episode=examples.agents.agents_sdk_lookup:episode",
            "agent.client=openai",
            "agent.options={max_turns: 2}",
            "total_train_steps=2",
            "train_dataset.batch_size=2",
            "gconfig.n_samples=2",
            "gconfig.max_new_tokens=24",
            "valid_dataset.size=4",
            "evaluator.freq_steps=0",
            "max_train_time_s=0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = [
        json.loads(line) for line in (tmp_path / "agent_lookup" / "default" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[-1]["agent_calls"] >= 8 and records[-1]["agent_episode_failures"] == 0
