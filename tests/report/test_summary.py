"""The report's numbers (asyncrl.report.summary) on a synthetic run: the summary, time to target counting the first
evaluation as time zero, and the per-token staleness histogram."""

import json

import pytest

from asyncrl.report import load_run, summarize, time_to_target

from reports_for_tests import N_STEPS, STEP_S, synthetic_run, write_jsonl


@pytest.fixture
def run_dir(tmp_path):
    return synthetic_run(tmp_path)


def test_summary_numbers(run_dir):
    s = summarize(load_run(run_dir), target=0.5)
    assert s.steps == N_STEPS and s.max_staleness == 2 and s.wall_s == pytest.approx(N_STEPS * STEP_S)
    assert (s.initial_accuracy, s.final_accuracy) == (pytest.approx(0.2), pytest.approx(0.6))
    # accuracy 0.2 + 0.4 * step / 24 first reaches 0.5 at the step-20 evaluation (step 18 is not evaluated)
    assert (s.time_to_target_s, s.steps_to_target) == (pytest.approx(20 * STEP_S), 20)
    assert s.generator_idle_frac == pytest.approx(0.25)
    assert s.trainer_idle_frac == pytest.approx(0.25)
    assert s.gen_tokens_per_s == pytest.approx(1000.0) and s.train_tokens_per_s == pytest.approx(2000.0)
    assert s.trained_tokens_per_wall_s == pytest.approx(2400 / STEP_S)
    assert s.staleness_unit == "steps" and s.staleness_hist == {0: 1, 1: 1, 2: N_STEPS - 2}
    assert s.staleness_max == 2 and s.gen_tokens_per_busy_s == pytest.approx(1000.0 / 0.75)
    assert s.trainer_breakdown == {
        "wait": pytest.approx(0.25),
        "train": pytest.approx(0.6),
        "sync": pytest.approx(0.05),
        "eval": pytest.approx(0.1),
    }
    assert summarize(load_run(run_dir), target=0.9).time_to_target_s is None


def test_time_to_target_counts_the_initial_evaluation_as_zero():
    records = [{"step": 0, "eval_accuracy": 0.7}, {"step": 1, "elapsed_s": 3.0, "eval_accuracy": 0.8}]
    assert time_to_target(records, 0.6) == (0.0, 0)
    assert time_to_target(records, 0.75) == (3.0, 1)
    assert time_to_target(records, 0.9) is None


def test_per_token_staleness_histogram_is_used_when_logged(run_dir):
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for r in rows[1:]:
        r["staleness_hist"] = [10, 5, 1]
    write_jsonl(path, rows)
    s = summarize(load_run(run_dir))
    assert s.staleness_unit == "tokens" and s.staleness_hist == {0: 10 * N_STEPS, 1: 5 * N_STEPS, 2: N_STEPS}


def test_evaluating_share_is_the_trainers_own_time(run_dir):
    """With evaluator.background an evaluation's duration is merged into its step but the trainer did not spend
    it: the share comes from the accounting's trainer_eval_s where the run logged it."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert summarize(load_run(run_dir)).eval_frac == pytest.approx(0.2 * (N_STEPS // 4) / (N_STEPS * STEP_S))
    for r in rows[1:]:
        r["trainer_eval_s"] = 0.01  # the background evaluations' eval_time_s (0.2 s) stay in the records
    write_jsonl(path, rows)
    assert summarize(load_run(run_dir)).eval_frac == pytest.approx(0.01 / STEP_S)
