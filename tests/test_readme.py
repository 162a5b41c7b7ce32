"""Every command README.md shows runs as written, in a subprocess, as a new user would type it (with small
budgets appended, placeholders filled in). A command added to README.md without a runner here fails the
test, so the README and this test cannot drift apart."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT

BIN = Path(sys.executable).parent
TRAIN_BUDGET = [
    "total_train_steps=2",
    "max_train_time_s=0",
    "train_dataset.batch_size=2",
    "gconfig.n_samples=2",
    "valid_dataset.size=8",
    "progress_bar=false",
    "report=false",
]
SFT_BUDGET = ["total_train_steps=2", "train_dataset.batch_size=4", "evaluator.freq_steps=0", "valid_dataset.size=4"]


def readme_commands() -> list[str]:
    """The command lines of README.md's code blocks, without trailing comments."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line]


def _asyncrl() -> str:
    exe = BIN / "asyncrl"
    if not exe.exists():
        pytest.skip("the asyncrl entry point is not installed beside this interpreter (pip install -e .)")
    return str(exe)


def _run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
    }
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A fresh directory with the repository's examples/, as a user's checkout would have them."""
    d = tmp_path_factory.mktemp("user")
    (d / "examples").symlink_to(ROOT / "examples")
    return d


def _usage_placeholders(command: str) -> str:
    """``asyncrl train [--config FILE] [key.sub=value ...]`` -> ``asyncrl train``."""
    return " ".join(re.sub(r"\[[^\]]*\]", "", command).split())


@pytest.fixture(scope="module")
def trained_run(workdir):
    """RUN_DIR of the documented train command (builtin model, built-in task) with a tiny budget."""
    _run([_asyncrl(), "train", "output_dir=outputs", "experiment_name=readme", *TRAIN_BUDGET], workdir)
    return workdir / "outputs" / "readme" / "default"


def test_readme_commands_are_all_covered():
    known = {
        "make train",
        "make test",
        "asyncrl train",
        "asyncrl sft",
        "asyncrl eval --model PATH",
        "asyncrl rm train_dataset.path=PAIRS.jsonl",
        "asyncrl diagnose RUN_DIR",
        "asyncrl serve --model PATH --port N",
        "asyncrl report RUN_DIR",
        "asyncrl init-model --out DIR",
        "asyncrl train --help-config",
        "asyncrl init-model --out outputs/tiny-init",
        "asyncrl sft --config examples/sft_tiny.yaml",
        "asyncrl sft --config examples/sft_tiny_mix.yaml",
        "asyncrl init-model --task lookup --init-from builtin:tiny-sft --out outputs/agent-init",
        "asyncrl sft --config examples/sft_agent.yaml",
        "asyncrl train --config examples/agent_lookup.yaml",
    }
    commands = {_usage_placeholders(c) for c in readme_commands()}
    assert commands == known, f"README commands without a runner here: {commands - known}"


def test_ci_runs_the_readme_test_command():
    assert "make test" in readme_commands()
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1] == "make test"


@pytest.mark.parametrize("sub", ["train", "sft", "rm", "eval", "serve", "report", "diagnose", "plan", "init-model"])
def test_every_subcommand_has_help(sub, workdir):
    out = _run([_asyncrl(), sub, "--help"], workdir, timeout=60).stdout
    assert "usage: asyncrl " + sub in out


def test_help_config(workdir):
    out = _run([_asyncrl(), "train", "--help-config"], workdir, timeout=60).stdout
    assert "rollout.max_head_offpolicyness" in out and "workflow.name" in out


@pytest.mark.slow
def test_train_then_report_then_eval(trained_run, workdir):
    assert (trained_run / "metrics.jsonl").exists() and (trained_run / "checkpoints" / "step2").is_dir()
    samples = [json.loads(line) for line in (trained_run / "samples.jsonl").read_text().splitlines()]
    assert samples and {"prompt", "completion", "reward", "staleness"} <= set(samples[0])
    _run([_asyncrl(), "report", str(trained_run)], workdir)
    assert (trained_run / "report.html").exists()
    out = _run(
        [_asyncrl(), "eval", "--model", str(trained_run / "checkpoints" / "step2"), "valid_dataset.size=8"], workdir
    ).stdout
    assert '"eval_accuracy"' in out.strip().splitlines()[-1]


@pytest.mark.slow
def test_diagnose_a_run(trained_run, workdir):
    out = _run([_asyncrl(), "diagnose", str(trained_run)], workdir).stdout
    assert out.startswith("time: trainer") and "bottleneck:" in out


@pytest.mark.slow
def test_rm_on_preference_pairs_then_its_report(workdir):
    """The README's rm command on pairs made by examples/preference_pairs.py, then asyncrl report on its output."""
    _run([sys.executable, "examples/preference_pairs.py", "--n", "60", "--out", "PAIRS.jsonl"], workdir)
    _run(
        [
            _asyncrl(),
            "rm",
            "train_dataset.path=PAIRS.jsonl",
            "total_train_steps=3",
            "train_dataset.batch_size=4",
            "valid_dataset.size=8",
        ],
        workdir,
    )
    assert (workdir / "outputs" / "rm" / "config.json").is_file()
    _run([_asyncrl(), "report", "outputs/rm"], workdir)
    assert "asyncrl rm output" in (workdir / "outputs" / "rm" / "report.html").read_text()


