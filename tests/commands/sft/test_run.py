"""`asyncrl sft` (asyncrl.commands.sft.run): a run on response rows lowers the loss and writes its metrics, chat rows
evaluated with a reward function by import path, errors naming the key and the file, over-long examples skipped
and counted, the progress bar on a terminal only, LoRA, the command on a JSONL, and train's key names."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asyncrl import configlib
from asyncrl.commands.sft.run import sft
from asyncrl.config import SFTConfig
from asyncrl.configlib import ConfigError

from sft_for_tests import CHATS, PAIRS, config, metrics, write_jsonl

# ---- prompt + response rows -----------------------------------------------------------------------------


def test_sft_on_response_rows_lowers_the_loss_and_writes_metrics(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    cfg = config(tmp_path, tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=12")
    record = sft(cfg)
    rows = metrics(cfg.output_dir)
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert all({"loss", "tokens", "elapsed_s"} <= set(r) and r["tokens"] > 0 for r in rows)
    assert "eval_accuracy" in rows[-1] and "eval_accuracy" not in rows[0] and record == rows[-1]
    assert sum(r["loss"] for r in rows[-3:]) / 3 < 0.7 * rows[0]["loss"]
    assert (Path(cfg.output_dir) / "config.json").exists() and (Path(cfg.output_dir) / "sft_config.yaml").exists()


# ---- chat rows ------------------------------------------------------------------------------------------


def test_sft_on_chat_rows_evaluates_with_a_reward_fn_by_import_path(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "chat.jsonl", CHATS)
    cfg = config(
        tmp_path,
        tiny_model_dir,
        f"train_dataset.path={path}",
        "total_train_steps=3",
        "reward.fn=rewards_for_tests:always_one_reward",
    )
    record = sft(cfg)
    assert record["eval_accuracy"] == 1.0 and record["eval_reward_errors"] == 0
    assert record["sft_turns_untrained"] == 0 and record["tokens"] > 0


def test_sft_stops_at_an_evaluation_whose_every_reward_call_fails(tmp_path, tiny_model_dir):
    """A reward that fails on every held-out item (a parameter no column gives) trained to the end reading 0.000
    (issue 44): the first evaluation stops the run in one line naming the failure and the fields the items have."""
    path = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    cfg = config(
        tmp_path,
        tiny_model_dir,
        f"train_dataset.path={path}",
        "total_train_steps=12",
        "reward.fn=rewards_for_tests:raising_reward",
    )
    with pytest.raises(
        ConfigError,
        match=r"reward.fn: the reward failed on every one of the \d+ held-out items.*"
        r"the items have the fields \[",
    ):
        sft(cfg)
    assert not (Path(cfg.output_dir) / "config.json").exists()  # no model saved as if it had been selected


# ---- packing --------------------------------------------------------------------------------------------


# ---- errors, skips --------------------------------------------------------------------------------------


def test_sft_errors_name_the_key_and_the_file(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match="train_dataset.path: 'nope.jsonl' does not exist"):
        sft(config(tmp_path, tiny_model_dir, "train_dataset.path=nope.jsonl", "total_train_steps=1"))
    empty = write_jsonl(tmp_path / "empty.jsonl", ['{"question": "no target"}', "not json"])
    with pytest.raises(
        ConfigError,
        match=f"(?s)train_dataset.path: no usable rows in '{empty}'.*{empty}:1: cannot tell.*{empty}:2: not valid JSON",
    ):
        sft(config(tmp_path, tiny_model_dir, f"train_dataset.path={empty}", "total_train_steps=1"))
    code_rows = [{"question": f"Print {i}.", "tests": [{"input": "", "output": f"{i}\n"}]} for i in range(12)]
    code = write_jsonl(tmp_path / "code.jsonl", code_rows)  # no solutions: nothing to train on
    with pytest.raises(
        ConfigError, match=f"train_dataset.path '{code}': no usable training example.*sft_skipped_no_target"
    ):
        sft(config(tmp_path, tiny_model_dir, f"train_dataset.path={code}", "total_train_steps=1"))


def test_examples_over_max_length_are_skipped_and_counted(tmp_path, tiny_model_dir, caplog):
    rows = PAIRS[:10] + [{"question": "Say it long.", "response": "1+1=2. " * 60, "answer": "2"}] * 4
    path = write_jsonl(tmp_path / "long.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="asyncrl.commands.sft"):
        record = sft(
            config(
                tmp_path,
                tiny_model_dir,
                f"train_dataset.path={path}",
                "total_train_steps=6",
                "max_length=80",
                "evaluator.freq_steps=0",
            )
        )
    assert record["sft_skipped_long"] >= 1
    warned = [r.getMessage() for r in caplog.records if "longer than max_length=80" in r.getMessage()]
    assert len(warned) == 1 and "sft_skipped_long" in warned[0]
    with pytest.raises(ConfigError, match="no usable training example.*sft_skipped_long.*raise max_length"):
        sft(config(tmp_path, tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=1", "max_length=5"))


# ---- checkpoints ----------------------------------------------------------------------------------------


def test_the_progress_bar_shows_on_a_terminal_only(monkeypatch):
    from asyncrl.commands.sft.run import _progress_bar

    cfg = configlib.load(SFTConfig, None, ["total_train_steps=10"])
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert _progress_bar(cfg, 0) is None  # a file or a pipe: log lines only
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    bar = _progress_bar(cfg, 4)  # a resumed run starts the bar where it stopped
    assert (bar.n, bar.total) == (4, 10)
    bar.close()
    assert _progress_bar(configlib.load(SFTConfig, None, ["progress_bar=false"]), 0) is None


def test_lora_sft_trains_the_adapters_and_saves_them_with_a_merged_model(tmp_path, tiny_model_dir):
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    path = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    cfg = config(
        tmp_path,
        tiny_model_dir,
        f"train_dataset.path={path}",
        "total_train_steps=4",
        "saver.freq_steps=2",
        "evaluator.freq_steps=2",
        "model.lora.rank=4",
        "actor.lr=1e-2",
    )
    sft(cfg)
    out = Path(cfg.output_dir)
    rows = metrics(out)
    assert "eval_accuracy" in rows[1] and "eval_accuracy" in rows[3]
    for d in (out, out / "step2", out / "step4"):
        assert (d / "adapter_config.json").exists() and (d / "adapter_model.safetensors").exists()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    merged = AutoModelForCausalLM.from_pretrained(out / "merged").state_dict()
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    assert changed and all("proj" in k for k in changed)  # only the adapted layers moved


# ---- the command ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_asyncrl_sft_command_on_a_jsonl(tmp_path, tiny_model_dir):
    exe = Path(sys.executable).parent / "asyncrl"
    if not exe.exists():
        pytest.skip("the asyncrl entry point is not installed beside this interpreter (pip install -e .)")
    train = write_jsonl(tmp_path / "train.jsonl", PAIRS)
    valid = write_jsonl(tmp_path / "valid.jsonl", PAIRS[:3])
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [
            str(exe),
            "sft",
            f"model.path={tiny_model_dir}",
            f"train_dataset.path={train}",
            f"valid_dataset.path={valid}",
            f"output_dir={out}",
            "total_train_steps=3",
            "train_dataset.batch_size=4",
            "actor.threads=1",
            "evaluator.freq_steps=2",
            "gconfig.max_new_tokens=8",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3] and "eval_accuracy" in rows[1] and "eval_accuracy" in rows[2]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["step"] == 3
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()


def test_sft_and_eval_take_trains_key_names_and_still_read_their_old_ones(tmp_path, caplog):
    """One vocabulary: total_train_steps, train_dataset.batch_size, actor.lr, output_dir, gconfig.max_new_tokens,
    evaluator.freq_steps in sft; gconfig.n_samples, evaluator.greedy in eval. The old spellings still work for one
    release, each with a deprecation line naming the new key; a train file's shared sections load in both."""
    import logging

    from asyncrl import configlib
    from asyncrl.config import EvalConfig, SFTConfig, TrainConfig

    with caplog.at_level(logging.WARNING):
        old = configlib.load(
            SFTConfig,
            None,
            [
                "steps=7",
                "batch_size=3",
                "lr=0.01",
                "output=o",
                "eval_every=2",
                "max_new_tokens=9",
                "save_every=1",
                "threads=1",
                "warmup_steps=1",
            ],
        )
    new = configlib.load(
        SFTConfig,
        None,
        [
            "total_train_steps=7",
            "train_dataset.batch_size=3",
            "actor.lr=0.01",
            "output_dir=o",
            "evaluator.freq_steps=2",
            "gconfig.max_new_tokens=9",
            "saver.freq_steps=1",
            "actor.threads=1",
            "actor.warmup_steps=1",
        ],
    )
    assert configlib.to_dict(old) == configlib.to_dict(new)
    said = " ".join(r.message for r in caplog.records)
    assert "'steps' is deprecated: use 'total_train_steps'" in said and "'lr' is deprecated: use 'actor.lr'" in said
    ev = configlib.load(EvalConfig, None, ["n_samples=4", "greedy=false", "max_new_tokens=5", "temperature=0.5"])
    assert (ev.gconfig.n_samples, ev.evaluator.greedy, ev.gconfig.max_new_tokens, ev.gconfig.temperature) == (
        4,
        False,
        5,
        0.5,
    )
    task = tmp_path / "train.yaml"  # a train file: its RL-only keys are left out by sft and eval
    task.write_text(
        "total_train_steps: 5\nrollout:\n  max_head_offpolicyness: 4\ntrain_dataset:\n  batch_size: 8\n"
        "gconfig:\n  max_new_tokens: 12\n"
    )
    others = (TrainConfig, SFTConfig, EvalConfig)
    ev = configlib.load(EvalConfig, str(task), [], others)
    assert ev.gconfig.max_new_tokens == 12 and ev.train_dataset.batch_size == 8
    sft_cfg = configlib.load(SFTConfig, str(task), [], others)
    assert sft_cfg.total_train_steps == 5 and sft_cfg.gconfig.max_new_tokens == 12
    with pytest.raises(configlib.ConfigError, match="unknown config key 'bogus'"):
        (tmp_path / "bad.yaml").write_text("bogus: 1\n")
        configlib.load(EvalConfig, str(tmp_path / "bad.yaml"), [], others)
