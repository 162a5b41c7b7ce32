"""LoRA through peft: only the adapters train, engines get the merged weights, checkpoints hold the adapter (for
``peft.PeftModel.from_pretrained``) with a merged export, a LoRA run resumes with its adapters, and two DDP ranks
give the update of one. Bad targets and a missing peft are one-line refusals."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("peft")

from asyncrl import configlib  # noqa: E402
from asyncrl.config import TrainConfig  # noqa: E402
from asyncrl.configlib import ConfigError  # noqa: E402
from asyncrl.models.config import LoraConfig  # noqa: E402
from asyncrl.models.hf import load_model, resolve_model_path  # noqa: E402
from asyncrl.models.lora import (
    AdaptersOff,
    apply_lora,
    is_lora,
    merged_state_dict,
    save_lora,  # noqa: E402
    trainable_summary,
)

from conftest import ROOT, TESTS  # noqa: E402
from runs_for_tests import quick_config
from trainers_for_tests import lora_model, varied_batch  # noqa: E402


def _adapters(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_only_the_adapters_train_and_they_are_under_5_percent_of_the_shipped_model():
    from asyncrl.trainer import PolicyTrainer

    path = resolve_model_path("builtin:tiny-sft")
    plain = load_model(path)
    assert not is_lora(plain) and apply_lora(plain, rank=0) is plain
    assert trainable_summary(plain)["fraction"] == 1.0
    model = apply_lora(load_model(path), rank=8)
    counts = trainable_summary(model)
    assert is_lora(model) and 0 < counts["fraction"] < 0.05
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    optimized = [p for g in PolicyTrainer(model).optimizer.param_groups for p in g["params"]]
    assert sum(p.numel() for p in optimized) == counts["trainable"]


def test_merged_weights_are_peft_merge_and_unload_under_the_base_names_and_leave_the_model_as_it_was():
    import copy

    path = resolve_model_path("builtin:tiny-sft")
    base_keys = list(load_model(path).state_dict())
    model = lora_model(path=path)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    merged = merged_state_dict(model)
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    assert list(merged) == base_keys == list(expected)
    assert max(float((merged[k] - expected[k]).abs().max()) for k in base_keys) <= 1e-6
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged[q], load_model(path).state_dict()[q])  # the adapters are in it
    assert is_lora(model) and all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert not merged[q].requires_grad
    ids = torch.randint(0, 320, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the reference model of a LoRA run: the policy with its adapters off
        assert torch.equal(AdaptersOff(model)(input_ids=ids).logits, load_model(path)(input_ids=ids).logits)
        assert not torch.equal(model(input_ids=ids).logits, load_model(path)(input_ids=ids).logits)


def test_one_step_moves_the_adapters_and_the_published_weights_not_the_base_weights(tmp_path):
    from asyncrl.engine.local import LocalEngine
    from asyncrl.trainer import PolicyTrainer
    from asyncrl.types import SamplingParams, WeightUpdate
    from asyncrl.weights.wire import read_weights, write_weights

    from conftest import make_model

    engine = LocalEngine(make_model(320, seed=7), max_slots=4, max_len=64, native_kernels=False)
    model = lora_model()
    trainer = PolicyTrainer(model, lr=1e-2)
    base = {k: v.clone() for k, v in model.state_dict().items() if ".lora_" not in k}
    adapters, published = _adapters(model), {k: v.clone() for k, v in trainer.state_dict().items()}
    stats = trainer.step(varied_batch(4))
    assert stats["grad_norm"] > 0 and stats["nonfinite_skipped"] == 0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in base.items())  # the base weights stay
    assert all(not torch.equal(p, adapters[n]) for n, p in _adapters(model).items())
    after = trainer.state_dict()
    assert list(after) == list(published)
    down = "model.layers.0.mlp.down_proj.weight"
    assert not torch.equal(after[down], published[down])
    assert torch.equal(after["model.embed_tokens.weight"], published["model.embed_tokens.weight"])  # not adapted
    on_disk = read_weights(write_weights(after, tmp_path, 1))  # the disk transport (asyncrl serve, vLLM)
    assert set(on_disk) == set(after) and all(torch.equal(on_disk[k], after[k]) for k in after)
    engine.update_weights(WeightUpdate(1, state_dict=after))  # the engine's own path takes the merged weights
    (completion,) = engine.generate_batch([[5, 6, 7]], SamplingParams(max_new_tokens=4, greedy=True))[0]
    assert engine.version == 1 and len(completion.output_ids) == 4


def test_a_lora_checkpoint_loads_in_peft_and_gives_the_logits_of_its_merged_export(tmp_path, tokenizer):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from asyncrl.loop.checkpoint import TRAINER_STATE, Checkpointer, RunState, weights_dir
    from asyncrl.trainer import PolicyTrainer

    path = resolve_model_path("builtin:tiny-sft")
    model = lora_model(path=path)
    trainer = PolicyTrainer(model, lr=1e-2)
    trainer.step(varied_batch(4))
    ckpt = Checkpointer(tmp_path, trainer, tokenizer).save(1, RunState(version=1))
    assert (ckpt / "adapter_model.safetensors").is_file() and (ckpt / "adapter_config.json").is_file()
    assert weights_dir(ckpt) == str(ckpt / "merged") and (ckpt / "merged" / "tokenizer.json").is_file()
    optimizer = torch.load(ckpt / TRAINER_STATE, weights_only=False)["trainer"]["optimizer"]
    assert sum(s["exp_avg"].numel() for s in optimizer["state"].values()) == trainable_summary(model)["trainable"]

    ids = torch.randint(0, 320, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path), str(ckpt)).eval()
        merged = AutoModelForCausalLM.from_pretrained(str(ckpt / "merged")).eval()
        a, b, c = peft_model(ids).logits, merged(ids).logits, model.eval()(ids).logits
    assert (a - b).abs().max() < 1e-4 and (a - c).abs().max() < 1e-5
    save_lora(merged, tmp_path / "plain")  # a model without adapters: a plain HF checkpoint
    assert (tmp_path / "plain" / "config.json").is_file() and not (tmp_path / "plain" / "merged").exists()


def test_a_target_that_matches_nothing_or_no_layer_is_one_line(monkeypatch):
    from conftest import make_model

    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules: 'qq_proj' matches no module") as e:
        apply_lora(make_model(), rank=4, target_modules=["q_proj", "qq_proj"])
    assert "\n" not in str(e.value) and "q_proj" in str(e.value)
    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules: 'mlp' is a Qwen2MLP"):
        apply_lora(make_model(), rank=4, target_modules=["mlp"])
    monkeypatch.setitem(sys.modules, "peft", None)  # peft not installed
    with pytest.raises(ConfigError, match=r'lora extra: pip install -e "\.\[lora\]"'):
        apply_lora(make_model(), rank=4)


def _cfg(tmp_path, model_path, *extra):
    return quick_config(
        tmp_path,
        model_path,
        "gconfig.max_new_tokens=12",
        "saver.freq_steps=1",
        "model.lora.rank=8",
        "actor.lr=1e-2",
        *extra,
    )


def test_bad_targets_and_fsdp_are_refused_when_a_run_is_built(tmp_path, tiny_model_dir):
    from asyncrl.launch.build import assemble

    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules: 'qkv' matches no module"):
        with assemble(_cfg(tmp_path, tiny_model_dir, "total_train_steps=1", "model.lora.target_modules=[qkv]")):
            pass
    with pytest.raises(ConfigError, match=r"LoRA trains with ddp:dN or one rank"):
        with assemble(_cfg(tmp_path, tiny_model_dir, "total_train_steps=1", "actor.backend=fsdp:d2")):
            pass


@pytest.mark.slow
def test_a_lora_run_resumes_with_its_adapters_and_refuses_lora_switched_off(tmp_path, tiny_model_dir, capsys):
    from safetensors.torch import load_file

    from asyncrl import cli
    from asyncrl.launch.build import assemble
    from asyncrl.launch.resume import resume_point
    from asyncrl.launch.train import train
    from asyncrl.loop.controller import run
    from asyncrl.models.hf import load_model

    train(_cfg(tmp_path, tiny_model_dir, "total_train_steps=2", "actor.ref_model=init", "actor.kl_ctl=0.01"))
    run_dir = tmp_path / "asyncrl" / "default"
    saved = load_file(str(run_dir / "checkpoints" / "step2" / "adapter_model.safetensors"))
    cfg = _cfg(tmp_path, tiny_model_dir, "total_train_steps=3", "actor.ref_model=init", "actor.kl_ctl=0.01")
    point = resume_point(cfg)
    assert point.name == "step2"
    with assemble(cfg, resume=point) as parts:
        trainer = parts.trainer
        assert is_lora(trainer.module) and trainer.steps_done == 2
        from peft import get_peft_model_state_dict

        resumed = get_peft_model_state_dict(trainer.module)
        assert set(resumed) == set(saved) and all(torch.equal(resumed[k], saved[k]) for k in saved)
        assert len(trainer.optimizer.state) == len(saved)  # AdamW's moments of the adapters came back
        with torch.no_grad():  # the reference is the base, not the policy: adapters moved away from zero (whether
            # or not 2 steps of 2x2 samples had a reward signal) change the policy, not the reference
            for name, p in trainer.module.named_parameters():
                if "lora_B" in name:
                    p.add_(0.05)
            ids = torch.tensor([[5, 9, 14, 20, 31]])
            base = load_model(str(tiny_model_dir)).eval()(input_ids=ids).logits
            assert torch.allclose(trainer.ref_model(input_ids=ids).logits, base, atol=1e-5)
            assert not torch.allclose(trainer.module(input_ids=ids).logits, base, atol=1e-3)
        record = run(parts)
    assert record["version"] == 3 and "ref_kl" in record
    assert [json.loads(l)["step"] for l in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]
    args = [
        "train",
        f"model.path={tiny_model_dir}",
        f"output_dir={tmp_path}",
        "progress_bar=false",
        "report=false",
        "train_dataset.batch_size=2",
        "gconfig.n_samples=2",
        "gconfig.max_new_tokens=12",
        "valid_dataset.size=4",
        "evaluator.freq_steps=0",
        "rollout.max_slots=8",
        "reward.fn=rewards_for_tests:digit_count_reward",
        "reward.workers=0",
        "saver.freq_steps=1",
        "actor.lr=1e-2",
        "total_train_steps=4",
        "actor.ref_model=init",
        "actor.kl_ctl=0.01",
        "model.lora.rank=0",
    ]
    capsys.readouterr()
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "model.lora.rank: '8' -> '0'" in err and "resume=fresh" in err


def test_two_ddp_ranks_train_the_adapters_as_one_rank_does(two_trainer_ranks):
    """Two DDP ranks (spawned once for the session: the two_trainer_ranks fixture) against one process."""
    from asyncrl.trainer import PolicyTrainer

    single = PolicyTrainer(lora_model(), lr=1e-2, max_grad_norm=0.0, pack_sequences=True)
    before = {k: v.clone() for k, v in single.state_dict().items()}
    stats = single.step(varied_batch(5))
    weights, parallel_stats = two_trainer_ranks["lora-ddp"]
    moved = 0.0
    for name, w in single.state_dict().items():
        got = torch.from_numpy(weights[name])
        assert torch.allclose(got, w, atol=1e-5, rtol=1e-4), (name, float((got - w).abs().max()))
        moved = max(moved, float((w - before[name]).abs().max()))
    assert moved > 1e-6
    assert parallel_stats["loss"] == pytest.approx(stats["loss"], abs=1e-5)


@pytest.mark.slow
def test_asyncrl_train_with_lora_end_to_end(tmp_path):
    """`asyncrl train model.lora.rank=8` on the shipped model: three steps, the parameter counts logged, a LoRA
    checkpoint whose merged export `asyncrl serve`/AutoModelForCausalLM can load."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncrl.cli",
            "train",
            "model.lora.rank=8",
            "actor.lr=1e-3",
            f"output_dir={tmp_path}",
            "total_train_steps=3",
            "train_dataset.batch_size=2",
            "gconfig.n_samples=2",
            "gconfig.max_new_tokens=16",
            "valid_dataset.size=4",
            "evaluator.freq_steps=0",
            "rollout.max_slots=8",
            "progress_bar=false",
            "report=false",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trainable parameters of" in done.stderr and "LoRA rank 8" in done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["version"] == 3
    step = tmp_path / "asyncrl" / "default" / "checkpoints" / "step3"
    assert (step / "adapter_model.safetensors").is_file() and (step / "merged" / "model.safetensors").is_file()
    load_model(str(step / "merged"))


