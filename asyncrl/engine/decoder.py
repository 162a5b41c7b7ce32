"""A Llama-family decoder forward pass (Llama, Qwen2, Qwen3, Mistral) over a pre-allocated KV cache.

The weights come from a Hugging Face model's state dict; the cache holds ``slots`` sequences of up to
``max_len`` tokens: ``k_cache, v_cache: (L, slots, kv_heads, max_len, head_dim)``. One function, ``forward``,
serves prefill, decode and re-prefill after a weight update: it appends a chunk of tokens to a contiguous
range of slots and returns the logits of each row's last token. Layout choices measured on CPU
(../shared/reference/env.md): fused qkv and gate/up projections, transposed contiguous weights, SDPA with
grouped-query attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")


@dataclass(frozen=True)
class DecoderShape:
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
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
            rms_eps=cfg.rms_norm_eps,
            qk_norm=model_type == "qwen3",
            tied=bool(getattr(cfg, "tie_word_embeddings", False)),
        )


class Decoder:
    """Engine-side weights and KV cache for one model; not thread-safe (the engine loop owns it)."""

    def __init__(self, hf_model, slots: int, max_len: int, dtype: torch.dtype = torch.float32):
        self.shape = s = DecoderShape.from_hf_config(hf_model.config)
        self.dtype, self.slots, self.max_len = dtype, slots, max_len
        rotary = hf_model.model.rotary_emb
        inv_freq = rotary.inv_freq.detach().float()
        pos = torch.arange(max_len, dtype=torch.float32)
        freqs = torch.outer(pos, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.cos = (emb.cos() * scale).to(dtype)  # (max_len, D)
        self.sin = (emb.sin() * scale).to(dtype)
        shape = (s.n_layers, slots, s.n_kv_heads, max_len, s.head_dim)
        self.k_cache = torch.zeros(shape, dtype=dtype)
        self.v_cache = torch.zeros(shape, dtype=dtype)
        self.w: dict[str, torch.Tensor] = {}
        self.load_state_dict(hf_model.state_dict())

    # ---- weights -------------------------------------------------------------------------------------
    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Copy HF-named weights into the fused engine layout (all or nothing: built first, then swapped)."""
        s, dt = self.shape, self.dtype

        def get(name: str) -> torch.Tensor:
            if name not in sd:
                raise KeyError(f"weight '{name}' missing from the update")
            return sd[name].detach().to(dt)

        def t(x: torch.Tensor) -> torch.Tensor:  # (out, in) -> (in, out), contiguous for x @ W
            return x.t().contiguous()

        w = {"embed": get("model.embed_tokens.weight").clone(), "norm": get("model.norm.weight").clone()}
        head = get("model.embed_tokens.weight") if s.tied and "lm_head.weight" not in sd else get("lm_head.weight")
        w["lm_head"] = t(head)
        for i in range(s.n_layers):
            p = f"model.layers.{i}."
            q, k, v = (get(p + f"self_attn.{n}_proj.weight") for n in "qkv")
            w[f"{i}.wqkv"] = t(torch.cat([q, k, v]))
            if p + "self_attn.q_proj.bias" in sd:
                w[f"{i}.bqkv"] = torch.cat([get(p + f"self_attn.{n}_proj.bias") for n in "qkv"])
            w[f"{i}.wo"] = t(get(p + "self_attn.o_proj.weight"))
            w[f"{i}.wgu"] = t(torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")]))
            w[f"{i}.wd"] = t(get(p + "mlp.down_proj.weight"))
            w[f"{i}.ln1"] = get(p + "input_layernorm.weight").clone()
            w[f"{i}.ln2"] = get(p + "post_attention_layernorm.weight").clone()
            if s.qk_norm:
                w[f"{i}.qn"] = get(p + "self_attn.q_norm.weight").clone()
                w[f"{i}.kn"] = get(p + "self_attn.k_norm.weight").clone()
        if w["embed"].shape != (s.vocab, s.hidden):
            raise ValueError(f"embedding shape {tuple(w['embed'].shape)} does not match the model config")
        self.w = w

    # ---- cache ---------------------------------------------------------------------------------------
    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` cached positions of slot ``src`` into slot ``dst``."""
        self.k_cache[:, dst, :, :length] = self.k_cache[:, src, :, :length]
        self.v_cache[:, dst, :, :length] = self.v_cache[:, src, :, :length]

    # ---- forward -------------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, first_slot: int, start: torch.Tensor, lengths: torch.Tensor):
        """Append ``tokens`` (S, C), right-padded to ``lengths`` (S,), to slots ``first_slot .. + S`` whose
        caches already hold ``start`` (S,) positions. Returns the logits (S, V) of each row's last token."""
        s, w = self.shape, self.w
        S, C = tokens.shape
        pos = start[:, None] + torch.arange(C)[None, :]  # (S, C)
        valid = torch.arange(C)[None, :] < lengths[:, None]  # (S, C)
        pos_c = pos.clamp(max=self.max_len - 1)
        t_used = int((start + lengths).max())
        cos, sin = self.cos[pos_c][:, None], self.sin[pos_c][:, None]  # (S, 1, C, D)
        key_pos = torch.arange(t_used)
        mask = (key_pos[None, None, :] <= pos[:, :, None])[:, None]  # (S, 1, C, T)
        rows = torch.arange(S)[:, None].expand(S, C)[valid] + first_slot  # where valid k/v go
        cols = pos[valid]
        sl = slice(first_slot, first_slot + S)
        x = w["embed"][tokens]  # (S, C, H)
        nq, nk, hd = s.n_heads, s.n_kv_heads, s.head_dim
        for i in range(s.n_layers):
            h = _rms(x, w[f"{i}.ln1"], s.rms_eps)
            qkv = h @ w[f"{i}.wqkv"]
            if f"{i}.bqkv" in w:
                qkv = qkv + w[f"{i}.bqkv"]
            q, k, v = qkv.split([nq * hd, nk * hd, nk * hd], dim=-1)
            q = q.view(S, C, nq, hd).transpose(1, 2)  # (S, nq, C, D)
            k = k.view(S, C, nk, hd).transpose(1, 2)
            v = v.view(S, C, nk, hd).transpose(1, 2)
            if s.qk_norm:
                q, k = _rms(q, w[f"{i}.qn"], s.rms_eps), _rms(k, w[f"{i}.kn"], s.rms_eps)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            kc, vc = self.k_cache[i], self.v_cache[i]
            kc[rows, :, cols] = k.transpose(1, 2)[valid]
            vc[rows, :, cols] = v.transpose(1, 2)[valid]
            att = F.scaled_dot_product_attention(
                q, kc[sl, :, :t_used], vc[sl, :, :t_used], attn_mask=mask, enable_gqa=nq != nk
            )
            x = x + att.transpose(1, 2).reshape(S, C, nq * hd) @ w[f"{i}.wo"]
            h = _rms(x, w[f"{i}.ln2"], s.rms_eps)
            gate, up = (h @ w[f"{i}.wgu"]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ w[f"{i}.wd"]
        last = x[torch.arange(S), (lengths - 1).clamp(min=0)]  # (S, H)
        return (_rms(last, w["norm"], s.rms_eps) @ w["lm_head"]).float()


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
