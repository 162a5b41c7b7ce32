"""Integration tier: a real vLLM-CPU server driven through the remote engine client.

Needs the separate environment ``.venv-vllm`` (docs/engine.md) and runs only when selected:

    .venv/bin/python -m pytest -m vllm tests/engine/test_vllm.py

Without ``.venv-vllm``, or without ``-m vllm``, every test here is skipped.
"""

import asyncio

import httpx
import pytest
import torch

from asyncrl.engine.remote import RemoteEngine
from asyncrl.engine.requests import NO_STOP_TOKENS
from asyncrl.engine.spawn import vllm_server
from asyncrl.models.hf import build_tiny_model
from asyncrl.types import SamplingParams, WeightUpdate
from asyncrl.weights.publish import DiskPublisher

from conftest import ROOT, reference_logprobs

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(900),  # the module's vLLM server starts in its first test
    pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=f"no vLLM environment at {VLLM_PYTHON} (docs/engine.md)"),
]


@pytest.fixture(scope="module")
def models(tokenizer, tmp_path_factory):
    """The tiny model (task tokenizer, untied embeddings) saved for vLLM, and a second set of weights."""
    root = tmp_path_factory.mktemp("vllm")
    shape = dict(hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=256)  # head_dim 64:
    old = build_tiny_model(tokenizer, **shape, seed=0).eval()  # vLLM-CPU's attention has no kernel for head_dim 16
    new = build_tiny_model(tokenizer, **shape, seed=1).eval()
    old.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return str(root / "model"), old, new, root


@pytest.fixture(scope="module")
def server(models):
    path, _, _, root = models
    proc = vllm_server(str(VLLM_PYTHON), path, "--served-model-name", "tiny", log_path=str(root / "vllm.log"))
    try:
        yield proc
    finally:
        proc.close()


@pytest.fixture
def engine(server, models):
    """A client whose server holds the original weights as version 0."""
    path = models[0]
    engine = RemoteEngine([server.url], api="vllm", interrupt_mode="abort").start()
    engine.update_weights(WeightUpdate(0, path=path), timeout=60)
    try:
        yield engine
    finally:
        engine.stop()


def _generated_tokens(url: str) -> float:
    """vLLM's Prometheus counter of generated tokens."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("vllm:generation_tokens_total"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("vllm:generation_tokens_total not in /metrics")


def _hf_greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


PROMPTS = [[5, 17, 42, 99, 7], [11, 12, 13], [200, 3, 150, 80, 21, 9]]


def test_generation_with_logprobs(engine, models):
    _, old, _, _ = models

    async def main():
        params = SamplingParams(max_new_tokens=10, greedy=True, stop_token_ids=NO_STOP_TOKENS)
        greedy = await asyncio.gather(*(engine.generate(p, params) for p in PROMPTS))
        sampled = await engine.generate(PROMPTS[0], SamplingParams(n=3, max_new_tokens=10, temperature=0.7))
        return greedy, sampled

    greedy, sampled = asyncio.run(main())
    for prompt, (c,) in zip(PROMPTS, greedy):
        assert c.output_ids == _hf_greedy(old, prompt, 10) and c.versions == [0] * 10
        assert torch.allclose(torch.tensor(c.logprobs), reference_logprobs(old, prompt, c.output_ids), atol=1e-4)
    assert len(sampled) == 3
    for c in sampled:
        ref = reference_logprobs(old, PROMPTS[0], c.output_ids, temperature=0.7)
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)


def test_weight_update_from_disk_changes_greedy_outputs(engine, models, tmp_path):
    _, old, new, _ = models
    publisher = DiskPublisher([engine], str(tmp_path))
    params = SamplingParams(max_new_tokens=10, greedy=True, stop_token_ids=NO_STOP_TOKENS)
    try:
        for version, model in [(1, new), (2, old)]:
            seconds = publisher.publish(model.state_dict(), version)
            (c,) = asyncio.run(engine.generate(PROMPTS[0], params))
            assert c.output_ids == _hf_greedy(model, PROMPTS[0], 10) and c.versions == [version] * 10, seconds
        assert _hf_greedy(new, PROMPTS[0], 10) != _hf_greedy(old, PROMPTS[0], 10)
    finally:
        publisher.close()


def test_pause_continue_and_update_mid_generation(engine, models, tmp_path):
    _, old, new, _ = models
    publisher = DiskPublisher([engine], str(tmp_path))
    try:

        async def paused():
            engine.pause()
            task = asyncio.ensure_future(engine.generate(PROMPTS[1], SamplingParams(max_new_tokens=4, greedy=True)))
            await asyncio.sleep(1.0)
            held = not task.done()
            await asyncio.to_thread(engine.resume)
            return held, await asyncio.wait_for(task, 60)

        held, (c,) = asyncio.run(paused())
        assert held and len(c.output_ids) == 4

        n_new = 480
        params = SamplingParams(n=2, max_new_tokens=n_new, temperature=1.0, stop_token_ids=NO_STOP_TOKENS)

        async def interrupted():
            start = _generated_tokens(engine.addrs[0])
            tasks = [asyncio.ensure_future(engine.generate(p, params)) for p in PROMPTS]
            while _generated_tokens(engine.addrs[0]) < start + 60:  # in flight: the server has decoded a few
                await asyncio.sleep(0.005)
            await asyncio.to_thread(publisher.publish, new.state_dict(), 1)
            return await asyncio.gather(*tasks)

        groups = asyncio.run(interrupted())
        spanning = 0
        for prompt, group in zip(PROMPTS, groups):
            for c in group:
                assert len(c.output_ids) == n_new and c.versions == sorted(c.versions)
                k = c.versions.index(1) if 1 in c.versions else n_new
                spanning += 0 < k < n_new
                got = torch.tensor(c.logprobs)
                assert torch.allclose(got[:k], reference_logprobs(old, prompt, c.output_ids)[:k], atol=1e-4)
                assert torch.allclose(got[k:], reference_logprobs(new, prompt, c.output_ids)[k:], atol=1e-4)
        assert spanning >= 1 and engine.stats().interruptions >= spanning
    finally:
        publisher.close()


def test_one_rl_step_end_to_end(engine, server, models, tmp_path):
    """The controller, by config alone, trains against the vLLM server (disk transport, abort on update)."""
    from asyncrl import configlib
    from asyncrl.config import TrainConfig
    from asyncrl.launch.train import train

    path = models[0]
    cfg = configlib.load(
        TrainConfig,
        None,
        [
            f"model.path={path}",
            f"output_dir={tmp_path}",
            "progress_bar=false",
            "report=false",
            "total_train_steps=2",
            "train_dataset.batch_size=2",
            "gconfig.n_samples=4",
            "gconfig.max_new_tokens=24",
            "valid_dataset.size=8",
            "evaluator.freq_steps=0",
            "rollout.max_slots=16",
            "actor.lr=1e-3",
            "reward.fn=rewards_for_tests:digit_count_reward",
            "rollout.backend=remote",
            f"rollout.server_addrs=[{server.url}]",
            "rollout.server_api=vllm",
            "rollout.interrupt_mode=abort",
            "rollout.weight_transport=disk",
            f"rollout.weight_dir={tmp_path / 'w'}",
        ],
    )
    last = train(cfg)
    assert last["version"] == 2 and last["rollout_failures"] == 0
    assert httpx.get(f"{server.url}/weight_info").json()["weight_version"] == "2"  # the server took both updates