def test_the_lora_example_loads_with_rank_8_and_trains_under_5_percent_of_the_shipped_model():
    """examples/lora.yaml (documented in docs/lora.md): rank 8 on every projection, actor.lr 1e-3, and its
    adapters are under 5% of builtin:tiny-sft's parameters (the fraction the start-up log line reports)."""
    cfg = configlib.load(TrainConfig, str(ROOT / "examples" / "lora.yaml"))
    assert cfg.experiment_name == "lora" and cfg.model.path == "builtin:tiny-sft"
    assert cfg.model.lora.rank == 8 and cfg.model.lora.target_modules == LoraConfig().target_modules
    assert cfg.actor.lr == pytest.approx(1e-3)
    model = apply_lora(load_model(resolve_model_path(cfg.model.path)), **dataclasses.asdict(cfg.model.lora))
    assert 0 < trainable_summary(model)["fraction"] < 0.05


def test_the_proximal_log_probs_are_those_of_the_weights_not_of_a_dropout_mask():
    """With LoRA dropout, the no-grad passes (proximal log-probs, values) run in eval mode, as the engine samples:
    two recomputes under the same weights agree (they differed by 0.49 nats), and the model trains on after."""
    from asyncrl.trainer import PolicyTrainer

    from conftest import make_model

    torch.manual_seed(0)
    model = apply_lora(make_model(320, seed=7), rank=4, dropout=0.5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # adapters that change the outputs, so that their dropout shows
    trainer = PolicyTrainer(model, ppo_n_minibatches=2)
    batch = varied_batch(4)
    first, second = trainer.logprobs(batch), trainer.logprobs(batch)
    assert torch.equal(first, second) and trainer.module.training
