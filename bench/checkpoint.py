"""Checkpoint size, save time (foreground, and the trainer thread's time with ``saver.background``) and resume
(load) time, tiny and ~100M models, on this machine.

    python bench/checkpoint.py [--repeats 3]

A checkpoint here is what a run writes (asyncrl.loop.checkpoint.Checkpointer.save): the HF weights and tokenizer,
trainer.pt (AdamW state after one real step, so its moments exist, and the RNGs), run.json and rollouts.pt
(empty here), written to a temporary directory, fsynced, renamed, then ``latest``. Resume time is what a
resumed run spends on it: loading the weights (``load_model``) and restoring the training state. Background:
``save(..., background=True)`` returns after copying the state (what the trainer thread pays), and the writer
thread's time to a complete checkpoint is shown beside it. Timed in the system temp directory (and /dev/shm
for comparison when present).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu  # bench/ is on the path of a script run from it

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def size_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def bench(model_path: str, where: Path, repeats: int) -> dict:
    import torch

    from asyncrl.config import ActorConfig
    from asyncrl.loop.checkpoint import Checkpointer, RunState, restore_training_state
    from asyncrl.models.hf import load_model, load_tokenizer
    from asyncrl.trainer import build_trainer

    tokenizer, model = load_tokenizer(model_path), load_model(model_path)
    trainer = build_trainer(ActorConfig(), model, model_path=model_path, temperature=1.0, autocast_dtype=None)
    loss = model(input_ids=torch.randint(0, model.config.vocab_size, (2, 16))).logits.float().mean()
    loss.backward()
    trainer.optimizer.step()  # AdamW's moments exist from here on
    saves, loads, taken, written = [], [], [], []
    with tempfile.TemporaryDirectory(dir=where) as d:
        ckpt = Checkpointer(Path(d), trainer, tokenizer, keep=1)
        for i in range(repeats):
            t0 = time.perf_counter()
            path = ckpt.save(i + 1, RunState(version=i + 1))
            saves.append(time.perf_counter() - t0)
        size = size_mb(path)
        for i in range(repeats):
            t0 = time.perf_counter()
            path = ckpt.save(repeats + i + 1, RunState(version=repeats + i + 1), background=True)
            taken.append(time.perf_counter() - t0)
            ckpt.wait()  # keep=1: the earlier checkpoints are gone, resume from this one
            written.append(time.perf_counter() - t0)
        for _ in range(repeats):
            t0 = time.perf_counter()
            fresh = build_trainer(
                ActorConfig(), load_model(str(path)), model_path=str(path), temperature=1.0, autocast_dtype=None
            )
            restore_training_state(fresh, path)
            loads.append(time.perf_counter() - t0)
    params = sum(p.numel() for p in model.parameters())
    return {
        "params_m": params / 1e6,
        "size_mb": size,
        "save_s": statistics.median(saves),
        "resume_s": statistics.median(loads),
        "bg_trainer_s": statistics.median(taken),
        "bg_written_s": statistics.median(written),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    from weight_sync import model_100m

    from asyncrl.models.hf import resolve_model_path

    tiny = resolve_model_path("builtin:tiny-sft")
    big = model_100m(tiny, Path(tempfile.gettempdir()) / "asyncrl-bench-100m")
    places = [Path(tempfile.gettempdir())] + ([Path("/dev/shm")] if Path("/dev/shm").is_dir() else [])
    print(f"CPU: {cpu()}; median of {args.repeats}")
    print(
        "| model | params | where | checkpoint MB | save s (foreground) | background: trainer s | "
        "background: complete s | trainer time fg/bg | resume s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, path in (("tiny-sft", tiny), ("~100M", big)):
        for where in places:
            r = bench(path, where, args.repeats)
            print(
                f"| {name} | {r['params_m']:.1f}M | {where} | {r['size_mb']:.1f} | {r['save_s']:.2f} | "
                f"{r['bg_trainer_s']:.3f} | {r['bg_written_s']:.2f} | {r['save_s'] / r['bg_trainer_s']:.1f}x | "
                f"{r['resume_s']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
