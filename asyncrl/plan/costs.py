"""What each piece of an RL step costs, as a small linear model the simulation reads (``Costs``), written down
as a hardware profile a user can keep and edit (YAML; ``load_profile``, ``save_profile``).

A profile comes from one of three places:
- measured on this machine for the configured model (``asyncrl plan --profile``: ``asyncrl.plan.calibrate``);
- fitted from a run directory's metrics (``--from-run DIR``);
- computed from specifications only (``spec_costs``): a GPU's peak FLOP/s and memory bandwidth, the
  interconnect, the model's shape, and one efficiency factor per phase. ``GPUS`` holds the published
  specifications of H100, H800, H200 and A100 (SXM, dense BF16); every assumption is named beside its number.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Costs:
    """Seconds per piece of work, for one engine and one trainer (the simulation scales by their number).

    decode step (every running sequence gets one token): ``decode_base_s + decode_per_seq_s * running +
    decode_per_ctx_s * (context tokens of all running sequences)``; prefill of ``t`` prompt tokens:
    ``prefill_base_s + prefill_per_token_s * t`` (re-prefill after new weights costs the same per token);
    a training step on ``t`` positions computed (prompt + response; a prefix shared by several samples, computed
    once under ``actor.shared_prefix``, counts once): ``train_base_s + train_per_token_s * t`` per pass over the
    batch (``actor.ppo_epochs`` passes), with ``recompute_per_token_s * t`` more for each forward pass without a
    gradient, once a step (the proximal policy's recompute, the reference model, the critic's values); publishing
    weights ``sync_s``
    (the engines are paused for ``pause_s`` of it); an evaluation ``eval_s``, a checkpoint ``save_s``; one
    reward call ``reward_s``. Where the trainer and the engine share the CPU's cores (``cluster.cpu_split=auto``)
    the costs above are at each side's share (``asyncrl.cluster.cores``), and the trainer runs ``train_borrow_x`` times
    as fast while it borrows the idle engine's core (1: no gain, or not measured). Where the two run side by side on
    one machine they share its memory bandwidth: decode steps take ``decode_overlap_x`` times as long while the
    trainer works, training ``train_overlap_x`` times as long while an engine decodes (1: separate devices, or
    not measured)."""

    decode_base_s: float = 0.0
    decode_per_seq_s: float = 0.0
    decode_per_ctx_s: float = 0.0
    prefill_base_s: float = 0.0
    prefill_per_token_s: float = 0.0
    train_base_s: float = 0.0
    train_per_token_s: float = 0.0
    recompute_per_token_s: float = 0.0
    sync_s: float = 0.0
    pause_s: float = 0.0
    eval_s: float = 0.0
    save_s: float = 0.0
    reward_s: float = 0.0
    train_borrow_x: float = 1.0
    decode_overlap_x: float = 1.0
    train_overlap_x: float = 1.0

    def decode_steps_s(self, steps: int, running: int, context: int) -> float:
        """``steps`` decode steps of ``running`` sequences whose contexts total ``context`` tokens at the first
        (each step adds one token to every sequence)."""
        per_step = self.decode_base_s + self.decode_per_seq_s * running + self.decode_per_ctx_s * context
        return steps * per_step + self.decode_per_ctx_s * running * steps * (steps - 1) / 2

    def prefill_s(self, tokens: int) -> float:
        return self.prefill_base_s + self.prefill_per_token_s * tokens if tokens else 0.0

    def train_s(self, tokens: int, recompute: int = 0, epochs: int = 1) -> float:
        """``recompute``: the forward passes without a gradient a step makes (a bool: the proximal one or none)."""
        recomputed = self.recompute_per_token_s * tokens * int(recompute)
        return self.train_base_s + self.train_per_token_s * tokens * epochs + recomputed


@dataclass
class Profile:
    """A hardware profile: the costs, and what they were measured on or derived from (kept for the reader)."""

    name: str
    costs: Costs
    source: str = ""  # "measured on ...", "fitted from RUN_DIR", "spec: H800 x 128, ..."
    notes: list[str] = field(default_factory=list)  # every assumption, beside its number


def save_profile(profile: Profile, path: str | Path) -> Path:
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "name": profile.name,
        "source": profile.source,
        "notes": list(profile.notes),
        "costs": dataclasses.asdict(profile.costs),
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def load_profile(path: str | Path) -> Profile:
    """A profile written by ``save_profile`` (or by hand); ValueError naming the file and the key that is wrong."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"hardware profile {path}: cannot read it ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("costs"), dict):
        raise ValueError(f"hardware profile {path}: needs a 'costs' mapping")
    known = {f.name for f in dataclasses.fields(Costs)}
    unknown = sorted(set(data["costs"]) - known)
    if unknown:
        raise ValueError(f"hardware profile {path}: unknown cost keys {unknown} (known: {sorted(known)})")
    costs = {}
    for k, v in data["costs"].items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"hardware profile {path}: costs.{k} must be a number >= 0, got {v!r}")
        costs[k] = float(v)
    return Profile(
        str(data.get("name", path.stem)),
        Costs(**costs),
        str(data.get("source", "")),
        [str(n) for n in data.get("notes") or []],
    )


# ---- from specifications (GPU clusters) ------------------------------------------------------------------
@dataclass(frozen=True)
class GPU:
    name: str
    peak_flops: float  # dense BF16/FP16 tensor FLOP/s (no sparsity)
    memory_bandwidth: float  # bytes/s of HBM
    memory_bytes: float
    interconnect: float  # bytes/s between nodes per GPU (InfiniBand/RoCE NIC)
    nvlink: float  # bytes/s between the GPUs of a node (per direction)


