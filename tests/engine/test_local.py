"""The built-in engine (asyncrl.engine.local): greedy equals HF generate, log-probs equal a separate forward, continuous
batching, stop tokens and strings, weight updates mid-generation (recompute, abort, drain), pause, bad requests,
reduced precision, devices, and seeded sampling however a request is batched or interrupted."""

import asyncio
import dataclasses
import time

import pytest
import torch

from asyncrl.engine.local import LocalEngine
from asyncrl.engine.requests import NO_STOP_TOKENS
from asyncrl.types import SamplingParams, WeightUpdate

from conftest import make_model, reference_logprobs

VOCAB = 320


def _prompts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (int(l),), generator=g).tolist() for l in torch.randint(3, 15, (n,), generator=g)]


@pytest.mark.parametrize("native_kernels", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_greedy_matches_hf_generate(model_type, native_kernels):
    model = make_model(VOCAB, model_type=model_type)
    engine = LocalEngine(model, max_slots=8, max_len=64, native_kernels=native_kernels)
    prompts = _prompts(5)
    results = engine.generate_batch(prompts, SamplingParams(max_new_tokens=16, greedy=True))
    for prompt, (c,) in zip(prompts, results):
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, pad_token_id=0)
        assert c.output_ids == ref[0, len(prompt) :].tolist()
        assert c.finish_reason == "length" and c.versions == [0] * 16


@pytest.mark.parametrize("native_kernels", [True, False], ids=["native", "torch"])
def test_sampled_logprobs_match_a_separate_forward(native_kernels):
    model = make_model(VOCAB)
    engine = LocalEngine(model, max_slots=16, max_len=64, seed=3, native_kernels=native_kernels)
    prompts = _prompts(3)
    results = engine.generate_batch(prompts, SamplingParams(n=4, max_new_tokens=12, temperature=1.0))
    for prompt, group in zip(prompts, results):
        assert len(group) == 4
        for c in group:
            ref = reference_logprobs(model, prompt, c.output_ids)
            assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)


def test_temperature_scales_logprobs():
    model = make_model(VOCAB)
    engine = LocalEngine(model, max_slots=4, max_len=64)
    prompt = _prompts(1)[0]
    ((c,),) = engine.generate_batch([prompt], SamplingParams(max_new_tokens=8, temperature=0.7))
    ref = reference_logprobs(model, prompt, c.output_ids, temperature=0.7)
    assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)


def test_continuous_batching_equals_one_at_a_time():
    model = make_model(VOCAB)
    prompts = _prompts(7, seed=1)
    params = SamplingParams(max_new_tokens=10, greedy=True)
    alone = [LocalEngine(model, max_slots=2, max_len=64).generate_batch([p], params)[0][0].output_ids for p in prompts]
    # 3 slots for 7 requests with different stop points: requests join as others finish
    stops = [SamplingParams(max_new_tokens=m, greedy=True) for m in (10, 3, 10, 5, 10, 1, 10)]
    engine = LocalEngine(model, max_slots=3, max_len=64)
    futures = [engine.submit(p, s) for p, s in zip(prompts, stops)]
    engine.run_until_idle()
    for f, ref, s in zip(futures, alone, stops):
        assert f.result()[0].output_ids == ref[: s.max_new_tokens]


def test_stop_token_ends_a_sample():
    model = make_model(VOCAB)
    engine = LocalEngine(model, max_slots=2, max_len=64)
    prompt = _prompts(1)[0]
    ((free,),) = engine.generate_batch([prompt], SamplingParams(max_new_tokens=10, greedy=True))
    stop = free.output_ids[3]
    ((c,),) = engine.generate_batch([prompt], SamplingParams(max_new_tokens=10, greedy=True, stop_token_ids=(stop,)))
    assert c.finish_reason == "stop" and c.output_ids == free.output_ids[: free.output_ids.index(stop) + 1]


