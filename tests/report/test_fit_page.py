"""``asyncrl report`` on the output of ``asyncrl sft`` and ``asyncrl rm`` (asyncrl/report/fit_page.py): the
loss and held-out curves, the summary and, for SFT, the verdict."""

import json

import pytest

from asyncrl.report.cli import main as report_main


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_an_sft_output_gets_a_page_with_its_curves_and_verdict(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    records = [
        {"step": s, "loss": 0.0003 if s > 20 else 1.0 / s, **({"eval_accuracy": 0.02} if s % 10 == 0 else {})}
        for s in range(1, 41)
    ]
    _write(tmp_path / "sft_metrics.jsonl", records)
    assert report_main([str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert capsys.readouterr().out.strip() == str(tmp_path / "report.html")
    assert "asyncrl sft output" in page and "memorising" in page and 'id="plot-fit"' in page
    assert "1 → 0.0003" in page and (tmp_path / "plots" / "fit.png").stat().st_size > 1000


def test_an_rm_output_gets_its_pairwise_accuracy(tmp_path):
    pytest.importorskip("matplotlib")
    _write(
        tmp_path / "rm_metrics.jsonl",
        [
            {"step": 0, "eval_pair_accuracy": 0.5},
            {"step": 1, "loss": 0.7},
            {"step": 2, "loss": 0.4, "eval_pair_accuracy": 0.9},
        ],
    )
    assert report_main([str(tmp_path), "--out", str(tmp_path / "page" / "rm.html")]) == 0
    page = (tmp_path / "page" / "rm.html").read_text()
    assert "asyncrl rm output" in page and "held-out pairwise accuracy (start → end, best)" in page
    assert "0.5 → 0.9 (best 0.9 at step 2)" in page


def test_a_directory_that_is_neither_is_one_line(tmp_path, capsys):
    assert report_main([str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
