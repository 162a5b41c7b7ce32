"""The report command (asyncrl.report.cli): errors in one line, an unwritable output, and `asyncrl report` without
matplotlib."""

import argparse
import subprocess
import sys

import pytest

from asyncrl.report import ReportError, load_run, main

from reports_for_tests import needs_matplotlib, synthetic_run


@pytest.fixture
def run_dir(tmp_path):
    return synthetic_run(tmp_path)


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
    for text, problem in (
        ("", "holds no records"),
        ('{"step": 1}\n[1, 2]\n{"step": 2}\n', "JSON object"),
        ('{"step": 1}\nnot json\n{"step": 2}\n', ":2: not JSON"),
        ('{"step": "one"}\n', "must be an integer"),
    ):
        (tmp_path / "metrics.jsonl").write_text(text)
        assert main([str(tmp_path)]) == 2
        assert problem in _one_line_error(capsys)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "config.yaml").write_text("a: [1\n")
    assert main([str(tmp_path)]) == 2
    assert "config.yaml:2:1: not valid YAML" in _one_line_error(capsys)


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
    assert _one_line_error(capsys) == (
        "asyncrl report: error: needs the 'report' extra (matplotlib): pip install 'asyncrl[report]'\n"
    )
    assert main([str(run_dir)]) == 2 and "pip install 'asyncrl[report]'" in _one_line_error(capsys)
    probe = "import sys, asyncrl.report.cli; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)
