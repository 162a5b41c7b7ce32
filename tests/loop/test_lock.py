"""One run per run directory (asyncrl.loop.lock): a second lock of a directory is refused naming the holder, a
released or dead holder's lock is taken, and `asyncrl train` / `asyncrl sft` of a directory in use refuse in one
line before writing there (red team 4, finding 2: two runs of one directory logged every step twice)."""

import os
import subprocess
import sys

import pytest

from asyncrl import cli
from asyncrl.configlib import ConfigError
from asyncrl.loop.lock import RunDirLock


def test_a_second_lock_of_a_run_directory_is_refused_until_the_first_is_released(tmp_path):
    run = tmp_path / "exp" / "trial"
    first = RunDirLock(run)
    with pytest.raises(
        ConfigError,
        match=rf"output_dir: the run directory '{run}' is in use by another run \(pid "
        rf"{os.getpid()}\)",
    ):
        RunDirLock(run)
    first.release()
    RunDirLock(run).release()
    assert (tmp_path / "exp" / ".trial.lock").is_file() and not run.exists()  # the lock is beside the directory


def test_the_lock_of_a_process_that_died_is_taken_over(tmp_path):
    run = tmp_path / "trial"
    code = f"from asyncrl.loop.lock import RunDirLock; RunDirLock({str(run)!r}); import os; os._exit(9)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 9  # died holding it, its pid in the file
    RunDirLock(run).release()


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "sft"])
def test_a_run_of_a_directory_in_use_refuses_in_one_line_and_writes_nothing(tmp_path, tiny_model_dir, capsys, command):
    run = tmp_path / "out" / "asyncrl" / "default" if command == "train" else tmp_path / "out"
    held = RunDirLock(run)
    try:
        args = [
            command,
            f"model.path={tiny_model_dir}",
            f"output_dir={tmp_path / 'out'}",
            "total_train_steps=2",
            "train_dataset.batch_size=2",
            "gconfig.n_samples=2",
            "gconfig.max_new_tokens=8",
            "valid_dataset.size=4",
            "progress_bar=false",
            "reward.workers=0",
        ]
        assert cli.main(args + (["report=false"] if command == "train" else [])) == 2
    finally:
        held.release()
    err = capsys.readouterr().err.strip().splitlines()
    assert "is in use by another run" in err[-1] and f"pid {os.getpid()}" in err[-1]
    assert not (run / "metrics.jsonl").exists() and not (run / "sft_metrics.jsonl").exists()
