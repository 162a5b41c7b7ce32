"""The report page (asyncrl.report.page): every plot inlined, the report `asyncrl train` writes at the end of a run,
and the page rendered in headless Chromium."""

import base64
import re
import shutil
import subprocess

import pytest

from asyncrl.report import load_run, summarize, write_report

from reports_for_tests import PNG_MAGIC, needs_matplotlib, synthetic_run


@pytest.fixture
def run_dir(tmp_path):
    return synthetic_run(tmp_path)


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


@pytest.mark.slow
@needs_matplotlib
def test_report_of_a_real_run(tmp_path, tiny_model_dir):
    from asyncrl import configlib
    from asyncrl.config import TrainConfig
    from asyncrl.launch.train import train

    train(
        configlib.load(
            TrainConfig,
            None,
            [
                f"model.path={tiny_model_dir}",
                f"output_dir={tmp_path}",
                "progress_bar=false",
                "total_train_steps=3",
                "train_dataset.batch_size=2",
                "gconfig.n_samples=2",
                "gconfig.max_new_tokens=12",
                "valid_dataset.size=4",
                "evaluator.freq_steps=2",
                "rollout.max_slots=8",
                "rollout.max_head_offpolicyness=1",
                "reward.workers=0",
                "reward.fn=rewards_for_tests:digit_count_reward",
            ],
        )
    )
    run_dir = tmp_path / "asyncrl" / "default"
    assert (run_dir / "report.html").is_file()  # asyncrl train writes the report at the end of every run
    s = summarize(load_run(run_dir))
    assert s.steps == 3 and s.max_staleness == 1 and s.wall_s > 0 and s.gen_tokens_per_s > 0
    assert s.final_accuracy is not None and s.staleness_max <= 1
    text = write_report(run_dir).read_text()
    assert text.count('<img class="plot"') == 5  # learning, staleness, throughput, corrections, timeline
    assert "Off-policy corrections" in text


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@needs_matplotlib
@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install -y chromium)")
def test_page_renders_in_headless_chromium(run_dir, tmp_path):
    page = write_report(run_dir)
    result = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'chromium'}",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=10000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    body = re.search(r"<body[^>]*>", result.stdout)
    assert body, result.stdout[:500]
    attrs = dict(re.findall(r'data-([\w-]+)="([^"]*)"', body.group(0)))
    assert attrs.get("plots-expected") == "4" and attrs.get("plots-loaded") == "4", attrs
    assert "js-errors" not in attrs, attrs["js-errors"]
    assert "Uncaught" not in result.stderr


def test_the_report_shows_sample_generations(tmp_path):
    import json

    from asyncrl.report.page import write_report

    from reports_for_tests import synthetic_run

    run = synthetic_run(tmp_path)
    rows = [
        {
            "step": s,
            "item": 1,
            "prompt": "Compute 2 + 3.",
            "completion": f"The answer is {s}.",
            "reward": 1.0,
            "finish_reason": "stop",
            "version_min": s - 1,
            "version_max": s - 1,
            "staleness": 0,
        }
        for s in range(1, 25)
    ]
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = write_report(run).read_text()
    assert "Sample generations" in page and "The answer is 24." in page and "The answer is 1." in page
    assert "The answer is 7." not in page  # the first, middle and last steps only


@needs_matplotlib
def test_the_report_replaces_links_in_the_run_directory_and_never_writes_through_them(tmp_path):
    """Red team 4, finding 4: report.html and plots/ as symlinks made asyncrl report overwrite files elsewhere."""
    run = synthetic_run(tmp_path)
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / "report.html").symlink_to(outside)
    (run / "plots").symlink_to(elsewhere, target_is_directory=True)
    page = write_report(run)
    assert outside.read_text() == "keep me" and list(elsewhere.iterdir()) == []
    assert not page.is_symlink() and "<html" in page.read_text()
    assert not (run / "plots").is_symlink() and any((run / "plots").glob("*.png"))
