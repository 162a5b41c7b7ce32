"""Checkpoints (asyncrl.loop.checkpoint): a full disk while saving is one line and the previous checkpoint stays; a
checkpoint of non-finite weights is refused; a checkpoint written in the background holds the state of the moment
it was taken, byte for byte what a foreground save writes, while training goes on."""

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.launch.build import assemble

from runs_for_tests import is_complete, latest_checkpoint, prompt_files, quick_config, train_command, train_env


class SafetensorLikeError(Exception):
    """What safetensors raises on a full disk: not an OSError."""


@pytest.mark.slow
@pytest.mark.parametrize("error,background", [("oserror", "true"), ("safetensors", "true"), ("oserror", "false")])
def test_a_full_disk_while_saving_is_one_line_and_the_previous_checkpoint_stays(
    tmp_path, tiny_model_dir, monkeypatch, capsys, caplog, error, background
):
    """Foreground: the failed save stops the run; step 2 stays the latest. Background: the failed write is found
    by the next save (the last, here) and stops the run the same way, with the weights it stops with saved (the
    disk is writable again here)."""
    import errno

    from asyncrl import cli
    from asyncrl.trainer import PolicyTrainer
    from asyncrl.trainer.state import WeightsCopy

    train, valid = prompt_files(tmp_path, 40)
    args = train_command(tmp_path, tiny_model_dir, train, valid, 4, f"saver.background={background}")[3:]
    save = PolicyTrainer.save if background == "false" else WeightsCopy.save

    def fills_the_disk(self, path, tokenizer=None):
        if ".tmp-step3-" in str(path):
            (Path(path) / "config.json").write_text("{")  # half written when the disk filled up
            raise (
                OSError(errno.ENOSPC, "No space left on device")
                if error == "oserror"
                else SafetensorLikeError(
                    "Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                    'message: "No space left on device" })'
                )
            )
        return save(self, path, tokenizer)

    monkeypatch.setattr(PolicyTrainer if background == "false" else WeightsCopy, "save", fills_the_disk)
    code = cli.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "the disk is full" in err[0] and "step2" in err[0], err
    run = tmp_path / "out" / "asyncrl" / "default"
    kept = "step2" if background == "false" else "step4"
    assert latest_checkpoint(run).name == kept and is_complete(latest_checkpoint(run))
    assert not list((run / "checkpoints").glob("step3")) and not list((run / "checkpoints").glob(".tmp-*"))
    capsys.readouterr()
    args = train_command(
        tmp_path / "again", tiny_model_dir, train, valid, 4, "saver.on_error=continue", f"saver.background={background}"
    )[3:]
    caplog.clear()
    assert cli.main(args) == 0  # continue: the step-3 checkpoint is skipped with a warning, step 4 is saved
    assert latest_checkpoint(tmp_path / "again" / "out" / "asyncrl" / "default").name == "step4"
    (warning,) = [r for r in caplog.records if "a checkpoint was not written" in r.getMessage()]
    assert "saver.on_error=continue; the newest is step2" in warning.getMessage() and warning.exc_info is None


