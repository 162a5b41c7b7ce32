"""The built-in engine on a CUDA device (skipped without one): ``pytest -m gpu tests/engine/test_gpu.py``.

Greedy generation equals HF ``generate`` on the same GPU, sampled log-probs equal a separate forward, every
tensor of the engine lives on the device, a decode step reads from the device once, and a weight update from a
state dict on the same device never goes through host memory.
"""

import warnings

import pytest
import torch

from asyncrl.engine.local import LocalEngine
from asyncrl.types import SamplingParams, WeightUpdate

from conftest import make_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

VOCAB = 320
CUDA = torch.device("cuda")


def _prompts(n, seed=0, vocab=VOCAB):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (int(n_),), generator=g).tolist() for n_ in torch.randint(3, 15, (n,), generator=g)]


def _model(seed=0, model_type="qwen2", vocab=VOCAB):
    return make_model(vocab, seed=seed, model_type=model_type).to(CUDA)


def _reference_logits(model, ids: list[int]) -> torch.Tensor:
    """float32 logits of every position of ``ids`` from one plain forward on the GPU (on the host)."""
    with torch.no_grad():
        return model(torch.tensor([ids], device=CUDA)).logits[0].float().cpu()


def _assert_greedy_equal(model, prompt, got: list[int], want: list[int]):
    """Equal token for token; a divergence is tolerated only at a near tie (the two computations sum in
    different orders), checked with the model's own logits at that position."""
    if got == want:
        return
    i = next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)
    logits = _reference_logits(model, prompt + want[:i])[-1]
    gap = abs(float(logits[got[i]] - logits[want[i]]))
    assert gap < 1e-4, f"greedy outputs differ at token {i} by a logit gap of {gap}: {got} vs {want}"


def _engine_tensors(engine: LocalEngine):
    d = engine.decoder
    yield from (d.kv_cache, d.rotation, d.head_scale, d.logits, d.w.embed, d.w.norm, d.w.lm_head)
    for layer in d.w.layers:
        yield from (t for t in vars(layer).values() if isinstance(t, torch.Tensor))


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_greedy_on_cuda_matches_hf_generate_on_cuda(model_type):
    model = _model(model_type=model_type)
    engine = LocalEngine(model, max_slots=8, max_len=64, device="cuda")
    assert engine.decoder.kernels is None  # the native kernels are CPU code
    assert engine.generator.device.type == "cuda"
    assert all(t.device.type == "cuda" for t in _engine_tensors(engine))
    prompts = _prompts(6)
    results = engine.generate_batch(prompts, SamplingParams(max_new_tokens=24, greedy=True))
    for prompt, (c,) in zip(prompts, results):
        ids = torch.tensor([prompt], device=CUDA)
        with torch.no_grad():
            ref = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False, pad_token_id=0
            )
        _assert_greedy_equal(model, prompt, c.output_ids, ref[0, len(prompt) :].tolist())
        assert c.finish_reason == "length" and c.versions == [0] * 24


def test_qwen3_greedy_on_cuda_matches_hf_generate():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = (
        Qwen3ForCausalLM(
            Qwen3Config(
                vocab_size=VOCAB,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=32,
                max_position_embeddings=256,
                tie_word_embeddings=False,
            )
        )
        .eval()
        .to(CUDA)
    )
    engine = LocalEngine(model, max_slots=4, max_len=64, device=CUDA)
    prompts = _prompts(3, seed=2)
    for prompt, (c,) in zip(prompts, engine.generate_batch(prompts, SamplingParams(max_new_tokens=16, greedy=True))):
        ids = torch.tensor([prompt], device=CUDA)
        with torch.no_grad():
            ref = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False, pad_token_id=0
            )
        _assert_greedy_equal(model, prompt, c.output_ids, ref[0, len(prompt) :].tolist())