@pytest.mark.slow
def test_make_train(tmp_path):
    installed = ROOT / ".venv" / ".installed"
    if not installed.exists() or installed.stat().st_mtime < (ROOT / "pyproject.toml").stat().st_mtime:
        pytest.skip("make train would (re)create .venv first; `make test` sets it up")
    if shutil.which("make") is None:
        pytest.skip("no make")
    args = " ".join([f"output_dir={tmp_path}", *TRAIN_BUDGET])
    _run(["make", "train", f"ARGS={args}"], ROOT)
    assert (tmp_path / "asyncrl" / "default" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_serve_answers_health(workdir):
    import httpx

    from asyncrl.engine.spawn import free_port

    port = free_port()
    proc = subprocess.Popen(
        [_asyncrl(), "serve", "--model", "builtin:tiny-sft", "--port", str(port)],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            pytest.fail("asyncrl serve did not answer /health within 120 s")
        r = httpx.post(
            f"http://127.0.0.1:{port}/generate",
            json={"text": "Compute 1 + 2.", "sampling_params": {"max_new_tokens": 4}},
        )
        assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] >= 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_checkpoint_recipe(workdir):
    """The three commands that reproduce the shipped checkpoint, with tiny step counts."""
    _run([_asyncrl(), "init-model", "--out", "outputs/tiny-init"], workdir)
    _run([_asyncrl(), "sft", "--config", "examples/sft_tiny.yaml", *SFT_BUDGET], workdir)
    _run([_asyncrl(), "sft", "--config", "examples/sft_tiny_mix.yaml", *SFT_BUDGET], workdir)
    assert (workdir / "outputs" / "tiny-sft-mix" / "config.json").exists()


@pytest.mark.slow
def test_agent_checkpoint_recipe(workdir):
    """The commands that reproduce builtin:tiny-agent and train it with RL, with tiny budgets."""
    _run(
        [
            _asyncrl(),
            "init-model",
            "--task",
            "lookup",
            "--init-from",
            "builtin:tiny-sft",
            "--out",
            "outputs/agent-init",
        ],
        workdir,
    )
    _run([_asyncrl(), "sft", "--config", "examples/sft_agent.yaml", *SFT_BUDGET, "saver.freq_steps=0"], workdir)
    assert (workdir / "outputs" / "tiny-agent" / "config.json").exists()
    _run([_asyncrl(), "train", "--config", "examples/agent_lookup.yaml", "output_dir=outputs", *TRAIN_BUDGET], workdir)
    assert (workdir / "outputs" / "agent_lookup" / "default" / "metrics.jsonl").exists()