def test_interruption_spans_two_versions_and_recomputes_kv():
    old, new = make_model(VOCAB, seed=0), make_model(VOCAB, seed=1)
    engine = LocalEngine(old, max_slots=4, max_len=64, seed=0)
    prompt = _prompts(1, seed=5)[0]
    future = engine.submit(prompt, SamplingParams(n=2, max_new_tokens=12, temperature=1.0))
    for _ in range(4):  # the first step admits (1 token) and decodes (1 token): 5 tokens under version 0
        engine.step()
    engine.update_weights(WeightUpdate(1, state_dict=new.state_dict()))
    engine.run_until_idle()
    for c in future.result():
        assert c.versions == [0] * 5 + [1] * 7
        old_ref = reference_logprobs(old, prompt, c.output_ids)
        new_ref = reference_logprobs(new, prompt, c.output_ids)
        got = torch.tensor(c.logprobs)
        # tokens before the update came from the old weights, the rest from a KV cache recomputed under the new
        # weights: each matches a fresh forward pass of the model that produced it
        assert torch.allclose(got[:5], old_ref[:5], atol=1e-4)
        assert torch.allclose(got[5:], new_ref[5:], atol=1e-4)
        assert not torch.allclose(got[5:], old_ref[5:], atol=1e-2)  # the two models really differ


def test_recomputed_kv_gives_the_fresh_prefill_distribution():
    old, new = make_model(VOCAB, seed=0), make_model(VOCAB, seed=1)
    engine = LocalEngine(old, max_slots=2, max_len=64)
    prompt = _prompts(1, seed=2)[0]
    engine.submit(prompt, SamplingParams(max_new_tokens=20, greedy=True))
    for _ in range(4):
        engine.step()
    engine.update_weights(WeightUpdate(1, state_dict=new.state_dict()))
    (seq,) = engine._active
    logits = engine.decoder.forward(torch.tensor([[seq.tokens[-1]]]), 0, torch.tensor([seq.cached]), torch.tensor([1]))
    with torch.no_grad():
        fresh = new(torch.tensor([seq.tokens])).logits[0, -1]
    assert torch.allclose(logits[0].softmax(-1), fresh.softmax(-1), atol=1e-5)


def test_abort_mode_ends_requests_on_update():
    old, new = make_model(VOCAB, seed=0), make_model(VOCAB, seed=1)
    engine = LocalEngine(old, max_slots=2, max_len=64, interrupt_mode="abort")
    future = engine.submit(_prompts(1)[0], SamplingParams(max_new_tokens=12, greedy=True))
    engine.step()  # admit (first token) + one decode step
    engine.update_weights(WeightUpdate(1, state_dict=new.state_dict()))
    (c,) = future.result(timeout=1)
    assert c.finish_reason == "abort" and len(c.output_ids) == 2 and engine.version == 1


def test_abort_mode_generate_continues_a_groups_samples_concurrently():
    """generate() (the engine seam) returns finished samples: after an abort, the group's samples are
    resubmitted together, so they decode side by side (the group takes its longest remainder, not the sum)."""
    old, new = make_model(VOCAB, seed=0), make_model(VOCAB, seed=1)
    engine = LocalEngine(old, max_slots=8, max_len=256, interrupt_mode="abort").start()
    try:

        async def main():
            task = asyncio.ensure_future(
                engine.generate([1, 2, 3], SamplingParams(n=4, max_new_tokens=200, greedy=True))
            )
            while engine.stats().generated_tokens < 8:  # all four samples are decoding
                await asyncio.sleep(0.001)
            await asyncio.to_thread(engine.update_weights, WeightUpdate(1, state_dict=new.state_dict()))
            resumed_together = 0
            while not task.done():  # the four continuations run in the same decode steps
                resumed_together = max(resumed_together, len(engine._active))
                await asyncio.sleep(0)
            return await task, resumed_together

        group, together = asyncio.run(main())
    finally:
        engine.stop()
    assert together == 4
    for c in group:
        assert c.finish_reason == "length" and len(c.output_ids) == 200 == len(c.versions) == len(c.logprobs)
        assert c.versions[0] == 0 and c.versions[-1] == 1 and c.versions == sorted(c.versions)


@pytest.mark.parametrize("threaded", [False, True])
def test_drain_mode_finishes_running_requests_before_an_update(threaded):
    old, new = make_model(VOCAB, seed=0), make_model(VOCAB, seed=1)
    engine = LocalEngine(old, max_slots=2, max_len=128, interrupt_mode="drain")
    first = engine.submit(_prompts(1)[0], SamplingParams(max_new_tokens=40, greedy=True))
    engine.step()  # the first request is running
    second = engine.submit(_prompts(1, seed=1)[0], SamplingParams(max_new_tokens=5, greedy=True))
    if threaded:
        engine.start()
    try:
        engine.update_weights(WeightUpdate(1, state_dict=new.state_dict()), timeout=30)
        engine.run_until_idle() if not threaded else None
        (a,), (b,) = first.result(timeout=30), second.result(timeout=30)
    finally:
        engine.stop()
    # the running request finished under the old weights; no request spans the update
    assert a.versions == [0] * 40 and a.finish_reason == "length" and engine.version == 1
    assert b.versions in ([0] * 5, [1] * 5)
    if not threaded:  # the queued request started only after the update
        assert b.versions == [1] * 5


