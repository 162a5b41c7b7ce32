"""Metrics (asyncrl.telemetry.metrics): non-finite values written as such and read back, per-source metrics and
evaluation, and the TensorBoard sink."""

import json
import math

import pytest

from asyncrl.launch.train import train
from asyncrl.loop.evaluate import by_source
from asyncrl.telemetry.metrics import MetricsLogger, read_metrics, source_stats
from asyncrl.types import Trajectory, TrajectoryGroup

from runs_for_tests import EVALUATED_RUN, quick_config


def _cfg(tmp_path, model_path, *extra):
    return quick_config(tmp_path, model_path, *extra, base=EVALUATED_RUN)


@pytest.mark.slow
def test_tensorboard_sink_writes_events(tmp_path, tiny_model_dir):
    pytest.importorskip("tensorboard")
    cfg = _cfg(
        tmp_path, tiny_model_dir, "total_train_steps=2", "evaluator.freq_steps=0", "stats_logger.tensorboard=true"
    )
    train(cfg)
    events = list((tmp_path / "asyncrl" / "default" / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_metrics_and_evaluation_per_source():
    def group(item_id, *rewards):
        return TrajectoryGroup([Trajectory([1], [2], [0.0], [0], r) for r in rewards], item_id=item_id)

    class Sources:
        names = ["a", "b", "c"]

        def __call__(self, item_id):
            return {0: "a", 1: "b", 2: "a"}.get(item_id)

    stats = source_stats([group(0, 1.0, 0.0), group(1, 0.5, 0.5), group(2, 1.0, 1.0)], Sources())
    assert stats == {"samples/a": 4, "samples/b": 2, "samples/c": 0, "reward_mean/a": 0.75, "reward_mean/b": 0.5}
    items = [{"source": "a"}, {"source": "a"}, {"source": "b"}]
    assert by_source(items, [1.0, 0.0, 1.0]) == {
        "eval_accuracy/a": 0.5,
        "eval_reward_mean/a": 0.5,
        "eval_accuracy/b": 1.0,
        "eval_reward_mean/b": 1.0,
    }
    assert by_source([{"question": "q"}], [1.0]) == {}


def test_non_finite_metrics_are_written_as_such_and_read_back(tmp_path):
    logger = MetricsLogger(tmp_path)
    logger.log({"step": 1, "loss": math.nan, "grad_norm": math.inf, "x": -math.inf, "ok": 0.5})
    logger.close()
    raw = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert raw == {"step": 1, "loss": "nan", "grad_norm": "inf", "x": "-inf", "ok": 0.5}  # never null
    (record,) = read_metrics(tmp_path)
    assert math.isnan(record["loss"]) and record["grad_norm"] == math.inf and record["x"] == -math.inf


def test_the_console_explains_its_fields_once_and_draws_no_bar_into_a_file(caplog, capsys):
    """Output to a file or a pipe gets one log line per step (a progress bar's carriage returns garble it)."""
    import logging

    from asyncrl.telemetry.metrics import Console

    record = {"step": 1, "reward_mean": 0.5, "staleness_max": 1, "staleness_mean": 0.5, "step_time_s": 2.0}
    with caplog.at_level(logging.INFO, logger="asyncrl.telemetry.metrics"):
        console = Console(True, 10, terminal=False)
        console.show(record)
        console.close()
    lines = [r.message for r in caplog.records]
    assert lines[0].startswith("each step prints: step | reward") and sum("each step" in m for m in lines) == 1
    assert lines[1] == "1 | reward 0.500 | stale max 1 | mean 0.50 | step 2.00s"
    assert "\r" not in capsys.readouterr().err
    from asyncrl.telemetry.metrics import summary_line  # samples cut by max_new_tokens or the context are said when any

    assert summary_line({**record, "truncated_frac": 0.25}).endswith("step 2.00s | cut 25%")
    assert "cut" not in summary_line({**record, "truncated_frac": 0.0})
    bar = Console(True, 10, terminal=True)
    assert bar._bar is not None
    bar.close()


def test_a_few_samples_of_each_step_go_to_samples_jsonl_not_metrics(tmp_path):
    """What a TRL or verl user looks at first: the best and the worst completion of the first groups, with
    reward, the versions that generated them and their staleness; metrics.jsonl stays numbers."""
    import json

    from asyncrl.telemetry.metrics import MetricsLogger, sample_rows
    from asyncrl.types import Trajectory, TrajectoryGroup

    def traj(reward, versions, text=""):
        return Trajectory([1, 2], [3, 4], [0.0, 0.0], versions, reward, text=text)

    groups = [
        TrajectoryGroup([traj(0.0, [3, 4]), traj(1.0, [4, 5], "right"), traj(0.5, [5, 5])], item_id="a"),
        TrajectoryGroup([traj(1.0, [5, 5])], item_id="b"),
    ]
    rows = sample_rows(groups, 5, lambda ids: " ".join(map(str, ids)), k=3)
    assert [(r["item"], r["reward"], r["staleness"]) for r in rows] == [("a", 1.0, 1), ("a", 0.0, 2), ("b", 1.0, 0)]
    assert rows[0]["completion"] == "right" and rows[1]["completion"] == "3 4" and rows[0]["prompt"] == "1 2"
    assert (rows[0]["version_min"], rows[0]["version_max"]) == (4, 5)
    logger = MetricsLogger(tmp_path)
    logger.log({"step": 6, "version": 6, "reward_mean": 0.5, "samples": rows})
    logger.close()
    assert "samples" not in json.loads((tmp_path / "metrics.jsonl").read_text())
    written = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(written) == 3 and all(r["step"] == 6 for r in written)


def test_the_trainer_account_of_a_window_sums_to_it_with_the_time_between_spans_as_other():
    from asyncrl.telemetry.metrics import time_account

    spans = {
        "span_wait_s": 1.0,
        "span_train_s": 2.0,
        "span_sync_s": 0.5,
        "span_log_s": 0.1,
        "decode_s": 3.0,
        "idle_s": 1.0,
        "idle_gate_s": 0.4,
    }
    train = {"train_recompute_s": 0.2, "train_fwd_bwd_s": 1.5, "train_optim_s": 0.1}
    acc = time_account(5.0, lambda k: spans.get(k, 0.0), train)
    assert sum(v for k, v in acc.items() if k.startswith("trainer_")) == pytest.approx(5.0)
    # the rest of train (0.2) + log (0.1) + between the spans (5 - 1 - 2 - 0.5 - 0.1 = 1.4)
    assert acc["trainer_other_s"] == pytest.approx(1.7)
    assert acc["gen_idle_gate_s"] == 0.4 and acc["gen_idle_nowork_s"] == pytest.approx(0.6)
    assert sum(v for k, v in acc.items() if k.startswith("gen_")) == pytest.approx(5.0)


class _FullDisk:
    """A file whose writes fail as on a full disk."""

    def __init__(self, name):
        self.name, self.closed = name, False

    def write(self, _):
        import errno

        raise OSError(errno.ENOSPC, "No space left on device")

    flush = close = lambda self: None


def test_a_run_file_that_cannot_be_written_is_one_error_naming_it(tmp_path):
    """A full disk under metrics.jsonl or ledger.jsonl (which a resume reads) stops the run with one line naming the
    file (red team 4: it was a traceback); the timeline stops, said once, and the run goes on."""
    from asyncrl.telemetry.metrics import RunFileError
    from asyncrl.telemetry.timeline import Timeline

    for name in ("metrics.jsonl", "ledger.jsonl"):
        logger = MetricsLogger(tmp_path)
        attr = {"metrics.jsonl": "_file", "ledger.jsonl": "_ledger"}[name]
        getattr(logger, attr).close()
        setattr(logger, attr, _FullDisk(str(tmp_path / name)))
        with pytest.raises(RunFileError) as e:
            logger.log({"step": 3, "version": 4, "trained_items": [1, 2]})
        assert str(e.value).startswith(f"{name}: cannot write (No space left on device) at step 3: free space")
        logger.close()
    timeline = Timeline(tmp_path / "timeline.jsonl", engine_stats=lambda: None)
    timeline._file.close()
    timeline._file = _FullDisk(str(tmp_path / "timeline.jsonl"))
    timeline._write({"type": "span"})
    timeline._write({"type": "span"})  # said once, then nothing more is tried
    assert timeline._broken
    timeline.close()