@pytest.mark.slow
def test_a_full_disk_under_the_metrics_stops_the_run_in_one_line_and_it_resumes(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    """metrics.jsonl cannot be written at step 3 (the disk filled): one line naming it, exit 1, step 2's
    checkpoint the latest (step 3 was not logged, so its weights are not saved as if it had been); the same
    command on a disk with room again resumes from step 2 and ends (red team 4: it was a traceback)."""
    import errno

    from asyncrl import cli
    from asyncrl.telemetry.metrics import MetricsLogger

    train, valid = prompt_files(tmp_path, 40)
    args = train_command(tmp_path, tiny_model_dir, train, valid, 4)[3:]
    log = MetricsLogger._log

    def fills_the_disk(self, record):
        if record.get("step") == 3 and not record.get("evaluation"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return log(self, record)

    monkeypatch.setattr(MetricsLogger, "_log", fills_the_disk)
    code = cli.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and "stopped: metrics.jsonl: cannot write (No space left on device) at step 3" in err[-1], err
    run = tmp_path / "out" / "asyncrl" / "default"
    assert latest_checkpoint(run).name == "step2" and is_complete(latest_checkpoint(run))
    monkeypatch.setattr(MetricsLogger, "_log", log)
    assert cli.main(args) == 0
    assert latest_checkpoint(run).name == "step4"
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "reward_mean" in r]
    assert steps == [1, 2, 3, 4], steps


@pytest.mark.slow
def test_a_real_full_disk_is_one_line(tmp_path, tiny_model_dir):
    """A small tmpfs as output_dir (room for one checkpoint, not two): one line naming the full disk, exit 1, and
    the last checkpoint that fitted stays complete. Skipped where mounting is not allowed."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    model_bytes = sum(f.stat().st_size for f in Path(tiny_model_dir).iterdir() if f.is_file())
    size = 5 * model_bytes  # one checkpoint (weights + twice as much optimizer state) fits, a second beside it not
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        train, valid = prompt_files(tmp_path, 40)
        args = train_command(tmp_path, tiny_model_dir, train, valid, 8, f"output_dir={disk}", "saver.freq_steps=1")
        done = subprocess.run(args, capture_output=True, text=True, timeout=600, env=train_env())
        err = done.stderr.strip().splitlines()
        assert done.returncode == 1 and "the disk is full" in err[-1] and "Traceback" not in done.stderr, err[-5:]
        latest = latest_checkpoint(disk / "asyncrl" / "default")
        assert latest is not None and is_complete(latest)
    finally:
        subprocess.run(["umount", "-l", str(disk)])


def _cfg(tmp_path, model_path, *extra):
    return quick_config(tmp_path, model_path, "total_train_steps=4", "gconfig.max_new_tokens=12", *extra)


@pytest.mark.parametrize("background", [False, True])
def test_a_checkpoint_of_non_finite_weights_is_refused(tmp_path, tiny_model_dir, background):
    from asyncrl.api.trainer import NonFiniteWeights

    cfg = _cfg(tmp_path, tiny_model_dir)
    with assemble(cfg) as parts:
        with torch.no_grad():
            next(parts.trainer.model.parameters())[0, 0] = math.nan
        with pytest.raises(NonFiniteWeights, match="NaN or inf"):  # in the trainer's thread, before any copy
            parts.checkpoints.save(1, background=background)
        parts.checkpoints.wait()
    assert not (tmp_path / "asyncrl" / "default" / "checkpoints" / "step1").exists()


def _trained(model_dir, steps=1):
    """A trainer of ``model_dir`` after ``steps`` optimizer steps (AdamW's moments exist)."""
    from asyncrl.config import ActorConfig
    from asyncrl.models.hf import load_model
    from asyncrl.trainer import build_trainer

    model = load_model(str(model_dir))
    trainer = build_trainer(ActorConfig(), model, model_path=str(model_dir), temperature=1.0, autocast_dtype=None)
    for _ in range(steps):
        trainer.optimizer.zero_grad()
        model(input_ids=torch.randint(0, model.config.vocab_size, (2, 8))).logits.float().mean().backward()
        trainer.optimizer.step()
    return trainer


def _files(checkpoint: Path) -> dict:
    """What a checkpoint holds, comparable: every tensor of its weights and of trainer.pt, its other files."""
    from safetensors.torch import load_file

    out = {}
    for f in sorted(checkpoint.rglob("*")):
        name = str(f.relative_to(checkpoint))
        if f.suffix == ".safetensors":
            out[name] = load_file(str(f))
        elif f.name == "trainer.pt":
            out[name] = torch.load(f, weights_only=False)
        elif f.is_file() and f.name != "manifest.json":  # sizes of trainer.pt's pickle may differ
            out[name] = f.read_bytes()
    return out


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def test_a_background_checkpoint_holds_the_moment_it_was_taken_while_training_goes_on(
    tmp_path, tiny_model_dir, tokenizer, monkeypatch
):
    """The writer is held until the trainer has stepped again and drawn random numbers: the checkpoint still
    equals the foreground checkpoint of the moment save() returned (weights, optimizer moments, RNGs, run state,
    tied weights stay one tensor), and ``latest`` moves only once it is complete."""
    import threading

    from asyncrl.loop.checkpoint import Checkpointer, RunState, read_latest
    from asyncrl.trainer.state import WeightsCopy

    trainer = _trained(tiny_model_dir)
    state = RunState(version=1, drawn=8, accepted=4, ready=[(0, "a group")], inflight=["an item"])
    fore = Checkpointer(tmp_path / "fore", trainer, tokenizer)
    expected = _files(fore.save(1, state))

    release, write = threading.Event(), WeightsCopy.save
    monkeypatch.setattr(WeightsCopy, "save", lambda self, *a: (release.wait(30), write(self, *a)))
    back = Checkpointer(tmp_path / "back", trainer, tokenizer)
    path = back.save(1, state, background=True)
    assert back.writing and read_latest(back.dir) is None and not path.exists()
    trainer.optimizer.zero_grad()  # training goes on: weights, moments and the RNGs all move
    trainer.module(input_ids=torch.randint(0, 300, (2, 8))).logits.float().mean().backward()
    trainer.optimizer.step()
    torch.rand(3), np.random.rand(3), random.random()
    release.set()
    back.wait()
    assert read_latest(back.dir) == "step1" and back.last == 1
    got = _files(path)
    assert got.keys() == expected.keys()
    assert all(_same(expected[k], got[k]) for k in expected), [k for k in expected if not _same(expected[k], got[k])]
    from asyncrl.models.hf import load_model

    reloaded = load_model(str(path))
    assert reloaded.config.tie_word_embeddings == trainer.module.config.tie_word_embeddings


def test_a_failed_background_write_is_raised_by_the_next_save_and_the_previous_checkpoint_stays(
    tmp_path, tiny_model_dir, tokenizer, monkeypatch
):
    from asyncrl.loop.checkpoint import Checkpointer, CheckpointError, RunState, read_latest
    from asyncrl.trainer.state import WeightsCopy

    trainer = _trained(tiny_model_dir)
    ckpt = Checkpointer(tmp_path, trainer, tokenizer)
    ckpt.save(1, RunState(version=1), background=True)
    write = WeightsCopy.save

    def breaks(self, path, tokenizer=None):
        if ".tmp-step2-" in path:
            raise OSError(5, "Input/output error")
        write(self, path, tokenizer)

    monkeypatch.setattr(WeightsCopy, "save", breaks)
    ckpt.save(2, RunState(version=2), background=True)  # returns at once; the write fails in its thread
    with pytest.raises(CheckpointError, match=r"version 2 .* Input/output error.*\(step1\) stays valid"):
        ckpt.save(3, RunState(version=3), background=True)
    assert read_latest(ckpt.dir) == "step1" and not list(ckpt.dir.glob(".tmp-*"))
    ckpt.save(3, RunState(version=3), background=True)
    ckpt.wait()
    assert read_latest(ckpt.dir) == "step3" and sorted(p.name for p in ckpt.dir.glob("step*")) == ["step1", "step3"]


def test_trainers_that_cannot_copy_their_weights_save_in_the_foreground(tmp_path, tiny_model_dir, tokenizer):
    """LoRA (the adapter and its merged export) is written by the trainer itself: save() returns a complete
    checkpoint."""
    from asyncrl.config import ActorConfig
    from asyncrl.loop.checkpoint import Checkpointer, RunState, read_latest, verify
    from asyncrl.models.hf import load_model
    from asyncrl.models.lora import apply_lora, is_adapter_dir
    from asyncrl.trainer import build_trainer

    model = apply_lora(load_model(str(tiny_model_dir)), rank=4, alpha=8)
    trainer = build_trainer(ActorConfig(), model, model_path=str(tiny_model_dir), temperature=1.0, autocast_dtype=None)
    assert trainer.snapshot() is None
    ckpt = Checkpointer(tmp_path, trainer, tokenizer)
    path = ckpt.save(1, RunState(version=1), background=True)
    assert not ckpt.writing and read_latest(ckpt.dir) == "step1" and verify(path) is None and is_adapter_dir(path)


def _fake_checkpoints(checkpoints: Path, versions=(2, 3, 4)):
    """Checkpoint directories shaped like Checkpointer.save's (files of a few bytes), with their manifests."""
    import json

    from asyncrl.loop.checkpoint import MANIFEST, manifest

    for v in versions:
        d = checkpoints / f"step{v}"
        d.mkdir(parents=True)
        for name, size in (("config.json", 20), ("model.safetensors", 400), ("trainer.pt", 300), ("rollouts.pt", 50)):
            (d / name).write_bytes(b"x" * size)
        (d / "run.json").write_text(json.dumps({"version": v, "drawn": 8 * v}))
        (d / MANIFEST).write_text(json.dumps(manifest(d)))
    (checkpoints / "latest").write_text(f"step{versions[-1]}\n")


DAMAGES = {
    "model.safetensors truncated": lambda c: (c / "step4" / "model.safetensors").write_bytes(b"x" * 100),
    "trainer.pt truncated": lambda c: (c / "step4" / "trainer.pt").write_bytes(b""),
    # red team 4, finding 6: damage that keeps a file's size went unnoticed
    "model.safetensors overwritten, same size": lambda c: (c / "step4" / "model.safetensors").write_bytes(b"y" * 400),
    "one byte of trainer.pt flipped": lambda c: (c / "step4" / "trainer.pt").write_bytes(b"x" * 299 + b"z"),
    "rollouts.pt removed": lambda c: (c / "step4" / "rollouts.pt").unlink(),
    "run.json removed": lambda c: (c / "step4" / "run.json").unlink(),
    "run.json version edited": lambda c: (c / "step4" / "run.json").write_text('{"version": 4, "drawn": 99}'),
    "run.json says another version": lambda c: (c / "step4" / "run.json").write_text('{"version": 7, "drawn": 32}'),
    "manifest garbled": lambda c: (c / "step4" / "manifest.json").write_bytes(b"\x00\xff"),
    "manifest of another shape": lambda c: (c / "step4" / "manifest.json").write_text('{"files": []}'),
    "manifest a list": lambda c: (c / "step4" / "manifest.json").write_text("[]"),
}
POINTERS = {
    "latest garbled": b"\x00\xff",
    "latest empty": b"",
    "latest names step99": b"step99\n",
    "latest points outside": b"../../../elsewhere\n",
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(tmp_path, damage):
    from asyncrl.loop.checkpoint import newest_valid

    checkpoints = tmp_path / "checkpoints"
    _fake_checkpoints(checkpoints)
    assert newest_valid(checkpoints) == (checkpoints / "step4", [])
    DAMAGES[damage](checkpoints)
    point, skipped = newest_valid(checkpoints)
    assert point == checkpoints / "step3" and len(skipped) == 1 and skipped[0].startswith("step4: "), skipped


@pytest.mark.parametrize("pointer", list(POINTERS))
def test_a_damaged_latest_pointer_still_resumes_from_the_newest_checkpoint(tmp_path, pointer):
    from asyncrl.loop.checkpoint import newest_valid, read_latest

    checkpoints = tmp_path / "checkpoints"
    _fake_checkpoints(checkpoints)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "run.json").write_text('{"version": 9}')
    (checkpoints / "latest").write_bytes(POINTERS[pointer])
    assert read_latest(checkpoints) is None  # never followed out of the run, never a traceback
    assert newest_valid(checkpoints) == (checkpoints / "step4", [])


def test_rotation_never_prunes_the_checkpoint_just_written(tmp_path):
    """A run resumed from step3 because step4 is damaged, keeping one checkpoint: its save of step4 (or of an
    earlier step) must survive its own pruning, and what is ahead of it (left from before the resume) goes."""
    from asyncrl.loop.checkpoint import Checkpointer, RunState, newest_valid, read_latest

    class Trainer:
        def check_finite(self):
            pass

        def save(self, directory, tokenizer):
            (Path(directory) / "model.safetensors").write_bytes(b"w" * 10)

        def training_state(self, directory):
            return {}

    checkpoints = tmp_path / "checkpoints"
    _fake_checkpoints(checkpoints, versions=(2, 3, 4, 5))
    DAMAGES["trainer.pt truncated"](checkpoints)
    (checkpoints / "step5" / "trainer.pt").write_bytes(b"")
    assert newest_valid(checkpoints)[0] == checkpoints / "step3"
    Checkpointer(tmp_path, Trainer(), None, keep=1).save(4, RunState(4))
    assert sorted(p.name for p in checkpoints.glob("step*")) == ["step4"] and read_latest(checkpoints) == "step4"
    assert newest_valid(checkpoints)[0] == checkpoints / "step4"


def test_a_kill_while_a_checkpoint_is_removed_never_leaves_one_a_resume_takes(tmp_path, monkeypatch):
    """rmtree deletes a checkpoint's manifest before its run.json: killed in between, the rest read as a
    checkpoint from before manifests, without weights, and a resume took it. A checkpoint is renamed out of
    sight before it is removed."""
    import shutil

    from asyncrl.loop import checkpoint
    from asyncrl.loop.checkpoint import newest_valid

    checkpoints = tmp_path / "checkpoints"
    _fake_checkpoints(checkpoints, versions=(4, 5))

    def killed_midway(path, ignore_errors=False):
        for name in ("manifest.json", "model.safetensors"):
            (Path(path) / name).unlink(missing_ok=True)
        raise KeyboardInterrupt  # the kill

    monkeypatch.setattr(shutil, "rmtree", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        checkpoint._remove(checkpoints / "step5")
    monkeypatch.undo()
    assert newest_valid(checkpoints) == (checkpoints / "step4", [])


def test_resume_says_which_checkpoints_it_skipped_and_why(tmp_path, caplog):
    import logging

    from asyncrl.launch.resume import resume_point

    cfg = configlib.load(TrainConfig, None, [f"output_dir={tmp_path}"])
    run = tmp_path / "asyncrl" / "default"
    _fake_checkpoints(run / "checkpoints")
    configlib.dump(cfg, run / "config.yaml")
    DAMAGES["model.safetensors truncated"](run / "checkpoints")
    (run / "checkpoints" / "step3" / "trainer.pt").unlink()
    with caplog.at_level(logging.WARNING):
        assert resume_point(cfg) == run / "checkpoints" / "step2"
    said = [r.message for r in caplog.records]
    assert any("step4: model.safetensors has 100 bytes, not the 400 written" in m for m in said)
    assert any("step3: trainer.pt is missing" in m for m in said)


@pytest.mark.slow
def test_a_run_resumes_from_the_checkpoint_before_a_truncated_one(tmp_path, tiny_model_dir):
    import json
    import subprocess

    train, valid = prompt_files(tmp_path, 40)
    args = train_command(tmp_path, tiny_model_dir, train, valid, 4)
    assert subprocess.run(args, capture_output=True, timeout=600, env=train_env()).returncode == 0
    run = tmp_path / "out" / "asyncrl" / "default"
    path = run / "checkpoints" / "step4" / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    done = subprocess.run(
        args[: -len(args)] + [a if not a.startswith("total_train_steps=") else "total_train_steps=6" for a in args],
        capture_output=True,
        text=True,
        timeout=600,
        env=train_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "not resuming from step4: model.safetensors has" in done.stderr and "step3" in done.stderr
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 6 and 4 in steps  # step 4 trained again, once in the log
