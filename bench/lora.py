"""LoRA against full fine-tuning, same model, same batch: trainable parameters, AdamW state memory, train step time
and the cost of the weights published each step.

    python bench/lora.py [--rank 8] [--repeats 3] [--threads 1]

A train step is ``PolicyTrainer.step`` (the RL step the loop runs: forward, decoupled PPO loss, backward, gradient
clipping, AdamW) on one fixed batch of 4 groups x 2 samples (~40-token prompts, ~60-token completions), after one
warm-up step; the median of ``--repeats``. Optimizer state is the bytes of AdamW's tensors after a step (its two
moments per trained parameter). "Publish" is ``PolicyTrainer.state_dict()``, what the loop hands the engines each step:
the live tensors for full fine-tuning, the weights with the adapters merged (new tensors) for LoRA. Models: the
shipped tiny-sft and a ~100M-parameter Qwen2 (as bench/checkpoint.py builds it).
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


def fixed_batch(vocab: int, n_groups: int = 4, n_samples: int = 2, seed: int = 0):
    import torch

    from asyncrl.data.collate import collate
    from asyncrl.types import Trajectory, TrajectoryGroup

    g = torch.Generator().manual_seed(seed)
    groups = []
    for k in range(n_groups):
        trajs = []
        for j in range(n_samples):
            prompt = torch.randint(3, vocab, (int(torch.randint(30, 50, (1,), generator=g)),), generator=g).tolist()
            out = torch.randint(3, vocab, (int(torch.randint(40, 80, (1,), generator=g)),), generator=g).tolist()
            trajs.append(Trajectory(prompt, out, [-2.0] * len(out), [0] * len(out), float((k + j) % 2)))
        groups.append(TrajectoryGroup(trajs))
    return collate(groups, pad_id=0)


def bench(model_path: str, rank: int, repeats: int) -> dict:
    import torch

    from asyncrl.models.hf import load_model
    from asyncrl.models.lora import apply_lora, trainable_summary
    from asyncrl.trainer import PolicyTrainer

    model = load_model(model_path)
    torch.manual_seed(0)
    model = apply_lora(model, rank=rank)
    trainer = PolicyTrainer(model, lr=1e-4)
    batch = fixed_batch(min(model.config.vocab_size, 320))
    trainer.step(batch)  # warm-up; AdamW's moments exist from here on
    steps, publish = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        trainer.step(batch)
        steps.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        trainer.state_dict()
        publish.append(time.perf_counter() - t0)
    state = [t for s in trainer.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    counts = trainable_summary(model)
    return {
        "total": counts["total"],
        "trainable": counts["trainable"],
        "optim_mb": sum(t.numel() * t.element_size() for t in state) / 2**20,
        "step_s": statistics.median(steps),
        "publish_ms": statistics.median(publish) * 1e3,
        "tokens": int(batch.attention_mask.sum()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    import torch
    from weight_sync import model_100m

    from asyncrl.models.hf import resolve_model_path

    torch.set_num_threads(args.threads)
    tiny = resolve_model_path("builtin:tiny-sft")
    big = model_100m(tiny, Path(tempfile.gettempdir()) / "asyncrl-bench-100m")
    print(f"CPU: {cpu()}; torch threads {args.threads}; median of {args.repeats} steps after one warm-up")
    print("| model | params | training | trainable | AdamW state MB | train step s | publish ms |")
    print("|---|---|---|---|---|---|---|")
    for name, path in (("tiny-sft", tiny), ("~100M", big)):
        full = bench(path, 0, args.repeats)
        lora = bench(path, args.rank, args.repeats)
        for what, r in (("full", full), (f"LoRA r={args.rank}", lora)):
            print(
                f"| {name} | {full['total'] / 1e6:.1f}M | {what} | {r['trainable'] / 1e6:.3f}M "
                f"({100 * r['trainable'] / r['total']:.2f}%) | {r['optim_mb']:.1f} | {r['step_s']:.2f} | "
                f"{r['publish_ms']:.1f} |"
            )
        print(
            f"| {name} | | LoRA / full | {lora['trainable'] / full['trainable']:.3f} | "
            f"{lora['optim_mb'] / full['optim_mb']:.3f} | {lora['step_s'] / full['step_s']:.2f} | "
            f"+{lora['publish_ms'] - full['publish_ms']:.1f} |"
        )
    print(
        f"(batch: {full['tokens']} tokens, 4 groups x 2 samples; publish: full hands over the live tensors, LoRA "
        "computes the merged ones)"
    )


if __name__ == "__main__":
    main()