def test_threaded_engine_async_generate_and_update():
    old, new = make_model(VOCAB, seed=0), make_model(VOCAB, seed=1)
    engine = LocalEngine(old, max_slots=8, max_len=128).start()
    try:

        async def main():
            task = asyncio.ensure_future(engine.generate(_prompts(1)[0], SamplingParams(n=3, max_new_tokens=100)))
            await asyncio.sleep(0.02)
            engine.update_weights(WeightUpdate(1, state_dict=new.state_dict()), timeout=10)
            return await task

        group = asyncio.run(main())
        assert len(group) == 3 and engine.version == 1
        assert all(c.versions == sorted(c.versions) for c in group)
    finally:
        engine.stop()


def test_the_counters_read_at_any_moment_add_up_to_the_time_between_readings():
    """Every moment of the loop is in one phase, counted up to the reading: two readings, taken anywhere in the
    loop's iterations (generating, updating weights, idle), differ by the time between them, and no phase's
    counter ever goes back."""
    phases = ("prefill_s", "decode_s", "reprefill_s", "paused_s", "idle_s")
    old, new = make_model(VOCAB, seed=0), make_model(VOCAB, seed=1)
    engine = LocalEngine(old, max_slots=8, max_len=128).start()
    try:
        futures = [engine.submit(p, SamplingParams(n=2, max_new_tokens=100)) for p in _prompts(3)]
        readings = []

        def read():
            before = time.perf_counter()
            stats = engine.stats()
            readings.append((before, time.perf_counter(), stats))

        while engine.stats().generated_tokens == 0:  # a fast CPU decodes all 600 tokens in ~30 ms: update while
            read()  # they are in flight, so that re-prefill is counted too
        engine.update_weights(WeightUpdate(1, state_dict=new.state_dict()), timeout=10)
        for _ in range(30):
            read()
            time.sleep(0.003)
        [f.result(timeout=30) for f in futures]
        read()
    finally:
        engine.stop()
    for (a0, a1, a), (b0, b1, b) in zip(readings, readings[1:]):
        counted = sum(getattr(b, p) - getattr(a, p) for p in phases)
        assert b0 - a1 <= counted <= b1 - a0
        assert all(getattr(b, p) >= getattr(a, p) for p in phases)
    last = readings[-1][2]
    assert last.decode_s > 0 and last.prefill_s > 0 and last.reprefill_s > 0 and last.idle_s > 0


def test_pause_holds_generation_at_a_token_boundary():
    engine = LocalEngine(make_model(VOCAB), max_slots=2, max_len=64).start()
    try:
        engine.pause()
        future = engine.submit(_prompts(1)[0], SamplingParams(max_new_tokens=5, greedy=True))
        with pytest.raises(TimeoutError):
            future.result(timeout=0.3)
        engine.resume()
        assert len(future.result(timeout=10)[0].output_ids) == 5
    finally:
        engine.stop()


def test_bad_requests_are_refused_with_a_reason():
    engine = LocalEngine(make_model(VOCAB), max_slots=2, max_len=32)
    with pytest.raises(ValueError, match="max_len"):
        engine.submit([1] * 30, SamplingParams(max_new_tokens=8))
    with pytest.raises(ValueError, match="slots"):
        engine.submit([1], SamplingParams(n=3))
    with pytest.raises(ValueError, match="token ids"):
        engine.submit([VOCAB + 5], SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="empty"):
        engine.submit([], SamplingParams(max_new_tokens=4))


def test_update_with_missing_weights_keeps_old_model():
    model = make_model(VOCAB)
    engine = LocalEngine(model, max_slots=2, max_len=32)
    partial = {k: v for k, v in model.state_dict().items() if "lm_head" not in k}
    with pytest.raises(KeyError, match="lm_head"):
        engine.update_weights(WeightUpdate(1, state_dict=partial))
    assert engine.version == 0
    ((c,),) = engine.generate_batch([[1, 2, 3]], SamplingParams(max_new_tokens=3, greedy=True))
    assert len(c.output_ids) == 3


