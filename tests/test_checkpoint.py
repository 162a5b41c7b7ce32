"""Checkpoints (asyncrl.checkpoint): a full disk while saving is one line and the previous checkpoint stays; a
checkpoint of non-finite weights is refused."""

import math
from pathlib import Path

import pytest
import torch

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.launch.build import assemble
from runs_for_tests import is_complete, latest_checkpoint, prompt_files, train_command


@pytest.mark.slow
def test_a_full_disk_while_saving_is_one_line_and_the_previous_checkpoint_stays(tmp_path, tiny_model_dir,
                                                                                   monkeypatch, capsys):
    import errno

    from asyncrl import cli
    from asyncrl.trainer import PolicyTrainer

    train, valid = prompt_files(tmp_path, 40)
    args = train_command(tmp_path, tiny_model_dir, train, valid, 4)[3:]
    save = PolicyTrainer.save

    def fills_the_disk(self, path, tokenizer=None):
        if self.steps_done == 3:
            (Path(path) / "config.json").write_text("{")  # half written when the disk filled up
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(self, path, tokenizer)

    monkeypatch.setattr(PolicyTrainer, "save", fills_the_disk)
    code = cli.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "the disk is full" in err[0] and "step2" in err[0], err
    run = tmp_path / "out" / "asyncrl" / "default"
    assert latest_checkpoint(run).name == "step2" and is_complete(latest_checkpoint(run))
    assert not list((run / "checkpoints").glob("step3")) and not list((run / "checkpoints").glob(".tmp-*"))


def _cfg(tmp_path, model_path, *extra):
    return configlib.load(TrainConfig, None, [
        f"model.path={model_path}", f"output_dir={tmp_path}", "progress_bar=false", "report=false",
        "total_train_steps=4", "train_dataset.batch_size=2", "gconfig.n_samples=2", "gconfig.max_new_tokens=12",
        "valid_dataset.size=4", "evaluator.freq_steps=0", "rollout.max_slots=8", "reward.workers=0",
        "reward.fn=rewards_for_tests:digit_count_reward", *extra,
    ])


def test_a_checkpoint_of_non_finite_weights_is_refused(tmp_path, tiny_model_dir):
    from asyncrl.trainer import NonFiniteWeights

    cfg = _cfg(tmp_path, tiny_model_dir)
    with assemble(cfg) as parts:
        with torch.no_grad():
            next(parts.trainer.model.parameters())[0, 0] = math.nan
        with pytest.raises(NonFiniteWeights, match="NaN or inf"):
            parts.checkpoints.save(1)
    assert not (tmp_path / "asyncrl" / "default" / "checkpoints" / "step1").exists()
