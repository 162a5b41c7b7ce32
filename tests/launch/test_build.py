"""Assembling a run (asyncrl.launch.build): each thread has its own tokenizer, an allocation the machine's GPUs cannot
hold is refused and servers are pinned, and the context is the model's own on vLLM and SGLang, capped on the
built-in engine."""

import pytest
import torch

from asyncrl import configlib
from asyncrl.cluster.cores import SHARED_MB_TOKENS
from asyncrl.config import TrainConfig
from asyncrl.launch.build import assemble
from asyncrl.loop.controller import run

from runs_for_tests import quick_config


def _cfg(tmp_path, model_path, *extra):
    return quick_config(tmp_path, model_path, "total_train_steps=3", "gconfig.max_new_tokens=16", *extra)


@pytest.mark.slow
def test_each_thread_has_its_own_tokenizer(tmp_path, tiny_model_dir):
    """Fast tokenizers can fail with 'Already borrowed' when two threads use one at once: the rollout thread
    (prompt stream, workflow) and the trainer thread (evaluation, checkpoints) each get their own, and
    evaluation uses the prompt ids computed when the held-out set was built. Evaluating at every step runs
    both paths side by side."""
    cfg = _cfg(tmp_path, tiny_model_dir, "evaluator.freq_steps=1", "total_train_steps=4")
    with assemble(cfg) as parts:
        assert parts.rollout.workflow.tokenizer is not parts.evaluate.tokenizer
        assert parts.checkpoints.tokenizer is parts.evaluate.tokenizer
        assert all("prompt_ids" in item for item in parts.evaluate.items)
        record = run(parts)
    assert record["version"] == 4 and "eval_accuracy" in record


def test_a_run_refuses_an_allocation_its_gpus_cannot_hold_and_pins_servers(monkeypatch):
    from asyncrl.configlib import ConfigError
    from asyncrl.launch.build import _allocation

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    cfg = configlib.load(TrainConfig, None, ["actor.backend=ddp:d2", "rollout.backend=asyncrl:d3"])
    with pytest.raises(ConfigError, match="needs 2 device.* 3: 5 in all, but this machine has 4 cuda"):
        _allocation(cfg, "cuda:0")
    ok = configlib.load(TrainConfig, None, ["actor.backend=ddp:d2", "rollout.backend=asyncrl:d2"])
    assert _allocation(ok, "cuda:0").server_devices == ((2,), (3,))
    assert _allocation(cfg, "cpu").server_devices == ((), (), ())  # CPU: process counts only


def test_context_is_the_models_own_on_vllm_and_sglang_and_capped_on_the_built_in_engine():
    from asyncrl.configlib import ConfigError
    from asyncrl.launch.shape import context_len

    def rollout(*extra):
        return configlib.load(TrainConfig, None, ["rollout.interrupt_mode=abort", *extra]).rollout

    assert context_len(rollout(), 32768) == 1024 and context_len(rollout(), 512) == 512
    assert context_len(rollout(), 32768, 64) == 1024  # the tiny models' completions: the context stays 1024
    assert context_len(rollout(), 32768, 2048) == 4096 and context_len(rollout(), 3000, 2048) == 3000
    assert context_len(rollout("rollout.backend=vllm:d1"), 32768) == 32768
    assert (
        context_len(rollout("rollout.backend=remote", "rollout.server_addrs=[h:1]", "rollout.max_context=8192"), 32768)
        == 8192
    )
    with pytest.raises(ConfigError, match="rollout.max_context=9000 exceeds the model's max_position_embeddings"):
        context_len(rollout("rollout.max_context=9000"), 4096)


@pytest.mark.parametrize("split, mb_tokens", [("fixed", 8192), ("auto", SHARED_MB_TOKENS)])
def test_a_trainer_sharing_the_cores_takes_micro_batches_small_enough_to_re_read_its_share(
    tmp_path, tiny_model_dir, split, mb_tokens
):
    """With cluster.cpu_split=auto the trainer asks for its threads before each micro-batch; at one micro-batch a
    step it kept one core through a step whose second half the engine spent idle (asyncrl/cluster/cores.py)."""
    cfg = _cfg(tmp_path, tiny_model_dir, f"cluster.cpu_split={split}")
    with assemble(cfg) as parts:
        assert parts.trainer.forward.mb_max_tokens == mb_tokens
        assert (parts.trainer.forward.threads is not None) == (split == "auto")