GPUS = {
    # published specifications, SXM parts, dense BF16 (the datasheets' "with sparsity" figures halved)
    "h100": GPU("H100 SXM", 989e12, 3.35e12, 80e9, 50e9, 450e9),  # 400 Gb/s NIC per GPU; NVLink 4: 900 GB/s bidir.
    "h800": GPU("H800 SXM", 989e12, 3.35e12, 80e9, 50e9, 200e9),  # as H100, NVLink cut to 400 GB/s bidirectional
    "h200": GPU("H200 SXM", 989e12, 4.8e12, 141e9, 50e9, 450e9),  # H100's compute, HBM3e 4.8 TB/s
    "a100": GPU("A100 SXM 80GB", 312e12, 2.039e12, 80e9, 25e9, 300e9),  # 200 Gb/s NIC per GPU; NVLink 3: 600 GB/s
}


@dataclass(frozen=True)
class ModelShape:
    params: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # keys and values, 2 bytes each (BF16)


MODELS = {  # R1-Distill-Qwen = Qwen2.5 shapes (config.json of each)
    "r1-distill-qwen-1.5b": ModelShape(1.78e9, 28, 1536, 2, 128),
    "r1-distill-qwen-7b": ModelShape(7.62e9, 28, 3584, 4, 128),
    "r1-distill-qwen-14b": ModelShape(14.8e9, 48, 5120, 8, 128),
    "r1-distill-qwen-32b": ModelShape(32.8e9, 64, 5120, 8, 128),
}


@dataclass(frozen=True)
class Efficiency:
    """The share of the peak each phase reaches: the one knob a user (or the validation) fits."""

    train_mfu: float = 0.35  # training: model FLOPs utilisation of 6·params FLOPs per token (Megatron, long seqs)
    prefill_mfu: float = 0.5  # prefill: 2·params FLOPs per token, compute-bound
    decode_bandwidth: float = 0.6  # decode: share of HBM bandwidth reading weights + KV cache each step
    decode_step_overhead_s: float = 0.004  # per decode step: scheduling, sampling, launches (CUDA graphs on)
    interconnect: float = 0.7  # share of NIC bandwidth a weight broadcast reaches


def spec_costs(
    gpu: GPU,
    model: ModelShape,
    *,
    engine_gpus: int,
    train_gpus: int,
    eff: Efficiency = Efficiency(),
    reload_s: float = 2.0,
) -> Profile:
    """Costs from specifications: one engine of ``engine_gpus`` (tensor parallel) and a trainer of ``train_gpus``
    (data parallel, ZeRO/FSDP). Every number it assumes is in the profile's notes."""
    weight_bytes = 2 * model.params  # BF16
    per_gpu_bw = gpu.memory_bandwidth * eff.decode_bandwidth * engine_gpus
    decode_base = weight_bytes / per_gpu_bw + eff.decode_step_overhead_s
    decode_per_ctx = model.kv_bytes_per_token / per_gpu_bw
    decode_per_seq = 2 * model.params / (gpu.peak_flops * engine_gpus * eff.prefill_mfu)  # the matmuls' FLOPs
    prefill_per_token = 2 * model.params / (gpu.peak_flops * engine_gpus * eff.prefill_mfu)
    train_per_token = 6 * model.params / (gpu.peak_flops * train_gpus * eff.train_mfu)
    recompute_per_token = 2 * model.params / (gpu.peak_flops * train_gpus * eff.train_mfu)
    sync = weight_bytes / (gpu.interconnect * eff.interconnect) + reload_s
    notes = [
        f"{gpu.name}: {gpu.peak_flops / 1e12:.0f} TFLOP/s dense BF16, {gpu.memory_bandwidth / 1e12:.2f} TB/s HBM, "
        f"{gpu.interconnect / 1e9:.0f} GB/s NIC per GPU",
        f"model: {model.params / 1e9:.2f}B parameters, {model.layers} layers, {model.kv_heads} KV heads x "
        f"{model.head_dim}: {model.kv_bytes_per_token / 1e3:.1f} kB of KV cache per token (BF16)",
        f"engine: {engine_gpus} GPU(s), tensor parallel; decode reads every weight and the whole KV cache each "
        f"step at {eff.decode_bandwidth:.0%} of HBM bandwidth, plus {eff.decode_step_overhead_s * 1e3:.1f} ms a step",
        f"prefill and the per-sequence decode FLOPs at {eff.prefill_mfu:.0%} of peak",
        f"trainer: {train_gpus} GPU(s) at {eff.train_mfu:.0%} MFU (6 FLOPs per parameter per token; +2 to "
        "recompute the proximal policy)",
        f"weight sync: BF16 weights over the NIC at {eff.interconnect:.0%} + {reload_s:.1f} s for the engines to "
        "load them",
    ]
    costs = Costs(
        decode_base_s=decode_base,
        decode_per_seq_s=decode_per_seq,
        decode_per_ctx_s=decode_per_ctx,
        prefill_per_token_s=prefill_per_token,
        train_per_token_s=train_per_token,
        recompute_per_token_s=recompute_per_token,
        sync_s=sync,
        pause_s=sync,
    )
    return Profile(
        f"{gpu.name} ({engine_gpus}-GPU engines, {train_gpus} training GPUs)", costs, f"spec: {gpu.name}", notes
    )
