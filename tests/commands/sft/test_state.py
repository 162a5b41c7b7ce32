"""SFT's step checkpoints (asyncrl.commands.sft.state): loadable with transformers, resumed with the same losses,
the best held-out model kept across a resume (and not compared under other evaluation settings), and starting
over never moves the model a run trains from."""

import json
import logging
from pathlib import Path

import pytest
import torch

from asyncrl.commands.sft.run import sft
from asyncrl.configlib import ConfigError

from sft_for_tests import PAIRS, config, metrics, write_jsonl


def test_save_every_writes_step_checkpoints_loadable_with_transformers(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    cfg = config(tmp_path, tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=4", "saver.freq_steps=2")
    sft(cfg)
    out = Path(cfg.output_dir)
    assert sorted(p.name for p in out.glob("step*")) == ["step2", "step4"]
    step2 = AutoModelForCausalLM.from_pretrained(out / "step2")
    final = AutoModelForCausalLM.from_pretrained(out)
    AutoTokenizer.from_pretrained(out / "step2")
    assert any(not torch.equal(a, b) for a, b in zip(step2.state_dict().values(), final.state_dict().values()))
    step4 = AutoModelForCausalLM.from_pretrained(out / "step4")
    assert all(torch.equal(a, b) for a, b in zip(step4.state_dict().values(), final.state_dict().values()))


def test_the_best_held_out_model_is_kept_and_survives_a_resume(tmp_path, tiny_model_dir, monkeypatch):
    """OUTPUT/best is the model of the best evaluation so far (best.json: step and accuracy), loadable; a resumed
    run keeps a best saved before its resume point and replaces one saved at steps it trains again."""
    from transformers import AutoModelForCausalLM

    import asyncrl.commands.sft.run as sft_module

    accuracies = iter([0.2, 0.6, 0.4, 0.5, 0.3, 0.7])

    def scored(self, model):
        return {"eval_accuracy": next(accuracies)}

    monkeypatch.setattr(sft_module._Scorer, "__call__", scored)
    path = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    cfg = config(
        tmp_path,
        tiny_model_dir,
        f"train_dataset.path={path}",
        "total_train_steps=4",
        "saver.freq_steps=2",
        "evaluator.freq_steps=1",
    )
    sft(cfg)  # evaluations 0.2, 0.6, 0.4, 0.5 at steps 1-4
    best = Path(cfg.output_dir) / "best"
    assert json.loads((best / "best.json").read_text()) == {
        "step": 2,
        "eval_accuracy": 0.6,
        "evaluation": {"greedy": True, "success_threshold": 1.0},
    }
    step2 = AutoModelForCausalLM.from_pretrained(Path(cfg.output_dir) / "step2").state_dict()
    assert all(
        torch.equal(a, b)
        for a, b in zip(AutoModelForCausalLM.from_pretrained(best).state_dict().values(), step2.values())
    )
    sft(
        config(
            tmp_path,
            tiny_model_dir,
            f"train_dataset.path={path}",
            "total_train_steps=6",
            "saver.freq_steps=2",
            "evaluator.freq_steps=1",
        )
    )  # resumes at step 5: 0.3, then 0.7 at step 6
    assert json.loads((best / "best.json").read_text())["eval_accuracy"] == 0.7
    (best / "best.json").write_text(json.dumps({"step": 5, "eval_accuracy": 0.9}))  # as if saved after step 4
    accuracies = iter([0.1, 0.05])
    sft(
        config(
            tmp_path,
            tiny_model_dir,
            f"train_dataset.path={path}",
            "total_train_steps=6",
            "saver.freq_steps=2",
            "evaluator.freq_steps=1",
        )
    )  # resumes from step6: nothing to train, the best stays
    assert json.loads((best / "best.json").read_text())["step"] == 5
    (Path(cfg.output_dir) / "step6" / "sft_state.pt").unlink()  # now it resumes at step 5, which it trains again
    sft(
        config(
            tmp_path,
            tiny_model_dir,
            f"train_dataset.path={path}",
            "total_train_steps=6",
            "saver.freq_steps=2",
            "evaluator.freq_steps=1",
        )
    )
    assert {k: v for k, v in json.loads((best / "best.json").read_text()).items() if k != "evaluation"} == {
        "step": 5,
        "eval_accuracy": 0.1,
    }


def test_a_best_model_evaluated_under_other_settings_is_not_compared(tmp_path, caplog):
    """A resumed run may change evaluator.greedy or evaluator.success_threshold: the best accuracy measured
    under the old ones is not a bar for the new ones (the next evaluation replaces it); under the same ones it is."""
    from asyncrl.commands.sft.state import best_before

    best = tmp_path / "best"
    best.mkdir()
    (best / "best.json").write_text(
        json.dumps({"step": 4, "eval_accuracy": 0.9, "evaluation": {"greedy": True, "success_threshold": 1.0}})
    )
    assert best_before(tmp_path, 5, {"greedy": True, "success_threshold": 1.0})["eval_accuracy"] == 0.9
    assert best_before(tmp_path, 5, {"greedy": False, "success_threshold": 1.0}) is None
    assert best.is_dir() and "is not compared, and the next evaluation replaces it" in caplog.text


def test_a_stopped_sft_run_resumes_from_its_step_checkpoint_with_the_same_losses(
    tmp_path, tiny_model_dir, monkeypatch, caplog
):
    """Stopped after step 4 (saved at 2 and 4), the same command continues at step 5 from the weights, optimizer,
    data position and RNG of step 4: every loss equals the uninterrupted run's, each step is logged once."""
    import asyncrl.commands.sft.run as sft_module

    path = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    whole = config(
        tmp_path / "whole", tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=6", "saver.freq_steps=2"
    )
    sft(whole)
    cut = config(
        tmp_path / "cut", tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=6", "saver.freq_steps=2"
    )
    real_batch, calls = sft_module.sft_batch, []

    def stop_at_step_5(*args):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real_batch(*args)

    monkeypatch.setattr(sft_module, "sft_batch", stop_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        sft(cut)
    monkeypatch.setattr(sft_module, "sft_batch", real_batch)
    (Path(cut.output_dir) / "step2" / "sft_state.pt").unlink()  # the newest step checkpoint is the one used
    assert [r["step"] for r in metrics(cut.output_dir)] == [1, 2, 3, 4]
    with caplog.at_level(logging.INFO, logger="asyncrl.commands.sft"):
        sft(cut)
    assert any("resuming from" in r.message and "step4" in r.message for r in caplog.records)
    resumed, uninterrupted = metrics(cut.output_dir), metrics(whole.output_dir)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in uninterrupted]
    assert resumed[-1]["elapsed_s"] >= resumed[3]["elapsed_s"]
    with pytest.raises(ConfigError, match=r"another configuration \(actor.lr: 0.003 -> 0.001\).*resume=fresh"):
        sft(
            config(
                tmp_path / "cut",
                tiny_model_dir,
                f"train_dataset.path={path}",
                "total_train_steps=8",
                "saver.freq_steps=2",
                "actor.lr=1e-3",
            )
        )
    fresh = config(
        tmp_path / "cut", tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=2", "resume=fresh"
    )
    sft(fresh)
    assert [r["step"] for r in metrics(fresh.output_dir)] == [1, 2]
    # the run started over holds none of the earlier run's step checkpoints (moved aside with it): the same
    # command again (resume=auto) does not continue the earlier run's step 6 under the new run's name
    assert not list(Path(fresh.output_dir).glob("step*"))
    assert [p.name.split(".replaced-")[0] for p in (tmp_path / "cut").glob("out.replaced-*")] == ["out"]
    again = config(tmp_path / "cut", tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=2")
    sft(again)
    assert [r["step"] for r in metrics(again.output_dir)] == [1, 2]


def test_starting_over_refuses_to_move_the_model_it_trains_from(tmp_path, monkeypatch):
    """resume=fresh moves an earlier run aside: not when model.path is in it (out, out/best, out/stepN), which
    would be moved away from under the run (found after training, as a failure to load model.path); and
    output_dir=. works (it has no name of its own)."""
    from asyncrl.commands.sft.state import start_over

    out = tmp_path / "out"
    (out / "step2").mkdir(parents=True)
    (out / "step2" / "sft_state.pt").write_bytes(b"")
    (out / "best").mkdir()
    for model in (str(out), str(out / "best"), str(out / "step2")):
        with pytest.raises(ConfigError, match="is inside output_dir .* write this run to another output_dir"):
            start_over(out, model)
    assert (out / "step2").is_dir()
    monkeypatch.chdir(out)
    start_over(Path("."), "Qwen/Qwen2.5-0.5B-Instruct")  # a hub name is no directory of out's
    assert not (out / "step2").exists() and len(list(tmp_path.glob("out.replaced-*/step2"))) == 1
    assert Path.cwd() == out.resolve()  # the new run writes where the working directory is


def test_sft_keeps_the_last_step_checkpoints_it_is_told_to(tmp_path, tiny_model_dir):
    """saver.keep_last applies to SFT's step checkpoints too (issue 44: it kept all six)."""
    path = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    cfg = config(tmp_path, tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=6", "saver.freq_steps=1")
    cfg.saver.keep_last = 2
    sft(cfg)
    assert sorted(p.name for p in Path(cfg.output_dir).glob("step*")) == ["step5", "step6"]


@pytest.mark.slow
def test_ctrl_c_in_sft_saves_the_step_and_the_same_command_resumes(tmp_path, tiny_model_dir):
    """SIGINT in asyncrl sft was a KeyboardInterrupt traceback, exit 1, nothing saved (issue 44): now the step in
    hand ends, its checkpoint is saved, one line says so, exit 130; the same command goes on from it to the end."""
    import signal
    import subprocess
    import sys
    import time

    from runs_for_tests import train_env

    path = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    out = tmp_path / "out"
    args = [sys.executable, "-m", "asyncrl.cli", "sft", f"model.path={tiny_model_dir}", f"output_dir={out}"]
    args += [f"train_dataset.path={path}", "train_dataset.batch_size=4", "total_train_steps=40", "actor.threads=1"]
    args += ["valid_dataset.size=2", "gconfig.max_new_tokens=8", "progress_bar=false"]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=train_env())
    metrics = out / "sft_metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    (saved,) = [p for p in out.glob("step*") if p.is_dir()]
    assert f"stopped by SIGINT; checkpoint {saved} saved: run the same command again" in err.strip().splitlines()[-1]
    assert int(saved.name[4:]) < 40
    assert subprocess.run(args, env=train_env(), capture_output=True).returncode == 0  # the same command
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(1, 41))  # resumed after the saved step: no step twice, none lost
