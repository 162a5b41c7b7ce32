"""Reading a run directory (asyncrl.telemetry.record): the torn last line of a killed run is skipped and non-finite
values read back as floats."""

import importlib.util
import json
import math

import pytest

from asyncrl.report import load_run, summarize, write_report

from reports_for_tests import N_STEPS, STEP_S, synthetic_run, write_jsonl


@pytest.fixture
def run_dir(tmp_path):
    return synthetic_run(tmp_path)


def test_torn_last_line_of_a_killed_run_is_skipped(run_dir):
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 25, "reward_me')
    assert len(load_run(run_dir).steps) == N_STEPS


def test_a_line_torn_inside_a_character_is_skipped_and_resume_drops_it(run_dir):
    """samples.jsonl keeps non-ASCII text: a kill (or a run still writing) can cut its last line inside a
    character; the report reads the rest, and a resume cuts the line away."""
    from asyncrl.launch.resume import truncate_run_files

    line = json.dumps({"step": 3, "completion": "ответ → 42"}, ensure_ascii=False).encode("utf-8")
    with (run_dir / "samples.jsonl").open("ab") as f:
        f.write(json.dumps({"step": 2, "completion": "é"}, ensure_ascii=False).encode("utf-8") + b"\n")
        f.write(line[: line.index("→".encode("utf-8")) + 1])  # cut after the first byte of the arrow
    run = load_run(run_dir)
    assert run.samples[-1] == {"step": 2, "completion": "é"} and len(run.steps) == N_STEPS
    truncate_run_files(run_dir, 10, 1e9)
    assert (run_dir / "samples.jsonl").read_bytes().endswith('"é"}\n'.encode("utf-8"))


def test_non_finite_values_are_read_back_as_floats_and_skipped(run_dir):
    """metrics.jsonl spells NaN and inf as strings: they come back as floats, and the summary and the plots
    leave them out instead of crashing or turning every number into NaN."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[3].update(reward_mean="nan", gen_tokens_per_s="inf", staleness_mean="-inf", grad_norm="inf")
    rows[4].update(eval_accuracy="nan", step_time_s="nan", elapsed_s="inf", staleness_max="inf", sandbox="bwrap")
    rows[-1].update(reward_mean="-inf")
    write_jsonl(path, rows)
    run = load_run(run_dir)
    third = run.records[3]
    assert math.isnan(third["reward_mean"]) and third["gen_tokens_per_s"] == math.inf
    assert third["staleness_mean"] == -math.inf and run.records[4]["sandbox"] == "bwrap"
    assert all(r["step"] != 4 for r in run.evals)  # a NaN accuracy is no evaluation
    s = summarize(run, target=0.5)
    numbers = [v for v in s.to_dict().values() if isinstance(v, float)]
    assert numbers and all(math.isfinite(v) for v in numbers), s
    assert s.staleness_max == 2 and s.wall_s == pytest.approx(N_STEPS * STEP_S)
    assert s.reward_last == pytest.approx(sum(0.2 + 0.4 * k / N_STEPS for k in range(19, 24)) / 5)  # 24 is -inf
    if importlib.util.find_spec("matplotlib") is not None:
        assert write_report(run_dir).read_text().count('<img class="plot"') == 4
