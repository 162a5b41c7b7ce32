"""A resumed run stamps its tokens with its own version: the staleness bound holds for every trained token
across resumes (a resumed engine once started at version 0, so its first rollouts looked 7 versions old)."""

import json

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.launch.build import assemble
from asyncrl.launch.resume import resume_point
from asyncrl.launch.train import train
from asyncrl.metrics import read_metrics

ETA = 1


def _overrides(tmp_path, model, steps: int) -> list[str]:
    train_file, valid_file = tmp_path / "prompts.jsonl", tmp_path / "valid.jsonl"
    train_file.write_text("".join(json.dumps({"question": f"Compute {i} + 7.", "answer": str(i + 7)}) + "\n"
                                  for i in range(200)))
    valid_file.write_text("".join(json.dumps({"question": f"Compute {i} + 1.", "answer": str(i + 1)}) + "\n"
                                  for i in range(100, 104)))
    return [f"model.path={model}", f"output_dir={tmp_path / 'out'}", f"train_dataset.path={train_file}",
            f"valid_dataset.path={valid_file}", "train_dataset.type=qa", "reward.fn=rewards_for_tests:digit_count_reward",
            "reward.workers=0", f"total_train_steps={steps}", "train_dataset.batch_size=2", "gconfig.n_samples=2",
            "gconfig.max_new_tokens=12", "rollout.max_slots=8", f"rollout.max_head_offpolicyness={ETA}",
            "saver.freq_steps=1", "evaluator.freq_steps=0", "max_train_time_s=0", "progress_bar=false", "report=false"]


def test_every_trained_token_is_within_the_bound_after_each_resume(tmp_path, tiny_model_dir):
    for steps in (2, 3, 4, 6, 8):  # a run stopped after step 2, resumed four times
        train(configlib.load(TrainConfig, None, _overrides(tmp_path, tiny_model_dir, steps)))
        cfg = configlib.load(TrainConfig, None, _overrides(tmp_path, tiny_model_dir, steps + 1))
        with assemble(cfg, resume=resume_point(cfg)) as parts:  # what the next resume starts with
            assert parts.start.version == steps and parts.engine.version == steps
    records = [r for r in read_metrics(tmp_path / "out" / "asyncrl" / "default") if r["step"] > 0]
    assert [r["step"] for r in records] == list(range(1, 9))
    for r in records:  # the histogram counts every trained token by its staleness (index 0 = current version)
        assert sum(r["staleness_hist"]) == r["n_samples"] * r["response_len_mean"], r
        assert r["staleness_max"] <= ETA and len(r["staleness_hist"]) <= ETA + 1, r