@pytest.mark.parametrize("vocab", [VOCAB, 9000], ids=["small-vocab", "two-level-cdf"])
def test_sampled_logprobs_on_cuda_match_a_separate_forward(vocab):
    model = _model(vocab=vocab)
    engine = LocalEngine(model, max_slots=16, max_len=64, seed=3, device="cuda")
    params = [
        SamplingParams(n=4, max_new_tokens=12, temperature=1.0),
        SamplingParams(n=2, max_new_tokens=12, temperature=0.7),
        SamplingParams(max_new_tokens=12, greedy=True),
    ]
    prompts = _prompts(3, seed=1, vocab=vocab)
    futures = [engine.submit(p, s) for p, s in zip(prompts, params)]
    engine.run_until_idle()
    for prompt, p, f in zip(prompts, params, futures):
        for c in f.result():
            assert all(0 <= t < vocab for t in c.output_ids)
            logits = _reference_logits(model, prompt + c.output_ids)[len(prompt) - 1 : -1]
            ref = (logits / (1.0 if p.greedy else p.temperature)).log_softmax(-1)
            ref = ref.gather(-1, torch.tensor(c.output_ids)[:, None]).squeeze(-1)
            assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)


def test_a_seed_reproduces_a_sampled_run_on_cuda():
    model = _model()
    params = SamplingParams(n=3, max_new_tokens=10, temperature=1.0, top_p=0.9, top_k=50)
    runs = [
        LocalEngine(model, max_slots=8, max_len=64, seed=7, device="cuda").generate_batch(_prompts(2), params)
        for _ in range(2)
    ]
    assert [[c.output_ids for c in g] for g in runs[0]] == [[c.output_ids for c in g] for g in runs[1]]


def test_a_decode_step_reads_from_the_device_once():
    """After admission, a decode step queues its kernels and synchronises once: the read of the sampled tokens
    and log-probs (``torch.cuda.set_sync_debug_mode`` reports every synchronising call)."""
    model = _model()
    for params in (
        SamplingParams(n=4, max_new_tokens=40, temperature=1.0),
        SamplingParams(n=4, max_new_tokens=40, temperature=1.0, top_p=0.9, top_k=20),
        SamplingParams(n=4, max_new_tokens=40, greedy=True),
    ):
        engine = LocalEngine(model, max_slots=8, max_len=64, device="cuda")
        for prompt in _prompts(2):
            engine.submit(prompt, params)
        engine.step()  # admission (prefill) and the first decode step
        engine.step()  # the row parameters of this batch are built
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for _ in range(5):
                    engine.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = [w for w in caught if "synchronizing" in str(w.message)]
        assert len(syncs) <= 5, [str(w.message) for w in syncs]  # one per step
        engine.run_until_idle()


def test_weight_update_from_the_same_device_stays_on_the_device():
    """A state dict on the GPU goes device to device: the update's only transfer to the host is its one read
    of the finiteness flags (a few bytes), and the result equals an engine built from the new model."""
    old, new = _model(seed=0), _model(seed=1)
    engine = LocalEngine(old, max_slots=4, max_len=64, device="cuda")
    prompts = _prompts(3)
    params = SamplingParams(max_new_tokens=12, greedy=True)
    engine.generate_batch(prompts, params)
    sd = new.state_dict()
    assert all(t.device.type == "cuda" for t in sd.values())
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.update_weights(WeightUpdate(1, state_dict=sd))
        torch.cuda.synchronize()
    dtoh = [e.name for e in prof.events() if "Memcpy DtoH" in e.name]  # "Memcpy DtoH (Device -> Pageable)"
    assert len(dtoh) <= 1, dtoh
    assert all(t.device.type == "cuda" for t in _engine_tensors(engine))
    got = engine.generate_batch(prompts, params)
    want = LocalEngine(new, max_slots=4, max_len=64, device="cuda").generate_batch(prompts, params)
    assert [c.output_ids for (c,) in got] == [c.output_ids for (c,) in want]
    assert all(c.versions == [1] * 12 for (c,) in got)