def test_qwen3_greedy_matches_hf_generate():
    """Qwen3's per-head q/k RMSNorm and explicit head_dim go through the same fused forward."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=256,
            tie_word_embeddings=True,
        )
    ).eval()
    engine = LocalEngine(model, max_slots=4, max_len=64)
    prompts = _prompts(3, seed=9)
    for prompt, (c,) in zip(prompts, engine.generate_batch(prompts, SamplingParams(max_new_tokens=12, greedy=True))):
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert c.output_ids == ref[0, len(prompt) :].tolist()
        assert torch.allclose(torch.tensor(c.logprobs), reference_logprobs(model, prompt, c.output_ids), atol=1e-4)


def test_stop_strings_end_a_sample(tokenizer):
    from asyncrl.models.hf import build_tiny_model

    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128).eval()
    engine = LocalEngine(model, max_slots=2, max_len=96, tokenizer=tokenizer)
    prompt = tokenizer("Compute 12 + 30.").input_ids
    params = SamplingParams(max_new_tokens=40, greedy=True, stop_token_ids=NO_STOP_TOKENS)
    free = engine.generate_batch([prompt], params)[0][0]
    text = tokenizer.decode(free.output_ids)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    future = engine.submit(prompt, dataclasses.replace(params, stop=(stop,)))
    engine.run_until_idle()
    (c,) = future.result()
    assert c.finish_reason == "stop" and c.output_ids == free.output_ids[: len(c.output_ids)]
    assert stop in tokenizer.decode(c.output_ids) and stop not in tokenizer.decode(c.output_ids[:-1])
    with pytest.raises(ValueError, match="tokenizer"):
        LocalEngine(model, max_slots=2, max_len=96).submit(prompt, SamplingParams(stop=("x",)))


def test_a_stop_string_split_by_an_abort_is_seen(tokenizer):
    """An abort cuts a sample inside a stop string (its first characters before, its last after): the resubmitted
    rest, whose prompt ends with the sample's own earlier output (stop_context), stops there all the same, as
    the uninterrupted sample does (it ran on to max_new_tokens)."""
    from asyncrl.engine.continuation import continue_aborted
    from asyncrl.models.hf import build_tiny_model
    from asyncrl.types import Completion

    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128).eval()
    engine = LocalEngine(model, max_slots=2, max_len=96, tokenizer=tokenizer)
    prompt = tokenizer("Compute 12 + 30.").input_ids
    params = SamplingParams(max_new_tokens=40, greedy=True, stop_token_ids=NO_STOP_TOKENS)
    free = engine.generate_batch([prompt], params)[0][0]

    def split_stop(k: int, chars: int) -> str | None:  # a string that first appears across tokens k-1 and k
        before, after = tokenizer.decode(free.output_ids[:k]), tokenizer.decode(free.output_ids[k : k + 1])
        stop = before[-chars:] + after[:1]
        return stop if len(before) >= chars and after and stop not in before else None

    found = [(k, s) for k in range(1, len(free.output_ids)) for chars in (1, 2, 3) for s in [split_stop(k, chars)] if s]
    if not found:
        pytest.skip("no string first appears across two tokens of this greedy sample")
    cut, stop = found[0]
    aborted = Completion(prompt, free.output_ids[:cut], free.logprobs[:cut], free.versions[:cut], "abort")
    stopping = dataclasses.replace(params, stop=(stop,))

    async def resubmit(ids, rest):
        future = engine.submit(ids, rest)
        engine.run_until_idle()
        return future.result()[0]

    c = asyncio.run(continue_aborted(aborted, stopping, resubmit))
    assert c.finish_reason == "stop" and c.output_ids == free.output_ids[: cut + 1]


def test_abort_ends_running_samples_and_keeps_queued_requests():
    engine = LocalEngine(make_model(VOCAB), max_slots=2, max_len=64)
    running = engine.submit([1, 2, 3], SamplingParams(n=2, max_new_tokens=30, greedy=True))
    queued = engine.submit([4, 5, 6], SamplingParams(max_new_tokens=5, greedy=True))
    engine.step()
    engine.step()
    engine.abort()
    group = running.result(timeout=1)
    assert [c.finish_reason for c in group] == ["abort", "abort"] and all(len(c.output_ids) == 3 for c in group)
    assert not queued.done()
    engine.run_until_idle()
    assert len(queued.result()[0].output_ids) == 5


def test_update_from_a_weights_directory(tmp_path):
    from asyncrl.weights.wire import write_weights

    old, new = make_model(VOCAB, seed=0), make_model(VOCAB, seed=1)
    engine = LocalEngine(old, max_slots=2, max_len=64)
    engine.update_weights(WeightUpdate(3, path=str(write_weights(new.state_dict(), tmp_path, 3))))
    prompt = _prompts(1)[0]
    ((c,),) = engine.generate_batch([prompt], SamplingParams(max_new_tokens=8, greedy=True))
    ids = torch.tensor([prompt])
    ref = new.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert c.output_ids == ref[0, len(prompt) :].tolist() and c.versions == [3] * 8


def test_bfloat16_engine_tracks_float32():
    model = make_model(VOCAB)
    prompts = _prompts(4, seed=3)
    params = SamplingParams(max_new_tokens=6, greedy=True)
    f32 = LocalEngine(model, max_slots=4, max_len=64).generate_batch(prompts, params)
    bf16 = LocalEngine(model, max_slots=4, max_len=64, dtype=torch.bfloat16).generate_batch(prompts, params)
    for (a,), (b,) in zip(f32, bf16):
        assert a.output_ids[0] == b.output_ids[0]
        assert abs(a.logprobs[0] - b.logprobs[0]) < 0.05


def test_emulated_half_precision_is_detected_and_warned(tmp_path, monkeypatch, caplog):
    from asyncrl.engine import decoder

    avx2, avx512 = tmp_path / "avx2", tmp_path / "avx512"
    avx2.write_text("flags\t\t: fpu sse avx2 fma\n")
    avx512.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert decoder.emulated_dtype(torch.bfloat16, str(avx2))
    assert not decoder.emulated_dtype(torch.bfloat16, str(avx512))
    assert decoder.emulated_dtype(torch.float16, str(avx512))  # AVX512-BF16 does not cover float16
    assert not decoder.emulated_dtype(torch.float32, str(avx2))
    assert not decoder.emulated_dtype(torch.bfloat16, str(tmp_path / "missing"))
    monkeypatch.setattr(decoder, "emulated_dtype", lambda dtype: dtype == torch.bfloat16)
    with caplog.at_level("WARNING", logger="asyncrl.engine.decoder"):
        LocalEngine(make_model(), max_slots=2, max_len=32, dtype=torch.bfloat16)
    assert "bfloat16 has no native support on this CPU" in caplog.text
    caplog.clear()
    LocalEngine(make_model(), max_slots=2, max_len=32)
    assert "native support" not in caplog.text


def test_prefill_of_many_prompts_with_padding_matches_one_by_one():
    """Prompts of different lengths prefilled together (padding writes go to the scratch column) and then decoded
    in one batch give the same tokens and log-probs as each prompt alone."""
    model = make_model(VOCAB)
    prompts = _prompts(6, seed=11)
    params = SamplingParams(n=2, max_new_tokens=6, greedy=True)
    together = LocalEngine(model, max_slots=12, max_len=32).generate_batch(prompts, params)
    for prompt, group in zip(prompts, together):
        (alone,) = LocalEngine(model, max_slots=2, max_len=32).generate_batch([prompt], params)
        for a, b in zip(group, alone):
            assert a.output_ids == b.output_ids
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def _run_with_an_update(engine, new_model, prompts, params):
    """Generate ``prompts`` in the calling thread with a weight update (re-prefill) after 3 steps."""
    futures = [engine.submit(p, s) for p, s in zip(prompts, params)]
    for _ in range(3):
        engine.step()
    engine.update_weights(WeightUpdate(1, state_dict=new_model.state_dict()))
    engine.run_until_idle()
    return [[(c.output_ids, c.logprobs, c.versions, c.finish_reason) for c in f.result()] for f in futures]


MIXED_PARAMS = [
    SamplingParams(n=2, max_new_tokens=9, temperature=0.8),  # sampled
    SamplingParams(max_new_tokens=7, greedy=True),  # greedy beside sampled rows
    SamplingParams(n=2, max_new_tokens=8, temperature=1.0, top_p=0.9, top_k=20),  # filtered
    SamplingParams(max_new_tokens=5, temperature=1.2),
]


@pytest.mark.parametrize("native_kernels", [True, False], ids=["native", "torch"])
def test_an_explicit_cpu_device_changes_nothing(native_kernels):
    """``device=torch.device("cpu")`` (and "cpu") builds the same engine as the default: every tensor on the CPU,
    the same tokens, log-probs and versions bit for bit, through prefill, continuous batching, greedy, sampled
    and top-k/top-p rows and a weight update with re-prefill."""
    old, new = make_model(VOCAB, seed=0), make_model(VOCAB, seed=1)
    prompts = _prompts(4, seed=7)
    runs = []
    for device in (None, torch.device("cpu"), "cpu"):
        engine = LocalEngine(
            old,
            max_slots=5,
            max_len=64,
            seed=4,
            native_kernels=native_kernels,
            **({} if device is None else {"device": device}),
        )
        assert engine.device == torch.device("cpu") and engine.generator.device == torch.device("cpu")
        d = engine.decoder
        assert (d.kernels is not None) == native_kernels
        tensors = [d.kv_cache, d.rotation, d.head_scale, d.logits, *dataclasses.asdict(d.w).values()]
        assert all(t.device.type == "cpu" for t in tensors if isinstance(t, torch.Tensor))
        runs.append(_run_with_an_update(engine, new, prompts, MIXED_PARAMS))
        assert {v for group in runs[-1] for c in group for v in c[2]} == {0, 1}  # the update landed mid-run
    assert runs[0] == runs[1] == runs[2]


def test_the_torch_path_makes_every_tensor_on_the_engines_device():
    """Device plumbing checked without a GPU. Under ``torch.set_default_device("meta")`` any tensor that the
    engine makes without naming a device lands on "meta", and the first op that meets it beside the engine's
    CPU tensors fails (a value read from it fails too). The engine on an explicit CPU device must run the whole
    torch path (the one a GPU takes: prefill, decode, the sampler with its generator and scratch, top-k/top-p,
    a weight update with re-prefill, slot compaction) exactly as outside the trap."""
    old, new = make_model(VOCAB, seed=0), make_model(VOCAB, seed=1)
    prompts = _prompts(4, seed=7)
    want = _run_with_an_update(
        LocalEngine(old, max_slots=5, max_len=64, seed=4, native_kernels=False), new, prompts, MIXED_PARAMS
    )
    with torch.device("meta"):
        assert torch.empty(1).device.type == "meta"  # the trap is set
        engine = LocalEngine(old, max_slots=5, max_len=64, seed=4, native_kernels=False, device=torch.device("cpu"))
        got = _run_with_an_update(engine, new, prompts, MIXED_PARAMS)
    assert got == want


@pytest.mark.parametrize("native_kernels", [True, False], ids=["native", "torch"])
def test_a_seeded_request_samples_the_same_tokens_however_it_is_batched_or_interrupted(native_kernels):
    """Counter-based draws (SamplingParams.seed): alone, beside other requests, with a different engine seed,
    and re-prefilled mid-way by a weight update to the same weights, a seeded request gets the same tokens;
    its samples differ from one another and from another seed's."""
    model = make_model(VOCAB)
    prompt, others = _prompts(1, seed=3)[0], _prompts(5, seed=4)
    params = SamplingParams(n=3, max_new_tokens=12, temperature=1.0, seed=1234)

    def engine(seed):
        return LocalEngine(model, max_slots=16, max_len=64, seed=seed, native_kernels=native_kernels)

    alone = [c.output_ids for c in engine(0).generate_batch([prompt], params)[0]]
    crowded = engine(7)
    busy = [crowded.submit(p, SamplingParams(n=2, max_new_tokens=12)) for p in others[:3]]
    target = crowded.submit(prompt, params)
    for p in others[3:]:
        busy.append(crowded.submit(p, SamplingParams(max_new_tokens=12)))
    for _ in range(5):
        crowded.step()
    crowded.update_weights(WeightUpdate(1, state_dict=model.state_dict()))  # recompute, same weights
    crowded.run_until_idle()
    assert [c.output_ids for c in target.result()] == alone
    assert len({tuple(ids) for ids in alone}) == 3  # the n samples are not copies of one another
    other = [c.output_ids for c in engine(0).generate_batch([prompt], dataclasses.replace(params, seed=99))[0]]
    assert other != alone


