"""A Llama-family decoder forward pass (Llama, Qwen2, Qwen3, Mistral) over a pre-allocated KV cache.

The weights come from a Hugging Face model's state dict; the cache holds ``slots`` sequences of up to
``max_len`` tokens: ``kv_cache: (L, 2, slots, kv_heads, max_len + 1, head_dim)`` (keys, then values;
position ``max_len`` is a scratch column that padding writes into). One function, ``forward``, serves prefill,
decode and re-prefill after a weight update: it appends a chunk of tokens to a contiguous range of slots and
returns the logits of each row's last token.

The weights are in the engine's layout (:mod:`asyncrl.engine.layout`: fused projections, transposed weights,
rotary pairs made adjacent); the cache is read in place, and position-only work is done once per forward
(docs/engine.md explains the choices, with their measurements).
``Decoder(..., device=)`` (default the CPU) puts the weights, the KV cache and every buffer there; a step on a
GPU queues its kernels without waiting for them (the caller's read of the sampled tokens is its one
synchronisation). The native kernels (kernels.c) are CPU code: on another device the torch path runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from asyncrl.engine import native
from asyncrl.engine.layout import DecoderShape, LayerWeights, Weights, prepare_weights

NATIVE_FLAGS = {torch.bfloat16: ("avx512_bf16", "amx_bf16"), torch.float16: ("avx512_fp16", "amx_fp16")}
log = logging.getLogger(__name__)


def emulated_dtype(dtype: torch.dtype, cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU lacks native arithmetic for the half-precision ``dtype`` (no AVX512-BF16/FP16 or AMX), so
    that PyTorch emulates it, many times slower than float32 (docs/engine.md). False for float32 and where the CPU
    flags cannot be read."""
    if dtype not in NATIVE_FLAGS:
        return False
    try:
        flags = set(Path(cpuinfo).read_text().split())
    except OSError:
        return False
    return not flags.intersection(NATIVE_FLAGS[dtype])


@dataclass
class _Plan:
    """Everything one forward needs that depends only on positions, shared by every layer."""

    rot: torch.Tensor  # (S, C, nq + nk, D/2) complex: rotation of each q/k pair (q's with the score scale)
    write: torch.Tensor  # (S * 2nk * C,) flat cache rows for the new keys and values
    mask: torch.Tensor  # (S, 1, 1, C, T) additive: 0 = attend, -inf = masked
    slots: slice
    t_used: int


