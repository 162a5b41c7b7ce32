"""Training throughput with sequence packing vs padded batches on a long-tailed length mix.

    python bench/packing.py [--model builtin:tiny-sft] [--steps 5] [--threads 1]

Each mode runs the same ``PolicyTrainer.step`` (forward, backward, optimizer) on the same batches and reports real
(non-padding) training tokens per second:

- ``packed``: micro-batches of <= mb_max_tokens positions whose rows, as wide as the longest sample, are
  filled by first-fit-decreasing (``actor.pack_sequences=true``);
- ``padded, length-sorted``: rows sorted by length, micro-batches of <= mb_max_tokens padded tokens, each
  padded to its longest row (``actor.pack_sequences=false``, the trainer's padded path);
- ``padded, arrival order``: rows in the order the batch arrives, as many per micro-batch as the budget
  allows at the batch's longest length, each padded to its longest row (a plain padded batch).

The length mix imitates RL rollouts: a fixed prompt and log-normal completion lengths (many short, a long
tail), clipped to the generation budget. With one torch thread, tokens per CPU-second of this process is the
measure that other processes on a shared machine do not disturb; wall-clock tokens/s is what a quiet machine
shows.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from asyncrl.trainer import PolicyTrainer
from asyncrl.types import Batch


def completion_lengths(n: int, median: float, sigma: float, max_new_tokens: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    x = torch.exp(torch.randn(n, generator=g) * sigma) * median
    return x.round().clamp(4, max_new_tokens).long().tolist()


def make_batch(lengths: list[int], prompt: int, vocab: int, seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    N, T = len(lengths), prompt + max(lengths)
    ids = torch.zeros(N, T, dtype=torch.long)
    attn = torch.zeros(N, T, dtype=torch.long)
    loss_mask = torch.zeros(N, T - 1)
    for i, out in enumerate(lengths):
        ids[i, : prompt + out] = torch.randint(1, vocab, (prompt + out,), generator=g)
        attn[i, : prompt + out] = 1
        loss_mask[i, prompt - 1 : prompt + out - 1] = 1
    behav = -5.0 * loss_mask
    versions = torch.where(loss_mask > 0, 0, -1)
    rewards = torch.rand(N, generator=g).round()
    return Batch(ids, attn, loss_mask, behav, versions, rewards, torch.arange(N) // 8, torch.zeros(N, dtype=torch.bool))


def arrival_order(lengths: list[int], max_tokens: int) -> list[list[list[int]]]:
    """Micro-batches of consecutive samples, one per row, as many as fit at the batch's longest length."""
    rows = max(1, max_tokens // max(lengths))
    return [[[j] for j in range(i, min(i + rows, len(lengths)))] for i in range(0, len(lengths), rows)]


def load(model_path: str | None):
    from asyncrl.models.hf import load_model, resolve_model_path

    if model_path:
        try:
            return load_model(resolve_model_path(model_path)), model_path
        except FileNotFoundError:
            pass
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=320,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(cfg), "random tiny-sft-sized Qwen2 (hidden 256, 4 layers)"


def run(mode: str, model, batches, mb_max_tokens: int) -> dict:
    trainer = PolicyTrainer(model, pack_sequences=mode == "packed", mb_max_tokens=mb_max_tokens, lr=1e-6)
    if mode == "padded, arrival order":
        trainer.forward.plan = lambda lengths: arrival_order(lengths, mb_max_tokens)
    trainer.step(batches[0])  # warm-up
    tokens, wall, cpu, eff = 0, 0.0, 0.0, []
    for b in batches[1:]:
        t0, c0 = time.perf_counter(), time.process_time()
        stats = trainer.step(b)
        wall += time.perf_counter() - t0
        cpu += time.process_time() - c0
        tokens += b.n_tokens
        eff.append(stats["pack_efficiency"])
    return {"tokens_per_s": tokens / wall, "tokens_per_cpu_s": tokens / cpu, "efficiency": statistics.mean(eff)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="builtin:tiny-sft")
    p.add_argument("--steps", type=int, default=5, help="measured steps per mode (after one warm-up step)")
    p.add_argument("--batch", type=int, default=128, help="samples per step (16 groups x 8)")
    p.add_argument("--prompt", type=int, default=40)
    p.add_argument("--median", type=float, default=60.0, help="median completion length")
    p.add_argument("--sigma", type=float, default=0.9, help="log-normal sigma of completion lengths")
    p.add_argument("--max-new-tokens", type=int, default=1024)
    p.add_argument("--mb-max-tokens", type=int, default=8192)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model, name = load(args.model)
    vocab = model.get_input_embeddings().weight.shape[0]
    lengths = [
        completion_lengths(args.batch, args.median, args.sigma, args.max_new_tokens, seed)
        for seed in range(args.steps + 1)
    ]
    batches = [make_batch(x, args.prompt, vocab, seed) for seed, x in enumerate(lengths)]
    flat = sorted(x for xs in lengths for x in xs)
    q = lambda f: flat[int(f * (len(flat) - 1))]  # noqa: E731
    print(
        f"model: {name}; {args.batch} samples/step, prompt {args.prompt} tokens, completions p50 {q(0.5)} "
        f"p90 {q(0.9)} p99 {q(0.99)} max {flat[-1]} (mean {statistics.mean(flat):.0f}); "
        f"mb_max_tokens {args.mb_max_tokens}; {args.threads} thread(s)"
    )
    results = {
        m: run(m, model, batches, args.mb_max_tokens)
        for m in ("packed", "padded, length-sorted", "padded, arrival order")
    }
    packed = results["packed"]
    print(
        "\n| mode | train tokens/s (wall) | train tokens per CPU-second | real/computed tokens | packed speed-up "
        "(wall / CPU) |\n|---|---|---|---|---|"
    )
    for mode, r in results.items():
        wall, cpu = packed["tokens_per_s"] / r["tokens_per_s"], packed["tokens_per_cpu_s"] / r["tokens_per_cpu_s"]
        print(
            f"| {mode} | {r['tokens_per_s']:.0f} | {r['tokens_per_cpu_s']:.0f} | {r['efficiency']:.2f} | "
            f"{wall:.2f}x / {cpu:.2f}x |"
        )


if __name__ == "__main__":
    main()
