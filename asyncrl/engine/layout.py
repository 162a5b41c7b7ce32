"""The engine's weight layout: a Hugging Face Llama-family state dict converted into the tensors the decoder's
forward pass reads (``Weights``): q, k and v fused into one projection and gate and up into another, every
matrix transposed to (in, out), the rotary dimensions of each q/k head reordered into adjacent pairs (one complex
number each), optionally packed into 16-column panels for the native kernels. The conversion runs off the engine
loop, into a fresh set or over a set no longer served (``reuse``), and the result is swapped in whole."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.engine import native

SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")
PANEL = native.PANEL


@dataclass(frozen=True)
class DecoderShape:
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int
    rms_eps: float
    qk_norm: bool
    tied: bool

    @classmethod
    def from_hf_config(cls, cfg) -> "DecoderShape":
        model_type = getattr(cfg, "model_type", "?")
        if model_type not in SUPPORTED:
            raise ValueError(
                f"the built-in engine supports model types {SUPPORTED}, not '{model_type}'; "
                "serve this model with vLLM or SGLang and use the remote engine"
            )
        if getattr(cfg, "use_sliding_window", False):
            raise ValueError("the built-in engine does not implement sliding-window attention")
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cls(
            n_layers=cfg.num_hidden_layers,
            hidden=cfg.hidden_size,
            n_heads=cfg.num_attention_heads,
            n_kv_heads=cfg.num_key_value_heads or cfg.num_attention_heads,
            head_dim=head_dim,
            vocab=cfg.vocab_size,
            intermediate=cfg.intermediate_size,
            rms_eps=cfg.rms_norm_eps,
            qk_norm=model_type == "qwen3",
            tied=bool(getattr(cfg, "tie_word_embeddings", False)),
        )


@dataclass
class LayerWeights:
    wqkv: torch.Tensor  # (H, (nq + 2 nk) D); q and k columns in rotary-pair order
    bqkv: torch.Tensor | None
    wo: torch.Tensor  # (nq D, H)
    wgu: torch.Tensor  # (H, 2 I)
    wd: torch.Tensor  # (I, H)
    ln1: torch.Tensor
    ln2: torch.Tensor
    qn: torch.Tensor | None = None  # Qwen3 per-head q/k RMSNorm, in rotary-pair order
    kn: torch.Tensor | None = None


@dataclass
class Weights:
    """The engine layout of one model version; built off the engine loop, then swapped in whole."""

    embed: torch.Tensor  # (V, H)
    norm: torch.Tensor
    lm_head: torch.Tensor  # (H, V)
    layers: list[LayerWeights]


def pair_order(head_dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """HF rotates dimension i with i + D/2; listing them as (0, D/2, 1, D/2 + 1, ...) makes each rotated pair
    two adjacent numbers, i.e. one complex number."""
    half = head_dim // 2
    ar = torch.arange(half, device=device)
    return torch.stack([ar, ar + half], dim=1).reshape(-1)


def prepare_weights(
    sd: dict[str, torch.Tensor],
    shape: DecoderShape,
    dtype: torch.dtype,
    reuse: Weights | None = None,
    packed: bool = False,
    device: torch.device | str = "cpu",
) -> Weights:
    """Convert HF-named tensors into the engine layout; ``sd`` is not kept. With ``reuse`` (a weight set no
    longer served) its tensors are overwritten instead of allocating: writing into memory that is already
    mapped is several times faster than a fresh allocation of a large model. Raises KeyError naming the first
    missing weight and ValueError naming the first non-finite one or on a shape mismatch, before anything is
    swapped (every path that installs weights comes through here: the checkpoint at start, disk, broadcast,
    in-process).

    A weight matrix (out, in) is stored transposed, (in, out) for ``x @ W``, or with ``packed`` in panels of 16
    output columns, (ceil(out / 16), in, 16), for the native GEMM (kernels.c).

    The result lives on ``device``; each tensor of ``sd`` is copied there from its own device (device to
    device when they are the same: nothing goes through host memory). The finiteness of tensors on an
    accelerator is checked with one read of all their flags at the end instead of one wait per tensor (nothing
    is swapped in before this function returns, so the refusal comes in time all the same)."""
    device = torch.device(device)
    unchecked: list[tuple[str, torch.Tensor]] = []  # (name, all-finite flag on its device), read at the end

    def get(name: str) -> torch.Tensor:
        if name not in sd:
            raise KeyError(f"weight '{name}' missing from the update")
        t = sd[name].detach()
        if t.is_floating_point():
            if t.device.type != "cpu":
                unchecked.append((name, torch.isfinite(t).all()))
            elif not bool(torch.isfinite(t).all()):
                # a NaN or inf weight makes every later token garbage (or fails sampling): refuse it whole
                raise ValueError(f"weight '{name}' has non-finite values (NaN or inf)")
        return t

    s = shape
    orders: dict[torch.device, torch.Tensor] = {}

    def order_on(x: torch.Tensor) -> torch.Tensor:  # the pair order as an index on ``x``'s device
        if x.device not in orders:
            orders[x.device] = pair_order(s.head_dim, x.device)
        return orders[x.device]

    def pairs(x: torch.Tensor) -> torch.Tensor:  # rows of a q/k projection (or its bias) in pair order
        return x.reshape(-1, s.head_dim, *x.shape[1:])[:, order_on(x)].reshape(x.shape)

    def pairs_1d(x: torch.Tensor) -> torch.Tensor:  # a per-head vector (Qwen3's q/k norm) in pair order
        return x[order_on(x)]

    embed_src = get("model.embed_tokens.weight")
    if tuple(embed_src.shape) != (s.vocab, s.hidden):
        raise ValueError(
            f"embedding shape {tuple(embed_src.shape)} does not match the model config ({s.vocab}, {s.hidden})"
        )
    head_src = embed_src if s.tied and "lm_head.weight" not in sd else get("lm_head.weight")
    old_layers = reuse.layers if reuse is not None else []

    def put(old: torch.Tensor | None, parts: list[torch.Tensor], matrix: bool = False) -> torch.Tensor:
        """``cat(parts)`` in ``dtype`` (a matrix in its ``x @ W`` layout), written into ``old`` if it fits."""
        rows = sum(p.shape[0] for p in parts)
        if not matrix:
            out_shape = (rows, *parts[0].shape[1:])
        else:
            out_shape = (-(-rows // PANEL), parts[0].shape[1], PANEL) if packed else (parts[0].shape[1], rows)
        if old is not None and tuple(old.shape) == out_shape:
            dst = old
        elif matrix and packed:  # zeros: the padding columns of a packed matrix's last panel stay 0
            dst = torch.zeros(out_shape, dtype=dtype, device=device)
        else:
            dst = torch.empty(out_shape, dtype=dtype, device=device)
        # blocks of rows: on the CPU a transposed copy ~1.5x faster; on an accelerator one copy kernel per part
        block = 256 if device.type == "cpu" else None
        at = 0
        for p in parts:
            n = p.shape[0]
            if not matrix:
                dst[at : at + n].copy_(p)
            elif packed:
                _put_panels(dst.transpose(1, 2), p, at)
            else:
                step = block or n
                for b in range(0, n, step):
                    dst[:, at + b : at + min(b + step, n)].copy_(p[b : b + step].t())
            at += n
        return dst

    layers = []
    for i in range(s.n_layers):
        p = f"model.layers.{i}."
        old = old_layers[i] if i < len(old_layers) else None
        q, k, v = (get(p + f"self_attn.{n}_proj.weight") for n in "qkv")
        bias = None
        if p + "self_attn.q_proj.bias" in sd:
            qb, kb, vb = (get(p + f"self_attn.{n}_proj.bias") for n in "qkv")
            bias = put(old and old.bqkv, [pairs(qb), pairs(kb), vb])
        layers.append(
            LayerWeights(
                wqkv=put(old and old.wqkv, [pairs(q), pairs(k), v], matrix=True),
                bqkv=bias,
                wo=put(old and old.wo, [get(p + "self_attn.o_proj.weight")], matrix=True),
                wgu=put(old and old.wgu, [get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")], matrix=True),
                wd=put(old and old.wd, [get(p + "mlp.down_proj.weight")], matrix=True),
                ln1=put(old and old.ln1, [get(p + "input_layernorm.weight")]),
                ln2=put(old and old.ln2, [get(p + "post_attention_layernorm.weight")]),
                qn=put(old and old.qn, [pairs_1d(get(p + "self_attn.q_norm.weight"))]) if s.qk_norm else None,
                kn=put(old and old.kn, [pairs_1d(get(p + "self_attn.k_norm.weight"))]) if s.qk_norm else None,
            )
        )
    weights = Weights(
        embed=put(reuse and reuse.embed, [embed_src]),
        norm=put(reuse and reuse.norm, [get("model.norm.weight")]),
        lm_head=put(reuse and reuse.lm_head, [head_src], matrix=True),
        layers=layers,
    )
    bad: set[str] = set()
    for dev in {flag.device for _, flag in unchecked}:  # one read of the flags of each source device
        names = [name for name, flag in unchecked if flag.device == dev]
        finite = torch.stack([flag for _, flag in unchecked if flag.device == dev]).tolist()
        bad.update(name for name, ok in zip(names, finite) if not ok)
    for name, _ in unchecked:  # the first in the order of the checks above
        if name in bad:
            raise ValueError(f"weight '{name}' has non-finite values (NaN or inf)")
    return weights


def _put_panels(panels: torch.Tensor, part: torch.Tensor, at: int) -> None:
    """Write the rows of ``part`` (n, in) as output columns ``at .. at + n`` of a packed matrix, given as its
    (panels, 16, in) view: column c is ``panels[c // 16, c % 16]``. Whole panels in one copy."""
    r, n = 0, part.shape[0]
    while r < n:
        panel, j = divmod(at + r, PANEL)
        if j == 0 and n - r >= PANEL:
            k = (n - r) // PANEL
            panels[panel : panel + k].copy_(part[r : r + k * PANEL].reshape(k, PANEL, -1))
            r += k * PANEL
        else:
            m = min(PANEL - j, n - r)
            panels[panel, j : j + m].copy_(part[r : r + m])
            r += m