def test_update_mid_generation_on_cuda_recomputes_the_cache():
    old, new = _model(seed=0), _model(seed=1)
    engine = LocalEngine(old, max_slots=4, max_len=64, seed=0, device="cuda")
    prompt = _prompts(1, seed=5)[0]
    future = engine.submit(prompt, SamplingParams(n=2, max_new_tokens=12, temperature=1.0))
    for _ in range(4):
        engine.step()
    engine.update_weights(WeightUpdate(1, state_dict=new.state_dict()))
    engine.run_until_idle()
    for c in future.result():
        assert c.versions == [0] * 5 + [1] * 7
        for model, span in ((old, slice(0, 5)), (new, slice(5, 12))):
            logits = _reference_logits(model, prompt + c.output_ids)[len(prompt) - 1 : -1]
            ref = logits.log_softmax(-1).gather(-1, torch.tensor(c.output_ids)[:, None]).squeeze(-1)
            assert torch.allclose(torch.tensor(c.logprobs)[span], ref[span], atol=1e-4)


def test_a_cpu_state_dict_updates_a_cuda_engine_and_a_non_finite_one_is_refused():
    old, new = _model(seed=0), make_model(VOCAB, seed=1)  # new stays on the CPU
    engine = LocalEngine(old, max_slots=2, max_len=64, device="cuda")
    engine.update_weights(WeightUpdate(1, state_dict=new.state_dict()))
    bad = {k: v.to(CUDA) for k, v in new.state_dict().items()}
    name = "model.layers.1.mlp.down_proj.weight"
    bad[name] = bad[name].clone()
    bad[name][0, 0] = float("nan")
    with pytest.raises(ValueError, match="down_proj"):
        engine.update_weights(WeightUpdate(2, state_dict=bad))
    assert engine.version == 1
    ((c,),) = engine.generate_batch([[3, 4, 5]], SamplingParams(max_new_tokens=6, greedy=True))
    ids = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        ref = new.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False, pad_token_id=0)
    _assert_greedy_equal(new.to(CUDA), [3, 4, 5], c.output_ids, ref[0, 3:].tolist())


def test_bfloat16_on_cuda_tracks_float32():
    model = _model()
    prompts = _prompts(4, seed=3)
    params = SamplingParams(max_new_tokens=6, greedy=True)
    f32 = LocalEngine(model, max_slots=4, max_len=64, device="cuda").generate_batch(prompts, params)
    bf16 = LocalEngine(model, max_slots=4, max_len=64, dtype=torch.bfloat16, device="cuda").generate_batch(
        prompts, params
    )
    for (a,), (b,) in zip(f32, bf16):
        assert a.output_ids[0] == b.output_ids[0]
        assert abs(a.logprobs[0] - b.logprobs[0]) < 0.05


def test_threaded_engine_on_cuda_with_an_in_process_publisher():
    """The engine loop in its own thread, weights published from a model on the same GPU."""
    import asyncio

    from asyncrl.weights.publish import InProcessPublisher

    old, new = _model(seed=0), _model(seed=1)
    engine = LocalEngine(old, max_slots=8, max_len=128, device="cuda").start()
    try:
        publisher = InProcessPublisher([engine])

        async def run():
            task = asyncio.gather(
                *(engine.generate(p, SamplingParams(n=2, max_new_tokens=60, temperature=1.0)) for p in _prompts(3))
            )
            await asyncio.sleep(0.05)
            await asyncio.to_thread(publisher.publish, new.state_dict(), 1)
            return await task

        groups = asyncio.run(run())
        assert engine.version == 1
        assert all(len(c.output_ids) == 60 for g in groups for c in g)
        (c,) = asyncio.run(engine.generate([5, 6, 7], SamplingParams(max_new_tokens=4, greedy=True)))
        assert c.versions == [1] * 4
    finally:
        engine.stop()
