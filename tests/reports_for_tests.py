"""A synthetic run directory shaped like `asyncrl train`'s, for the report tests: η = 2, held-out accuracy 0.2 ->
0.6 over 24 steps of 2 s each (0.5 s waiting, 1.2 s training, 0.1 s weight sync, 0.2 s evaluation or idle), and
a generator busy 75% of the time."""

import importlib.util
import json

import pytest

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="plots need matplotlib (pip install -e '.[report]')"
)
N_STEPS = 24
STEP_S = 2.0  # every synthetic step: 0.5 s waiting, 1.2 s training, 0.1 s sync, 0.2 s eval/idle


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def synthetic_run(tmp_path):
    """The run directory described above, under ``tmp_path``."""
    d = tmp_path / "exp" / "trial"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(
        "model:\n  path: builtin:tiny-sft\nrollout:\n  max_head_offpolicyness: 2\n"
        "train_dataset:\n  batch_size: 4\nactor:\n  policy_loss: decoupled_ppo\n"
    )
    records = [{"step": 0, "version": 0, "eval_accuracy": 0.2, "eval_time_s": 1.0}]
    spans, gen = [{"type": "span", "kind": "eval", "t0": 0.0, "t1": 1.0, "step": 0}], []
    for step in range(1, N_STEPS + 1):
        t = 1.0 + (step - 1) * STEP_S
        rec = {
            "step": step,
            "version": step,
            "reward_mean": 0.2 + 0.4 * step / N_STEPS,
            "staleness_max": min(step - 1, 2),
            "staleness_mean": min(step - 1, 2) / 2,
            "gen_tokens_per_s": 1000.0,
            "gen_busy_frac": 0.75,
            "train_tokens_per_s": 2000.0,
            "train_tokens": 2400,
            "train_time_s": 1.2,
            "trainer_wait_s": 0.5,
            "weight_sync_s": 0.1,
            "step_time_s": STEP_S,
            "elapsed_s": step * STEP_S,
        }
        if step % 4 == 0:
            rec.update(eval_accuracy=0.2 + 0.4 * step / N_STEPS, eval_time_s=0.2)
        records.append(rec)
        for kind, a, b in (("wait", 0.0, 0.5), ("train", 0.5, 1.7), ("sync", 1.7, 1.8), ("eval", 1.8, 2.0)):
            spans.append({"type": "span", "kind": kind, "t0": t + a, "t1": t + b, "step": step - 1})
    for i in range(int((1 + N_STEPS * STEP_S) / 0.25)):
        gen.append({"type": "gen", "t": 0.25 * i, "busy_s": 0.75 * 0.25 * i, "generated_tokens": 250 * i})
    write_jsonl(d / "metrics.jsonl", records)
    write_jsonl(d / "timeline.jsonl", spans + gen)
    return d