def resolve_device(device: torch.device | str | None) -> torch.device:
    """``device`` as a ``torch.device`` (default the CPU); ``cuda`` without an index is the current CUDA device,
    so that comparisons with the devices of tensors hold."""
    dev = torch.device("cpu" if device is None else device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


class Decoder:
    """Engine-side weights and KV cache for one model, on one device (default the CPU); not thread-safe (the
    engine loop owns it)."""

    def __init__(
        self,
        hf_model,
        slots: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        native_kernels: bool = True,
        device: torch.device | str | None = None,
    ):
        self.shape = s = DecoderShape.from_hf_config(hf_model.config)
        if s.head_dim % 2:
            raise ValueError(f"rotary embedding needs an even head_dim, got {s.head_dim}")
        self.dtype, self.slots, self.max_len = dtype, slots, max_len
        self.device = dev = resolve_device(device)
        self.on_cpu = dev.type == "cpu"
        if self.on_cpu and emulated_dtype(dtype):
            log.warning(
                "dtype %s has no native support on this CPU (%s, no AVX512/AMX half precision): its "
                "matmuls are emulated and generation is many times slower than in float32; use "
                "dtype float32 here",
                str(dtype).replace("torch.", ""),
                torch.backends.cpu.get_cpu_capability(),
            )
        rotary = hf_model.model.rotary_emb
        # the table is computed on the host in float32 (the same numbers on every device), then moved
        cpu = torch.device("cpu")
        inv_freq = rotary.inv_freq.detach().float().to(cpu)
        angles = torch.outer(torch.arange(max_len + 1, dtype=torch.float32, device=cpu), inv_freq)
        scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.rotation = torch.polar(torch.full_like(angles, scale), angles).to(dev)  # (max_len + 1, D/2) complex64
        # q's rotation also applies the 1/sqrt(D) score scale; k's does not (cached keys stay unscaled)
        self.head_scale = torch.tensor([s.head_dim**-0.5] * s.n_heads + [1.0] * s.n_kv_heads, device=dev)
        self.cache_len = max_len + 1  # position max_len is scratch for padding
        # keys, then values: (L, 2, slots, kv_heads, cache_len, D). The K (or V) block of a range of slots then
        # merges its slot and head dims without a copy, so attention reads the cache in place
        self.kv_cache = torch.zeros(
            (s.n_layers, 2, slots, s.n_kv_heads, self.cache_len, s.head_dim), dtype=dtype, device=dev
        )
        # float32 on the CPU: the matrix products run in native kernels on packed weights, and decode steps run
        # attention (with the rotary embedding and the cache write), RMSNorm and the SiLU gate in native kernels
        # too (native.py), when a C compiler is available. The kernels are CPU code: never on another device
        fits = s.head_dim % 8 == 0 and s.hidden % 8 == 0  # the kernels work in vectors of 8 floats
        use_native = native_kernels and fits and dtype == torch.float32 and self.on_cpu
        self.kernels = native.load() if use_native else None
        self.packed = self.kernels is not None
        if self.kernels is not None:
            self._rotation_f = torch.view_as_real(self.rotation).contiguous()  # (max_len + 1, D/2, 2)
            self._h = torch.empty(slots, s.hidden, device=dev)
            self._att = torch.empty(slots, s.n_heads * s.head_dim, device=dev)
            self._act = torch.empty(slots, s.intermediate, device=dev)
            self._scores = torch.empty(slots * s.n_heads, self.cache_len, device=dev)  # a decode step's weights
        self.w = prepare_weights(hf_model.state_dict(), s, dtype, packed=self.packed, device=dev)
        self._spare: Weights | None = None  # the weight set retired by the last install, reused by prepare
        # float32 logits of up to ``slots`` rows, reused by every forward: a fresh (S, V) tensor per token costs
        # page faults that, at a 152k vocabulary, take longer than the arithmetic on it
        self.logits = torch.empty(slots, s.vocab, dtype=torch.float32, device=dev)

    # ---- weights -------------------------------------------------------------------------------------
    def prepare(self, sd: dict[str, torch.Tensor]) -> Weights:
        """The engine layout of ``sd``, written into the weight set the last ``install`` retired (double
        buffering), so repeated updates do not allocate. Not thread-safe: one ``prepare`` at a time."""
        spare, self._spare = self._spare, None
        try:
            return prepare_weights(sd, self.shape, self.dtype, reuse=spare, packed=self.packed, device=self.device)
        except Exception:
            self._spare = None  # its tensors may be half-written: never reuse them as a complete set
            raise

    def install(self, weights: Weights) -> None:
        """Serve ``weights`` from the next forward on; the set it replaces becomes the next ``prepare``'s buffer."""
        self._spare, self.w = self.w, weights

    # ---- cache ---------------------------------------------------------------------------------------
    def copy_slot(self, src: int, dsts: range, length: int) -> None:
        """Copy the first ``length`` cached positions of slot ``src`` into the contiguous slots ``dsts`` (a
        group's prefill to its other samples; a running sequence into the hole a finished one left)."""
        if len(dsts):
            self.kv_cache[:, :, dsts.start : dsts.stop, :, :length] = self.kv_cache[:, :, src : src + 1, :, :length]

    # ---- forward -------------------------------------------------------------------------------------
    def _plan(self, first_slot: int, start: torch.Tensor, lengths: torch.Tensor, C: int, t_used: int) -> _Plan:
        """The plan for ``start``/``lengths`` on the decoder's device; ``t_used`` = max(start + lengths)."""
        S, nk, dev = start.shape[0], self.shape.n_kv_heads, self.device
        steps = torch.arange(C, device=dev)
        pos = start[:, None] + steps[None, :]  # (S, C)
        mask = torch.zeros(S, 1, 1, C, t_used, dtype=self.dtype, device=dev)
        mask.masked_fill_(
            (torch.arange(t_used, device=dev)[None, None, :] > pos[:, :, None])[:, None, None], float("-inf")
        )
        # padding rows write into the scratch column, so no write ever clobbers a cached position
        wpos = torch.where(steps[None, :] < lengths[:, None], pos, self.max_len)  # (S, C)
        # row of (kv, slot, head) in the flattened cache, for the 2 nk heads of each slot: keys, then values
        heads = torch.arange(2 * nk, device=dev)
        kv_idx, head = heads // nk, heads % nk
        slot = torch.arange(first_slot, first_slot + S, device=dev)[:, None]
        base = ((kv_idx * self.slots + slot) * nk + head) * self.cache_len  # (S, 2 nk)
        rot = self.rotation[wpos][:, :, None, :] * self.head_scale[:, None]  # (S, C, nq + nk, D/2)
        return _Plan(
            rot=rot,
            write=(base[:, :, None] + wpos[:, None, :]).reshape(-1),
            mask=mask,
            slots=slice(first_slot, first_slot + S),
            t_used=t_used,
        )

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, first_slot: int, start: torch.Tensor, lengths: torch.Tensor):
        """Append ``tokens`` (S, C), right-padded to ``lengths`` (S,), to slots ``first_slot .. + S`` whose
        caches already hold ``start`` (S,) positions. Returns the float32 logits (S, V) of each row's last token,
        on the decoder's device, in a buffer that the next ``forward`` overwrites.

        The three tensors may be on the host or on the decoder's device; on the host (the engine's case) the
        used cache length is read there and they travel to the device in one copy, so the call does not wait
        for the device."""
        S, C = tokens.shape
        if C == 1 and self.kernels is not None and int(lengths.min()) == 1:
            return self._decode_native(tokens, first_slot, start)
        t_used = int((start + lengths).max())  # on the host: no wait (a device tensor: one read)
        if not self.on_cpu:
            tokens, start, lengths = self._to_device(tokens, start, lengths)
        plan = self._plan(first_slot, start, lengths, C, t_used)
        w = self.w
        x = w.embed[tokens.reshape(-1)]  # (S C, H): the residual stream stays 2-D through the layers
        for i, layer in enumerate(w.layers):
            x = self._layer(x, layer, self.kv_cache[i], plan, S, C)
        x = x.view(S, C, -1)
        if C == 1:
            last = x[:, 0]
        else:
            last = x[torch.arange(S, device=x.device), (lengths - 1).clamp(min=0)]
        last = self._rms(last, w.norm)  # (S, H)
        logits = self.logits[:S]
        if w.lm_head.dtype == torch.float32:
            return self._linear(last, w.lm_head, self.shape.vocab, out=logits)
        return logits.copy_(last @ w.lm_head)

    def _to_device(self, tokens: torch.Tensor, start: torch.Tensor, lengths: torch.Tensor):
        """``tokens``, ``start`` and ``lengths`` on the decoder's device: host tensors in one asynchronous copy."""
        if tokens.device == start.device == lengths.device == self.device:
            return tokens, start, lengths
        S, C = tokens.shape
        host = torch.cat([tokens.reshape(-1).long().cpu(), start.long().cpu(), lengths.long().cpu()])
        both = host.to(self.device, non_blocking=True)
        return both[: S * C].view(S, C), both[S * C : S * C + S], both[S * C + S :]

    def _linear(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        n: int,
        bias: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x @ W`` (+ ``bias``), ``n`` output features, for a matrix in the layout ``prepare_weights`` stored;
        with ``residual``, ``residual + x @ W`` (packed: added into ``residual`` in place). ``out`` receives the
        result if given."""
        if self.packed:
            if residual is not None:
                return self.kernels.gemm(x, w, residual, accumulate=True)
            if out is None:
                out = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
            return self.kernels.gemm(x, w, out, bias)
        if residual is not None:
            return torch.addmm(residual, x, w)
        if bias is not None:
            return torch.addmm(bias, x, w, out=out)
        return torch.mm(x, w, out=out)

    def _decode_native(self, tokens: torch.Tensor, first_slot: int, start: torch.Tensor) -> torch.Tensor:
        """``forward`` for one new token per row through the native kernels: between the GEMMs of a layer, two
        RMSNorms, rotary + cache write + attention in one kernel, the SiLU gate in another; no position plan."""
        s, w, k = self.shape, self.w, self.kernels
        S, nq, nk, D = tokens.shape[0], s.n_heads, s.n_kv_heads, s.head_dim
        pos = start.to(torch.int64).contiguous()
        att, act, h, eps, H, I = self._att[:S], self._act[:S], self._h[:S], s.rms_eps, s.hidden, s.intermediate
        x = w.embed[tokens.reshape(-1)]  # (S, H), a fresh tensor: the residual adds go into it in place
        for i, lw in enumerate(w.layers):
            qkv = self._linear(k.rms_norm(x, lw.ln1, eps, h), lw.wqkv, (nq + 2 * nk) * D, lw.bqkv).view(S, -1, D)
            if lw.qn is not None:
                qkv[:, :nq] = self._rms(qkv[:, :nq], lw.qn)
                qkv[:, nq : nq + nk] = self._rms(qkv[:, nq : nq + nk], lw.kn)
            k.decode_attention(
                qkv, pos, self._rotation_f, self.kv_cache[i], att, self._scores, first_slot, nq, nk, D**-0.5
            )
            x = self._linear(att, lw.wo, H, residual=x)
            k.silu_mul(self._linear(k.rms_norm(x, lw.ln2, eps, h), lw.wgu, 2 * I), act)
            x = self._linear(act, lw.wd, H, residual=x)
        return self._linear(k.rms_norm(x, w.norm, eps, h), w.lm_head, s.vocab, out=self.logits[:S])

    def _layer(self, x: torch.Tensor, lw: LayerWeights, kv: torch.Tensor, plan: _Plan, S: int, C: int):
        """One decoder layer on the residual stream ``x`` (S C, H) (packed weights: updated in place)."""
        s = self.shape
        nq, nk, D = s.n_heads, s.n_kv_heads, s.head_dim
        qkv = self._linear(self._rms(x, lw.ln1), lw.wqkv, (nq + 2 * nk) * D, lw.bqkv).view(S, C, nq + 2 * nk, D)
        if lw.qn is not None:
            qkv[:, :, :nq] = self._rms(qkv[:, :, :nq], lw.qn)
            qkv[:, :, nq : nq + nk] = self._rms(qkv[:, :, nq : nq + nk], lw.kn)
        _rotate(qkv[:, :, : nq + nk], plan.rot)
        kv.view(-1, D).index_copy_(0, plan.write, qkv[:, :, nq:].transpose(1, 2).reshape(-1, D))
        k, v = kv[0, plan.slots, :, : plan.t_used], kv[1, plan.slots, :, : plan.t_used]  # (S, nk, T, D) views
        att = _attention(qkv[:, :, :nq], k, v, plan.mask)  # (S, C, nq D)
        x = self._linear(att.view(S * C, nq * D), lw.wo, s.hidden, residual=x)
        gate, up = self._linear(self._rms(x, lw.ln2), lw.wgu, 2 * s.intermediate).chunk(2, dim=-1)
        return self._linear(F.silu(gate) * up, lw.wd, s.hidden, residual=x)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, weight.shape, weight, self.shape.rms_eps)
        # HF's order for low precision: normalise in float32, cast, then scale
        return F.rms_norm(x.float(), weight.shape, None, self.shape.rms_eps).to(x.dtype) * weight


def _rotate(x: torch.Tensor, rot: torch.Tensor) -> None:
    """Rotary embedding, in place: ``x`` (S, C, heads, D) in pair order times ``rot`` (S, C, heads, D/2)."""
    if x.dtype == torch.float32:
        pairs = torch.view_as_complex(x.unflatten(-1, (-1, 2)))
        torch.mul(pairs, rot, out=pairs)
    else:  # no complex bfloat16: rotate in float32
        xf = x.float()
        pairs = torch.view_as_complex(xf.unflatten(-1, (-1, 2)))
        torch.mul(pairs, rot, out=pairs)
        x.copy_(xf)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention: q (S, C, nq, D) already scaled, k/v (S, nk, T, D), mask (S, 1, 1, C, T);
    returns (S, C, nq D).

    The ``nq / nk`` query heads of a group attend to their K/V head through one batched matmul, so K/V are
    read once and never repeated. Scores are ``q @ K^T`` with the softmax along the last (contiguous) axis:
    ~20% faster per decode step on this CPU than ``K @ q^T`` with the softmax along K's axis."""
    S, C, nq, D = q.shape
    nk, T = k.shape[1], k.shape[2]
    g = nq // nk
    qg = q.permute(0, 2, 1, 3).reshape(S, nk, g * C, D)  # (S, nk, g C, D): a view when C == 1
    scores = torch.matmul(qg, k.transpose(-1, -2)).view(S, nk, g, C, T)
    probs = scores.add_(mask).softmax(dim=-1).view(S, nk, g * C, T)
    out = torch.matmul(probs, v)  # (S, nk, g C, D)
    return out.view(S, nq, C, D).transpose(1, 2).reshape(S, C, nq * D)
