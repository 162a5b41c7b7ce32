"""Several trainer processes against one, on this machine.

1. ``asyncrl train`` with ``actor.backend=ddp:d2`` (two ranks, one thread each) vs one process with
   ``actor.threads=2``, the same steps, config and seeds: steps/s, training tokens/s, held-out accuracy.
2. The full-weights gather of FSDP2 over 2 gloo ranks (what rank 0 publishes after each step) for the tiny
   model and a ~100M-parameter one, against reading the state dict of one process.

    python bench/trainer_ranks.py [--steps 40] [--skip-runs] [--skip-gather]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu  # bench/ is on the path of a script run from it

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))


def run(name: str, steps: int, out: Path, *overrides: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "asyncrl.cli",
        "train",
        f"output_dir={out}",
        f"trial_name={name}",
        f"total_train_steps={steps}",
        "max_train_time_s=0",
        f"evaluator.freq_steps={steps}",
        "progress_bar=false",
        "report=false",
        "cluster.cpu_split=fixed",
        *overrides,
    ]  # one process with actor.threads=2, not shared
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - t0
    records = [json.loads(l) for l in (out / "asyncrl" / name / "metrics.jsonl").read_text().splitlines()]
    steps_ = [r for r in records if r["step"] > 0]
    return {
        "name": name,
        "wall_s": wall,
        "train_s": steps_[-1]["elapsed_s"],
        "steps_per_s": len(steps_) / steps_[-1]["elapsed_s"],
        "train_tok_s": statistics.median(r["train_tokens_per_s"] for r in steps_[1:]),
        "eval_start": records[0]["eval_accuracy"],
        "eval_end": steps_[-1]["eval_accuracy"],
    }


def _gather_rank(rank: int, port: int, model_dir: str, repeats: int, out) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    import torch

    torch.set_num_threads(1)
    from asyncrl.cluster import parallel
    from asyncrl.models.hf import load_model

    dp = parallel.from_env("fsdp", torch.device("cpu"), 600)
    model = dp.wrap(load_model(model_dir))
    times = []
    for _ in range(repeats):
        torch.distributed.barrier()
        t0 = time.perf_counter()
        dp.full_state_dict(model)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put(statistics.median(times))
    torch.distributed.destroy_process_group()


def gather(model_dir: str, repeats: int = 5) -> tuple[float, float]:
    import torch.multiprocessing as mp

    from asyncrl.models.hf import load_model

    m = load_model(model_dir)
    t0 = time.perf_counter()
    for _ in range(repeats):
        {k: v.detach().clone() for k, v in m.state_dict().items()}
    one = (time.perf_counter() - t0) / repeats
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_gather_rank, args=(r, port, model_dir, repeats, q)) for r in range(2)]
    for p in procs:
        p.start()
    two = q.get(timeout=600)
    for p in procs:
        p.join()
    return one, two


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--skip-runs", action="store_true")
    p.add_argument("--skip-gather", action="store_true")
    args = p.parse_args()
    print(f"CPU: {cpu()}")
    if not args.skip_runs:
        with tempfile.TemporaryDirectory() as d:
            rows = [
                run("one-process", args.steps, Path(d), "actor.threads=2"),
                run("ddp-d2", args.steps, Path(d), "actor.backend=ddp:d2", "actor.threads=1"),
            ]
        print(f"\n{args.steps} steps, default config otherwise (the built-in engine in rank 0's process)")
        print(f"{'run':>12} {'steps/s':>8} {'train tok/s':>12} {'wall s':>7} {'eval start':>10} {'eval end':>9}")
        for r in rows:
            print(
                f"{r['name']:>12} {r['steps_per_s']:8.3f} {r['train_tok_s']:12.0f} {r['wall_s']:7.0f} "
                f"{r['eval_start']:10.3f} {r['eval_end']:9.3f}"
            )
        print(f"ddp:d2 / one process: {rows[1]['steps_per_s'] / rows[0]['steps_per_s']:.2f}x steps/s")
    if not args.skip_gather:
        from weight_sync import model_100m

        from asyncrl.models.hf import resolve_model_path

        big = model_100m(resolve_model_path("builtin:tiny-sft"), Path(tempfile.gettempdir()) / "asyncrl-bench-100m")
        print("\nfull weights on rank 0 (median of 5): one process's state dict copy vs FSDP2 gather over 2 ranks")
        for name, path in (("tiny-sft (3.3M)", resolve_model_path("builtin:tiny-sft")), ("~100M", big)):
            one, two = gather(path)
            print(f"{name:>16}: copy {one * 1e3:7.1f} ms   fsdp gather {two * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
