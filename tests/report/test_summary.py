import argparse
import base64
import importlib.util
import json
import math
import re
import shutil
import subprocess
import sys

import pytest

from asyncrl.report import ReportError, load_run, main, summarize, time_to_target, write_report
from reports_for_tests import N_STEPS, PNG_MAGIC, STEP_S, needs_matplotlib, synthetic_run, write_jsonl


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
    assert s.trainer_breakdown == {"wait": pytest.approx(0.25), "train": pytest.approx(0.6),
                                   "sync": pytest.approx(0.05), "eval": pytest.approx(0.1)}
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


@needs_matplotlib
def test_report_page_inlines_every_plot(run_dir):
    page = write_report(run_dir)
    assert page == run_dir / "report.html"
    text = page.read_text()
    images = re.findall(r'<img class="plot" id="plot-(\w+)"[^>]*src="data:image/png;base64,([^"]+)"', text)
    assert [name for name, _ in images] == ["learning", "staleness", "throughput", "timeline"]
    for name, data in images:
        png = base64.b64decode(data)
        assert png.startswith(PNG_MAGIC) and len(png) > 5000
        assert (run_dir / "plots" / f"{name}.png").read_bytes() == png
    assert "http://" not in text and "https://" not in text  # self-contained: nothing to fetch
    assert "0.200 → 0.600" in text and "η 2" in text


def test_torn_last_line_of_a_killed_run_is_skipped(run_dir):
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 25, "reward_me')
    assert len(load_run(run_dir).steps) == N_STEPS


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


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("asyncrl report: error: ") and "Traceback" not in err, err
    return err


def test_cli_errors_are_one_line(tmp_path, capsys):
    from asyncrl.cli import main as asyncrl_main

    assert main([str(tmp_path)]) == 2
    assert "has no metrics.jsonl" in _one_line_error(capsys)
    assert asyncrl_main(["report", str(tmp_path)]) == 2  # `asyncrl report RUN_DIR` is the same command
    assert "has no metrics.jsonl" in _one_line_error(capsys)
    assert main([str(tmp_path / "missing")]) == 2
    assert "no such directory" in _one_line_error(capsys)
    with pytest.raises(ReportError, match="not a run directory"):
        load_run(tmp_path)
    for text, problem in (("", "holds no records"), ('{"step": 1}\n[1, 2]\n{"step": 2}\n', "JSON object"),
                          ('{"step": 1}\nnot json\n{"step": 2}\n', ":2: not JSON"),
                          ('{"step": "one"}\n', "must be an integer")):
        (tmp_path / "metrics.jsonl").write_text(text)
        assert main([str(tmp_path)]) == 2
        assert problem in _one_line_error(capsys)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "config.yaml").write_text("a: [1\n")
    assert main([str(tmp_path)]) == 2
    assert "config.yaml: not readable YAML" in _one_line_error(capsys)


@needs_matplotlib
def test_an_unwritable_output_is_one_line(run_dir, tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    assert main([str(run_dir), "--out", str(tmp_path / "a-file" / "report.html")]) == 2
    assert "a-file" in _one_line_error(capsys)


def test_the_command_for_the_main_cli(run_dir, monkeypatch, capsys):
    """``add_arguments`` + ``run`` are what ``asyncrl report`` wires in; the module imports without
    matplotlib, which then fails in one line that says how to install it."""
    from asyncrl.report import cli

    parser = argparse.ArgumentParser(prog="asyncrl report")
    cli.add_arguments(parser)
    args = parser.parse_args([str(run_dir), "--out", str(run_dir / "elsewhere.html")])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    assert cli.run(args) == 2
    assert _one_line_error(capsys) == ("asyncrl report: error: needs the 'report' extra (matplotlib): "
                                       "pip install 'asyncrl[report]'\n")
    assert main([str(run_dir)]) == 2 and "pip install 'asyncrl[report]'" in _one_line_error(capsys)
    probe = "import sys, asyncrl.report.cli; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)


@needs_matplotlib
def test_report_of_a_real_run(tmp_path, tiny_model_dir):
    from asyncrl import configlib
    from asyncrl.config import TrainConfig
    from asyncrl.launch.train import train

    train(configlib.load(TrainConfig, None, [
        f"model.path={tiny_model_dir}", f"output_dir={tmp_path}", "progress_bar=false", "total_train_steps=3",
        "train_dataset.batch_size=2", "gconfig.n_samples=2", "gconfig.max_new_tokens=12", "valid_dataset.size=4",
        "evaluator.freq_steps=2", "rollout.max_slots=8", "rollout.max_head_offpolicyness=1", "reward.workers=0",
        "reward.fn=rewards_for_tests:digit_count_reward",
    ]))
    run_dir = tmp_path / "asyncrl" / "default"
    assert (run_dir / "report.html").is_file()  # asyncrl train writes the report at the end of every run
    s = summarize(load_run(run_dir))
    assert s.steps == 3 and s.max_staleness == 1 and s.wall_s > 0 and s.gen_tokens_per_s > 0
    assert s.final_accuracy is not None and s.staleness_max <= 1
    text = write_report(run_dir).read_text()
    assert text.count('<img class="plot"') == 4


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@needs_matplotlib
@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install -y chromium)")
def test_page_renders_in_headless_chromium(run_dir, tmp_path):
    page = write_report(run_dir)
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'chromium'}",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    body = re.search(r"<body[^>]*>", result.stdout)
    assert body, result.stdout[:500]
    attrs = dict(re.findall(r'data-([\w-]+)="([^"]*)"', body.group(0)))
    assert attrs.get("plots-expected") == "4" and attrs.get("plots-loaded") == "4", attrs
    assert "js-errors" not in attrs, attrs["js-errors"]
    assert "Uncaught" not in result.stderr


def test_tool_time_of_an_agentic_run_is_plotted_per_step():
    from asyncrl.report.plots import tool_waits

    records = [{"step": 0, "elapsed_s": 0.0}, {"step": 1, "elapsed_s": 10.0, "step_time_s": 10.0, "agent_tool_s": 30.0},
               {"step": 2, "elapsed_s": 15.0, "step_time_s": 5.0, "agent_tool_s": 40.0}]
    assert tool_waits(records) == ([10.0, 15.0], [3.0, 2.0])  # 30 s of tools in 10 s, then 10 s in 5 s
    assert tool_waits(records[:1]) == ([], [])
