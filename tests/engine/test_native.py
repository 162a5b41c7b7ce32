"""The engine's native kernels (asyncrl/engine/kernels.c) against the torch computations they replace."""

import logging

import pytest
import torch
import torch.nn.functional as F

from asyncrl.engine import native
from asyncrl.engine.decoder import Decoder, _attention, _rotate
from asyncrl.engine.layout import PANEL, _put_panels
from asyncrl.engine.local import LocalEngine
from asyncrl.engine.sampling import RowParams, sample_rows
from asyncrl.types import SamplingParams, WeightUpdate

from conftest import make_model, reference_logprobs

needs_cc = pytest.mark.skipif(native.compiler() is None, reason="no C compiler on this machine")


@pytest.fixture(scope="module")
def kernels():
    if native.compiler() is None:
        pytest.skip("no C compiler on this machine")
    k = native.load()
    assert k is not None, "a C compiler is present but the kernels did not build (see the logged warning)"
    return k


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def packed(w_hf: torch.Tensor) -> torch.Tensor:
    """An HF (out, in) weight in the packed layout."""
    out, inp = w_hf.shape
    dst = torch.zeros(-(-out // PANEL), inp, PANEL)
    _put_panels(dst.transpose(1, 2), w_hf, 0)
    return dst


@pytest.mark.parametrize("M,K,N", [(1, 64, 16), (7, 256, 40), (64, 256, 1536), (13, 768, 256), (200, 96, 33)])
def test_gemm_matches_torch(kernels, threads, M, K, N):
    g = torch.Generator().manual_seed(M * N)
    x, w, bias, res = (torch.randn(*s, generator=g) for s in [(M, K), (N, K), (N,), (M, N)])
    ref = (x.double() @ w.double().t()).float()
    out = torch.full((M, N), float("nan"))
    torch.testing.assert_close(kernels.gemm(x, packed(w), out), ref, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(kernels.gemm(x, packed(w), out, bias), ref + bias, atol=1e-4, rtol=1e-5)
    acc = res.clone()
    kernels.gemm(x, packed(w), acc, accumulate=True)  # the residual add, in place
    torch.testing.assert_close(acc, res + ref, atol=1e-4, rtol=1e-5)


def test_gemm_refuses_mismatched_shapes(kernels):
    with pytest.raises(ValueError, match="gemm: arguments do not fit"):
        kernels.gemm(torch.randn(4, 32), packed(torch.randn(16, 48)), torch.empty(4, 16))


def test_packing_parts_at_unaligned_offsets():
    """Rows of the parts of a fused matrix (q, k, v; gate, up) land in the right panels and columns."""
    parts = [torch.randn(n, 8) for n in (5, 20, 7, 32)]
    dst = torch.zeros(-(-64 // PANEL), 8, PANEL)
    at = 0
    for p in parts:
        _put_panels(dst.transpose(1, 2), p, at)
        at += p.shape[0]
    full = torch.cat(parts)  # (64, 8) in HF layout: dst[c // 16, :, c % 16] is row c
    assert torch.equal(dst.permute(0, 2, 1).reshape(-1, 8), full)


def test_rms_norm_matches_torch(kernels, threads):
    x, w = torch.randn(37, 256) * 3, torch.rand(256) + 0.5
    out = torch.empty_like(x)
    torch.testing.assert_close(kernels.rms_norm(x, w, 1e-6, out), F.rms_norm(x, (256,), w, 1e-6), atol=1e-6, rtol=1e-5)


def test_silu_gate_matches_torch(kernels, threads):
    gu = torch.randn(9, 2 * 100) * 10
    gu[0, :4] = torch.tensor([-200.0, 200.0, -88.0, 0.0])  # beyond exp's range either way
    out = torch.empty(9, 100)
    kernels.silu_mul(gu, out)
    gate, up = gu.chunk(2, dim=-1)
    torch.testing.assert_close(out, F.silu(gate) * up, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("nq,nk,D", [(4, 2, 64), (4, 4, 32), (8, 1, 128)])
def test_decode_attention_matches_the_torch_path(kernels, threads, nq, nk, D):
    """Rotary embedding, cache write and grouped-query attention of one new token per slot, at different
    positions per slot, in a range of slots that does not start at 0."""
    slots, cache_len, S, first = 6, 41, 4, 2
    g = torch.Generator().manual_seed(nq * D)
    cache = torch.randn(2, slots, nk, cache_len, D, generator=g)
    qkv = torch.randn(S, nq + 2 * nk, D, generator=g)
    pos = torch.tensor([0, 39, 17, 8])
    angles = torch.rand(cache_len, D // 2, generator=g) * 6
    rotation = torch.polar(torch.ones_like(angles), angles)
    scale = D**-0.5

    ref_cache, ref_qkv = cache.clone(), qkv.clone()[:, None]  # (S, C=1, heads, D)
    head_scale = torch.tensor([scale] * nq + [1.0] * nk)
    _rotate(ref_qkv[:, :, : nq + nk], rotation[pos][:, None, None, :] * head_scale[:, None])
    for i, p in enumerate(pos.tolist()):
        ref_cache[0, first + i, :, p] = ref_qkv[i, 0, nq : nq + nk]
        ref_cache[1, first + i, :, p] = ref_qkv[i, 0, nq + nk :]
    T = int(pos.max()) + 1
    mask = torch.zeros(S, 1, 1, 1, T).masked_fill_(torch.arange(T) > pos[:, None, None, None, None], float("-inf"))
    k, v = ref_cache[0, first : first + S, :, :T], ref_cache[1, first : first + S, :, :T]
    ref = _attention(ref_qkv[:, :, :nq], k, v, mask)[:, 0]

    out = torch.empty(S, nq * D)
    scratch = torch.empty(S * nq * cache_len)
    kernels.decode_attention(
        qkv, pos, torch.view_as_real(rotation).contiguous(), cache, out, scratch, first, nq, nk, scale
    )
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(cache, ref_cache, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(qkv[:, : nq + nk], ref_qkv[:, 0, : nq + nk], atol=2e-5, rtol=1e-5)


def test_gemm_of_no_rows_is_a_no_op(kernels):
    assert kernels.gemm(torch.empty(0, 32), packed(torch.randn(16, 32)), torch.empty(0, 16)).shape == (0, 16)


def test_kernels_refuse_arguments_that_do_not_fit(kernels):
    """Shapes, dtypes or layouts that would make a kernel read or write outside its tensors are refused."""
    x = torch.randn(4, 16)
    with pytest.raises(ValueError, match="rms_norm: .*x \\(4, 16\\) float64"):
        kernels.rms_norm(x.double(), torch.ones(16), 1e-6, torch.empty(4, 16))
    with pytest.raises(ValueError, match="not contiguous"):
        kernels.rms_norm(x.t(), torch.ones(4), 1e-6, torch.empty(16, 4))
    with pytest.raises(ValueError, match="silu_mul"):
        kernels.silu_mul(torch.randn(4, 10), torch.empty(4, 4))
    with pytest.raises(ValueError, match="sample"):
        kernels.sample(torch.randn(4, 16), torch.ones(4), torch.zeros(4), torch.rand(4), torch.empty(4, 16))
    with pytest.raises(ValueError, match="sample"):  # scratch too small
        kernels.sample(
            torch.randn(4, 16), torch.ones(4), torch.zeros(4, dtype=torch.bool), torch.rand(4), torch.empty(3, 16)
        )


def test_decode_attention_refuses_a_position_outside_the_cache(kernels):
    cache, qkv = torch.zeros(2, 1, 1, 9, 8), torch.zeros(1, 3, 8)
    with pytest.raises(ValueError, match="position 8 is outside the cache of 8"):
        kernels.decode_attention(
            qkv, torch.tensor([8]), torch.zeros(9, 4, 2), cache, torch.empty(1, 8), torch.empty(9), 0, 1, 1, 1.0
        )


def test_sampling_draws_the_same_tokens_as_the_torch_path(kernels, threads):
    """Same uniform draws, same tokens; log-probs equal; greedy rows and -inf logits handled alike."""
    g = torch.Generator().manual_seed(0)
    for V in (320, 5000):  # one block, several blocks of the two-level inverse CDF
        logits = torch.randn(64, V, generator=g) * 3
        logits[:, 7] = float("-inf")
        params = [SamplingParams(greedy=i % 5 == 0, temperature=0.5 + (i % 3) * 0.5) for i in range(64)]
        rows = RowParams.of(params)
        want_tok, want_lp = sample_rows(logits.clone(), rows, torch.Generator().manual_seed(1))
        got_tok, got_lp = sample_rows(
            logits.clone(), rows, torch.Generator().manual_seed(1), torch.empty(64, V), kernels
        )
        assert torch.equal(got_tok, want_tok)
        torch.testing.assert_close(got_lp, want_lp, atol=1e-5, rtol=1e-5)
        assert not (got_tok == 7).any()


def test_sampling_frequencies_follow_the_distribution(kernels):
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    logits = probs.log().expand(20000, 5).contiguous()
    rows = RowParams.of([SamplingParams(temperature=1.0)] * 20000)
    tokens, lp = sample_rows(logits, rows, torch.Generator().manual_seed(0), torch.empty(20000, 5), kernels)
    freq = torch.bincount(tokens, minlength=5).float() / 20000
    assert torch.allclose(freq, probs, atol=0.015) and freq[4] == 0
    torch.testing.assert_close(lp, probs.log()[tokens], atol=1e-6, rtol=1e-6)


def test_sampling_reaches_tokens_far_below_the_running_sum(kernels):
    """Tokens whose weight is below float32 resolution next to the running sum (4e-8 of one dominant token) are
    still drawn where the inverse CDF puts them, not skipped to the end of the row."""
    V = 8192
    logits = torch.full((9, V), -17.0)
    logits[:, 0] = 0.0
    w = (logits[0].double() - 0.0).exp()
    total, tail = float(w.sum()), float(w[1:].sum())
    u = torch.tensor([(1.0 + q * tail) / total for q in torch.linspace(0.1, 0.9, 9).tolist()], dtype=torch.float32)
    tokens, _ = kernels.sample(logits, torch.ones(9), torch.zeros(9, dtype=torch.bool), u, torch.empty(9, V))
    want = torch.searchsorted(w.cumsum(0), u.double() * total, right=True)
    assert (tokens - want).abs().max() <= 1, (tokens, want)


@needs_cc
@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_native_and_torch_decoders_agree(model_type):
    """Prefill (packed GEMMs) and decode steps (all kernels) give the torch path's logits."""
    model = make_model(320, model_type=model_type)
    a, b = Decoder(model, 4, 40, native_kernels=False), Decoder(model, 4, 40)
    assert a.kernels is None and b.kernels is not None
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 9, 1, 7])
    tokens = torch.randint(0, 320, (4, 9), generator=g)
    zeros = torch.zeros(4, dtype=torch.long)
    torch.testing.assert_close(
        b.forward(tokens, 0, zeros, lengths), a.forward(tokens, 0, zeros, lengths), atol=1e-4, rtol=1e-4
    )
    start, ones = lengths.clone(), torch.ones(4, dtype=torch.long)
    for _ in range(5):
        step = torch.randint(0, 320, (4, 1), generator=g)
        torch.testing.assert_close(
            b.forward(step, 0, start, ones), a.forward(step, 0, start, ones), atol=1e-4, rtol=1e-4
        )
        start += 1


@needs_cc
def test_engine_with_kernels_matches_a_separate_forward_after_an_update():
    """Sampled log-probs through the native path match HF's forward, before and after a weight update (the
    update is packed into the spare weight set)."""
    old, new = make_model(320, seed=0), make_model(320, seed=1)
    engine = LocalEngine(old, max_slots=8, max_len=64, seed=5)
    assert engine.decoder.kernels is not None
    prompt = list(range(3, 12))
    for version, model in enumerate((old, new, old)):
        if version:
            engine.update_weights(WeightUpdate(version=version, state_dict=model.state_dict()))
        ((c,),) = engine.generate_batch([prompt], SamplingParams(max_new_tokens=12, temperature=1.0))
        assert torch.allclose(torch.tensor(c.logprobs), reference_logprobs(model, prompt, c.output_ids), atol=1e-4)


def test_without_a_compiler_the_engine_falls_back_to_torch(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("ASYNCRL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native, "compiler", lambda: None)
    with caplog.at_level(logging.WARNING):
        assert native.load() is None
    assert "no C compiler" in caplog.text
    engine = LocalEngine(make_model(320), max_slots=2, max_len=32)
    assert engine.decoder.kernels is None and not engine.decoder.packed
    ((c,),) = engine.generate_batch([[3, 4, 5]], SamplingParams(max_new_tokens=4, greedy=True))
    assert len(c.output_ids) == 4


def test_a_failed_build_is_reported_with_the_compiler_message(monkeypatch, tmp_path, caplog):
    fake_cc = tmp_path / "cc"
    fake_cc.write_text(
        "#!/bin/sh\n[ \"$1\" = --version ] && exit 0\necho 'kernels.c:1: error: no such luck' >&2\nexit 1\n"
    )
    fake_cc.chmod(0o755)
    monkeypatch.setenv("ASYNCRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(fake_cc))
    with caplog.at_level(logging.WARNING):
        assert native.load() is None
    assert "no such luck" in caplog.text
    assert not list((tmp_path / "cache").rglob("*.so"))  # nothing half-written left behind


def test_native_kernels_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("ASYNCRL_NATIVE", "0")
    assert native.load() is None
    assert LocalEngine(make_model(320), max_slots=2, max_len=32, native_kernels=True).decoder.kernels is None