@pytest.mark.parametrize("native_kernels", [True, False], ids=["native", "torch"])
def test_a_seeded_group_aborted_mid_way_and_continued_samples_the_same_tokens(native_kernels):
    """interrupt_mode=abort: each sample is resubmitted alone (n=1) as prompt + tokens so far; it keeps drawing
    as sample i of its group (samples 1 and 2 continued on sample 0's draws: the group's samples correlated)."""
    from asyncrl.engine.continuation import continue_all

    model = make_model(VOCAB)
    prompt = _prompts(1, seed=3)[0]
    params = SamplingParams(n=3, max_new_tokens=20, temperature=1.0, seed=1234)

    def engine():
        return LocalEngine(model, max_slots=8, max_len=64, native_kernels=native_kernels)

    alone = [c.output_ids for c in engine().generate_batch([prompt], params)[0]]
    aborted = engine()
    first = aborted.submit(prompt, params)
    for _ in range(5):
        aborted.step()
    aborted.abort()
    assert all(c.finish_reason == "abort" for c in first.result())

    async def resubmit(ids, rest):
        ((c,),) = aborted.generate_batch([ids], rest)
        return c

    continued = asyncio.run(continue_all(first.result(), params, resubmit))
    assert [c.output_ids for c in continued] == alone and len({tuple(ids) for ids in alone}) == 3