@pytest.mark.parametrize(
    "split, background, in_trainer_thread", [("auto", False, True), ("auto", True, False), ("fixed", False, False)]
)
def test_sharing_the_cores_the_evaluation_runs_in_the_trainers_thread(
    tmp_path, tiny_model_dir, split, background, in_trainer_thread
):
    """A foreground single-turn evaluation under cluster.cpu_split=auto generates in the trainer's thread, on its
    threads and its pool of OpenMP workers; an engine thread of its own would add a pool (asyncrl/cluster/cores.py)."""
    cfg = _cfg(tmp_path, tiny_model_dir, f"cluster.cpu_split={split}", f"evaluator.background={background}")
    with assemble(cfg) as parts:
        engine = parts.evaluate.engine
        assert engine.started == (not in_trainer_thread)
        assert (engine.threads == parts.trainer.forward.threads) == in_trainer_thread
        if in_trainer_thread:
            assert parts.evaluate(1)["eval_accuracy"] >= 0.0  # generates here, not waiting on a loop


def test_the_live_verdict_knows_what_diagnose_knows_of_the_run():
    """The warnings during a run read the same settings as asyncrl diagnose: the transport, where evaluations and
    checkpoints run, the device (a run on the in-process transport was told to use it; a GPU run, more threads)."""
    from asyncrl.launch.rundir import verdict_settings

    settings = verdict_settings(configlib.load(TrainConfig, None, ["evaluator.background=true", "cluster.device=cpu"]))
    assert settings["transport"] == "inprocess" and settings["eval_background"] and settings["save_background"]
    assert settings["device"] == "cpu"


def test_evaluator_background_auto_runs_beside_training_only_with_a_core_or_device_to_spare(monkeypatch):
    """auto: the shared CPU split uses every core (on 2 cores the default run took 354 s with the evaluation beside
    training against 281 s in the foreground): foreground; a fixed split that leaves a core, or a GPU: beside."""
    from asyncrl.cluster.config import ClusterConfig
    from asyncrl.launch import rundir
    from asyncrl.launch.rundir import eval_background, verdict_settings

    def cfg(*overrides):
        return configlib.load(TrainConfig, None, ["cluster.device=cpu", *overrides])

    background, why = eval_background(cfg())
    assert not background and "share all" in why and why.startswith("auto:")
    assert eval_background(cfg("evaluator.background=true")) == (True, "set")
    assert eval_background(cfg("evaluator.background=false")) == (False, "set")
    assert not eval_background(cfg("evaluator.background=true"), evaluates_itself=True)[0]  # the agent's
    fixed = cfg("cluster.cpu_split=fixed", "actor.threads=1", "rollout.threads=1")
    monkeypatch.setattr(rundir, "process_cores", lambda: 2)
    assert eval_background(fixed) == (False, "auto: no core of the 2 left by the trainer and the engine")
    assert not eval_background(cfg("rollout.backend=asyncrl:d1"))[0]  # a server spawned here has its thread too
    monkeypatch.setattr(rundir, "process_cores", lambda: 4)
    assert eval_background(fixed) == (True, "auto: 2 of 4 cores left by the trainer and the engine")
    monkeypatch.setattr(ClusterConfig, "resolved_device", lambda self: "cuda:0")
    assert eval_background(cfg()) == (True, "auto: on cuda:0, beside training")
    monkeypatch.setattr(ClusterConfig, "resolved_device", lambda self: "cpu")
    settings = verdict_settings(cfg())
    assert not settings["eval_background"] and settings["eval_background_why"].startswith("auto:")


def test_the_verdict_says_when_auto_kept_the_evaluation_in_the_foreground():
    from asyncrl.telemetry.verdict import diagnose

    records = [{"step": 0}] + [
        {"step": s, "step_time_s": 1.0, "trainer_fwd_bwd_s": 0.6, "trainer_eval_s": 0.4} for s in range(1, 8)
    ]
    why = "auto: the trainer and the engine share all 2 cores (cluster.cpu_split=auto), so ..."
    (finding,) = [
        f
        for f in diagnose(records, {"eval_background": False, "eval_background_why": why}).findings
        if f.name == "eval/checkpoint-bound"
    ]
    assert "evaluator.background=auto kept evaluation in the foreground: the trainer and the engine share" in (
        finding.line()
    )
