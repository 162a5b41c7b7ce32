"""Weight-sync latency of each transport, for the tiny model and a ~100M-parameter model.

    python bench/weight_sync.py --model builtin:tiny-sft            # all transports, both models
    python bench/weight_sync.py --model /tmp/tiny-init --skip-vllm

Each figure is the median wall time of ``publisher.publish(state_dict, version)`` over ``--repeats`` versions,
i.e. from the trainer's call until every engine serves the new version:

- inprocess -> LocalEngine (its loop thread running; idle, and with 16 sequences decoding);
- disk      -> LocalEngine, -> ``asyncrl serve`` (re-prefill in place), -> vLLM-CPU (pause, reload, resume);
- dist      -> ``asyncrl serve`` (gloo broadcast, 64 MiB buckets).

Servers run on 127.0.0.1 with one thread each; the 100M model is a Qwen2 (hidden 768, 8 layers, vocab 32,000,
untied) built once into ``--cache-dir``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


def model_100m(like: str, out: Path) -> str:
    """A ~100M-parameter Qwen2 with the tokenizer of ``like`` (the vocabulary rows beyond it are unused)."""
    if (out / "config.json").exists():
        return str(out)
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(like)
    cfg = Qwen2Config(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=12,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def _median_ms(publish, state_dicts, repeats: int, first_version: int = 1) -> float:
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        publish(state_dicts[i % 2], first_version + i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def bench_model(path: str, args) -> dict[str, float]:
    import torch

    from asyncrl.engine.local import LocalEngine
    from asyncrl.engine.remote import RemoteEngine
    from asyncrl.engine.requests import NO_STOP_TOKENS
    from asyncrl.engine.spawn import asyncrl_server, vllm_server
    from asyncrl.models.hf import load_model
    from asyncrl.types import SamplingParams
    from asyncrl.weights.publish import DiskPublisher, DistPublisher, InProcessPublisher

    torch.set_num_threads(1)
    model = load_model(path)
    other = {k: v + 0.01 for k, v in model.state_dict().items()}
    sds = [other, model.state_dict()]
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{path}: {n_params / 1e6:.1f}M parameters, {n_params * 4 / 2**20:.0f} MiB in float32", flush=True)
    out: dict[str, float] = {}
    tmp = Path(tempfile.mkdtemp(prefix="asyncrl-bench-"))
    try:
        engine = LocalEngine(model, max_slots=16, max_len=256).start()
        out["inprocess -> LocalEngine (idle)"] = _median_ms(InProcessPublisher([engine]).publish, sds, args.repeats)
        disk = DiskPublisher([engine], str(tmp / "local"))
        out["disk -> LocalEngine (idle)"] = _median_ms(disk.publish, sds, args.repeats, 100)
        disk.close()
        for i in range(16):
            engine.submit([5 + i, 6, 7, 8], SamplingParams(max_new_tokens=240, stop_token_ids=NO_STOP_TOKENS))
        while engine.stats().generated_tokens < 16 * 8:  # all 16 decoding
            time.sleep(0.01)
        out["inprocess -> LocalEngine (16 decoding)"] = _median_ms(
            InProcessPublisher([engine]).publish, sds, args.repeats, 200
        )
        engine.stop()

        server = asyncrl_server(path, "--threads", "1", "--max-len", "256", log_path=str(tmp / "server.log"))
        try:
            remote = RemoteEngine([server.url], interrupt_mode="recompute").start()
            disk = DiskPublisher([remote], str(tmp / "served"))
            out["disk -> asyncrl serve"] = _median_ms(disk.publish, sds, args.repeats)
            dist = DistPublisher([remote], backend="gloo", bucket_mb=64, timeout_s=120)
            dist.publish(sds[0], 50)  # the first publish also forms the process group
            out["dist (gloo) -> asyncrl serve"] = _median_ms(dist.publish, sds, args.repeats, 51)
            dist.close()
            disk.close()
            remote.stop()
        finally:
            server.close()

        if VLLM_PYTHON.exists() and not args.skip_vllm:
            server = vllm_server(str(VLLM_PYTHON), path, log_path=str(tmp / "vllm.log"))
            try:
                remote = RemoteEngine([server.url], api="vllm", interrupt_mode="abort").start()
                disk = DiskPublisher([remote], str(tmp / "vllm"))
                out["disk -> vLLM-CPU (pause, reload, resume)"] = _median_ms(disk.publish, sds, args.repeats)
                disk.close()
                remote.stop()
            finally:
                server.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="builtin:tiny-sft")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--skip-100m", action="store_true")
    p.add_argument("--skip-vllm", action="store_true")
    p.add_argument("--cache-dir", default=str(REPO / "outputs" / "bench"))
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from asyncrl.models.hf import resolve_model_path

    tiny = resolve_model_path(args.model)
    models = [("tiny", tiny)]
    if not args.skip_100m:
        models.append(("~100M", model_100m(tiny, Path(args.cache_dir) / "qwen2-100m")))
    results = {name: bench_model(path, args) for name, path in models}
    names = [n for n, _ in models]
    rows = list(dict.fromkeys(k for r in results.values() for k in r))
    print("\n| transport | " + " | ".join(f"{n} ms" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for row in rows:
        print(f"| {row} | " + " | ".join(f"{results[n].get(row, float('nan')):.1f}" for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