def test_a_cancelled_request_leaves_its_slots_and_a_queued_one_never_starts():
    engine = LocalEngine(make_model(VOCAB), max_slots=2, max_len=64)
    long = SamplingParams(n=2, max_new_tokens=60, stop_token_ids=NO_STOP_TOKENS)
    running = engine.submit([1, 2, 3], long)
    queued = engine.submit([4, 5, 6], long)
    after = engine.submit([7, 8], SamplingParams(max_new_tokens=4, greedy=True, stop_token_ids=NO_STOP_TOKENS))
    engine.step()
    assert engine.n_running == 2 + 2  # two samples running, two requests queued
    assert running.cancel() and queued.cancel()  # as a cancelled asyncio.wrap_future does
    assert engine.n_running == 2 + 1
    engine.step()
    assert engine.n_running == 1  # the slots are free at the next token boundary (not after 60 tokens): `after` runs
    engine.run_until_idle()
    assert len(after.result(timeout=1)[0].output_ids) == 4
    assert engine.stats().generated_tokens == 2 * 3 + 4  # `running`: 3 tokens (2 steps); `queued` never started


def test_cancelling_an_async_generate_frees_the_engines_slots():
    engine = LocalEngine(make_model(VOCAB), max_slots=2, max_len=600).start()
    try:

        async def main():
            task = asyncio.ensure_future(
                engine.generate([1, 2, 3], SamplingParams(n=2, max_new_tokens=590, stop_token_ids=NO_STOP_TOKENS))
            )
            while engine.stats().generated_tokens < 4:
                await asyncio.sleep(0.001)
            task.cancel()
            for _ in range(2000):
                if engine.n_running == 0:
                    return engine.stats().generated_tokens
                await asyncio.sleep(0.001)
            raise AssertionError("the cancelled request kept its slots")

        assert asyncio.run(main()) < 2 * 590
    finally:
        engine.stop()


def test_a_cancel_racing_the_end_of_a_request_harms_no_other_request(monkeypatch):
    """The caller cancels between the engine's "not done yet" check and its set_result (another thread): the
    engine goes on, and the requests beside it are served (the race failed them all with InvalidStateError)."""
    from concurrent.futures import Future

    import asyncrl.engine.local as local

    class CancelledOnCheck(Future):
        def done(self):
            answer = super().done()
            if not answer and getattr(self, "racing", False):
                self.cancel()  # the other thread's cancel lands right after the check
            return answer

    engine = LocalEngine(make_model(VOCAB), max_slots=4, max_len=64)
    params = SamplingParams(max_new_tokens=3, greedy=True, stop_token_ids=NO_STOP_TOKENS)
    monkeypatch.setattr(local, "Future", CancelledOnCheck)
    racing = engine.submit([1, 2, 3], params)
    racing.racing = True
    beside = engine.submit([4, 5, 6], SamplingParams(max_new_tokens=6, greedy=True, stop_token_ids=NO_STOP_TOKENS))
    engine.run_until_idle()
    assert racing.cancelled() and len(beside.result(timeout=1)[0].output_ids) == 6
    engine._fail_all(RuntimeError("a failing step"))  # the same race there: nothing left, nothing raised
