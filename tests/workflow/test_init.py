"""Workflows by config (asyncrl.workflow): a user's workflow named by import path runs end to end, and kwargs it
refuses are a one-line refusal before anything is created."""

import pytest

from asyncrl.launch.train import train
from asyncrl.telemetry.metrics import read_metrics

from runs_for_tests import quick_config


def _cfg(tmp_path, model_path, *extra):
    return quick_config(tmp_path, model_path, "total_train_steps=3", "gconfig.max_new_tokens=16", *extra)


@pytest.mark.slow
def test_a_user_workflow_named_by_import_path_runs_end_to_end(tmp_path, tiny_model_dir):
    import workflows_for_tests

    workflows_for_tests.ShortAnswerWorkflow.runs = 0
    cfg = _cfg(
        tmp_path,
        tiny_model_dir,
        "workflow.name=workflows_for_tests:ShortAnswerWorkflow",
        "workflow.kwargs={bonus: 2.0}",
    )
    last = train(cfg)
    steps = [r for r in read_metrics(tmp_path / "asyncrl" / "default") if r["step"] > 0]
    assert last["version"] == 3 and len(steps) == 3
    assert workflows_for_tests.ShortAnswerWorkflow.runs >= 6
    assert all(0 < r["reward_mean"] <= 2.0 for r in steps) and last["reward_calls"] == 0


def test_workflow_kwargs_it_refuses_are_a_one_line_refusal_before_anything_is_created(tmp_path, tiny_model_dir, capsys):
    from asyncrl import cli

    code = cli.main(
        [
            "train",
            f"model.path={tiny_model_dir}",
            f"output_dir={tmp_path / 'out'}",
            "workflow.name=workflows_for_tests:ShortAnswerWorkflow",
            "workflow.kwargs={bogus: 1}",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "workflow: cannot build" in err[0] and "bogus" in err[0]
    assert not (tmp_path / "out").exists()
