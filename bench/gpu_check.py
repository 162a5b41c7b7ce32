"""One-shot GPU check of the built-in engine, the trainer and the asynchronous loop, on a bare GPU machine.

    pip install --no-deps --no-build-isolation -e .        # torch, transformers, numpy, safetensors, pyyaml,
                                                            # tqdm, tokenizers: what a stock PyTorch image has
    python bench/gpu_check.py                               # one GPU, the shape of Qwen2.5-0.5B, a few minutes
    python bench/gpu_check.py --cpu --small                 # the same sections on the CPU, tiny shapes, ~1 minute

Nothing is downloaded: the model is a randomly initialised ``Qwen2ForCausalLM`` with the shape of Qwen2.5-0.5B
(24 layers, hidden 896, 14 query / 2 key-value heads, vocabulary 151,936, tied embeddings) built from a config,
and no tokenizer is used (prompts are random token ids). Sections, each in its own try/except (a failure is
printed with its traceback and recorded; the other sections still run):

1. ``engine``: decode tokens/s of the built-in engine (``LocalEngine`` on the device, sampling at temperature 1
   with log-probs) vs Hugging Face ``generate`` (sampling, no log-probs) on the same device and dtype, at
   B = 1, 64, 256 prompts of ``--prompt-len`` tokens, ``--new-tokens`` each (no early stop). Decode tokens/s
   = B (N - 1) / (t_N - t_1) from a call of N tokens and one of 1 token (prefill excluded); call tokens/s
   = B N / t_N. Best of ``--repeats``. Target: engine >= 1.5x HF at B = 64.
2. ``trainer``: tokens/s of ``PolicyTrainer.step`` (GRPO advantages, decoupled PPO loss, AdamW; float32 master
   weights, autocast in ``--dtype``) on a batch of long-tailed lengths, with sequence packing and padded.
3. ``weight_sync``: in-process hand-over trainer -> engine on the same device (``InProcessPublisher``), ms,
   with the engine idle and with sequences running (those are re-prefilled under the new weights).
4. ``rl``: the same number of RL steps synchronous (eta = 0) and asynchronous (eta = 2) with the real parts
   (``LocalEngine`` in its thread, ``RolloutBuffer`` staleness gate, ``RolloutRunner``, ``PolicyTrainer``,
   ``InProcessPublisher``) and a reward-free dummy task whose prompts each ask for a fixed number of tokens,
   drawn per group from a long-tailed distribution (most answers short, a tail ``--tail-x`` times longer; EOS
   ignored). Reports step time, generator idle fraction, trainer wait fraction and the speedup. Target:
   asynchronous >= 1.5x synchronous step throughput. The first step of each arm is a warm-up and is left out
   of the steady-state figures (both totals are reported).

Results: a table on stdout and a JSON file (``--out``), rewritten after every section so that a run stopped
half-way keeps what it measured. ``--budget-s`` skips sections that would start after that many seconds.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import random
import statistics
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

QWEN25_05B = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    use_sliding_window=False,
)
TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    use_sliding_window=False,
)

# sizes per mode: (full = one GPU, Qwen2.5-0.5B shape) and (small = --small, tiny shapes)
SIZES = {
    "full": dict(
        batches=(1, 64, 256),
        prompt_len=32,
        new_tokens=128,
        repeats=2,
        train_groups=16,
        group_n=4,
        short=32,
        mb_max_tokens=16384,
        train_steps=3,
        rl_steps=8,
        rl_groups=16,
        rl_n=4,
        sync_running=64,
        sync_repeats=5,
        max_slots=256,
    ),
    "small": dict(
        batches=(1, 8, 16),
        prompt_len=8,
        new_tokens=16,
        repeats=1,
        train_groups=4,
        group_n=2,
        short=4,
        mb_max_tokens=512,
        train_steps=2,
        rl_steps=4,
        rl_groups=4,
        rl_n=2,
        sync_running=8,
        sync_repeats=3,
        max_slots=32,
    ),
}
TAIL_SHARE = 0.2  # the share of groups with the long answers


# ---- set-up ------------------------------------------------------------------------------------------------
def env_info(device: torch.device) -> dict:
    import transformers

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(device),
        "cpu": platform.processor(),
        "threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(
            gpu=p.name,
            gpu_memory_gib=round(p.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
            tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
        )
    return info


def build_model(shape: dict, device: torch.device, seed: int = 0):
    """A randomly initialised Qwen2 model of ``shape``, float32, on ``device``, in eval mode."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**shape)
    cfg.eos_token_id = cfg.bos_token_id = cfg.pad_token_id = None  # no token ends a sample
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_prompts(vocab: int, batch: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g).tolist()


def long_tailed_lengths(n: int, short: int, tail_x: int, seed: int) -> list[int]:
    """``n`` answer lengths: ``short`` tokens (give or take a quarter) for most, ``tail_x`` times that for a
    share of ``TAIL_SHARE``; a fixed sequence for a given seed."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        base = short * tail_x if rng.random() < TAIL_SHARE else short
        out.append(max(1, int(base * rng.uniform(0.75, 1.25))))
    return out


# ---- 1. engine vs HF generate -------------------------------------------------------------------------------
def section_engine(args, ctx) -> dict:
    from asyncrl.engine.local import LocalEngine
    from asyncrl.engine.requests import NO_STOP_TOKENS
    from asyncrl.types import SamplingParams

    size, device, dtype = ctx["size"], ctx["device"], ctx["dtype"]
    model = ctx["model"]
    n = size["new_tokens"]
    max_len = size["prompt_len"] + n + 8
    engine = LocalEngine(
        model,
        max_slots=max(size["batches"]),
        max_len=max_len,
        dtype=dtype,
        seed=0,
        device=device,
        stop_token_ids=NO_STOP_TOKENS,
    )
    hf = copy.deepcopy(model).to(dtype).eval()

    def run_engine(prompts, tokens):
        params = SamplingParams(max_new_tokens=tokens, temperature=1.0, stop_token_ids=NO_STOP_TOKENS)
        sync(device)
        t0 = time.perf_counter()
        out = engine.generate_batch(prompts, params)
        sync(device)
        dt = time.perf_counter() - t0
        assert all(len(c.output_ids) == tokens and len(c.logprobs) == tokens for (c,) in out)
        return dt

    def run_hf(prompts, tokens):
        ids = torch.tensor(prompts, device=device)
        sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                pad_token_id=0,
            )
        sync(device)
        dt = time.perf_counter() - t0
        assert out.shape[1] == ids.shape[1] + tokens
        return dt

    rows = {}
    for b in size["batches"]:
        prompts = random_prompts(model.config.vocab_size, b, size["prompt_len"], seed=b)
        cell = {}
        for name, run in (("engine", run_engine), ("hf", run_hf)):
            run(prompts, 2)  # warm-up
            call, decode, ttft = [], [], []
            for _ in range(size["repeats"]):
                t_n, t_1 = run(prompts, n), run(prompts, 1)
                call.append(b * n / t_n)
                decode.append(b * (n - 1) / max(t_n - t_1, 1e-9))
                ttft.append(t_1)
            cell[name] = {"call_tok_s": max(call), "decode_tok_s": max(decode), "ttft_ms": 1e3 * min(ttft)}
        cell["decode_ratio"] = cell["engine"]["decode_tok_s"] / cell["hf"]["decode_tok_s"]
        cell["call_ratio"] = cell["engine"]["call_tok_s"] / cell["hf"]["call_tok_s"]
        rows[b] = cell
        print(
            f"  B={b}: engine {cell['engine']['decode_tok_s']:,.0f} decode tok/s, HF "
            f"{cell['hf']['decode_tok_s']:,.0f} ({cell['decode_ratio']:.2f}x); call "
            f"{cell['engine']['call_tok_s']:,.0f} vs {cell['hf']['call_tok_s']:,.0f} ({cell['call_ratio']:.2f}x)",
            flush=True,
        )
    engine = hf = None  # the KV cache and the model copy are freed before the next section
    free(device)
    ref = 64 if 64 in rows else sorted(rows)[len(rows) // 2]
    return {
        "new_tokens": n,
        "prompt_len": size["prompt_len"],
        "by_batch": rows,
        "target_batch": ref,
        "target": ">= 1.5x HF decode tok/s",
        "meets_target": rows[ref]["decode_ratio"] >= 1.5,
    }


# ---- 2. trainer -------------------------------------------------------------------------------------------------
def synthetic_groups(vocab: int, groups: int, n: int, prompt_len: int, lengths: list[int], seed: int):
    from asyncrl.types import Trajectory, TrajectoryGroup

    g = torch.Generator().manual_seed(seed)
    lp = -math.log(vocab)  # a random model's log-probs are about this
    out = []
    for i in range(groups):
        prompt = torch.randint(0, vocab, (prompt_len,), generator=g).tolist()
        trajs = []
        for _ in range(n):
            output = torch.randint(0, vocab, (lengths[i],), generator=g).tolist()
            trajs.append(
                Trajectory(
                    prompt, output, [lp] * len(output), [0] * len(output), float(torch.rand((), generator=g)), "length"
                )
            )
        out.append(TrajectoryGroup(trajs, item_id=i))
    return out


def make_trainer(model, ctx, pack: bool):
    from asyncrl.trainer import PolicyTrainer

    autocast = None if ctx["dtype"] == torch.float32 else ctx["dtype"]
    return PolicyTrainer(
        model.train(),
        lr=1e-6,
        mb_max_tokens=ctx["size"]["mb_max_tokens"],
        pack_sequences=pack,
        autocast_dtype=autocast,
        device=ctx["device"],
    )


def section_trainer(args, ctx) -> dict:
    from asyncrl.data.collate import collate

    size, device = ctx["size"], ctx["device"]
    vocab = ctx["model"].config.vocab_size
    lengths = long_tailed_lengths(size["train_groups"], size["short"], args.tail_x, seed=1)
    batch = collate(synthetic_groups(vocab, size["train_groups"], size["group_n"], size["prompt_len"], lengths, 2), 0)
    out = {
        "rows": int(batch.input_ids.shape[0]),
        "tokens": batch.n_tokens,
        "padded_positions": int(batch.input_ids.numel()),
    }
    for label, pack in (("packed", True), ("padded", False)):
        try:
            trainer = make_trainer(copy.deepcopy(ctx["model"]), ctx, pack)
        except Exception as e:  # noqa: BLE001 - e.g. an attention implementation that cannot pack
            out[label] = {"error": f"{type(e).__name__}: {e}"}
            print(f"  {label}: {out[label]['error']}", flush=True)
            continue
        trainer.step(batch, version=0)  # warm-up
        times, stats = [], {}
        for step in range(size["train_steps"]):
            sync(device)
            t0 = time.perf_counter()
            stats = trainer.step(batch, version=step + 1)
            sync(device)
            times.append(time.perf_counter() - t0)
        best = min(times)
        out[label] = {
            "step_s": best,
            "tok_s": batch.n_tokens / best,
            "pack_efficiency": stats.get("pack_efficiency"),
            "loss": stats.get("loss"),
        }
        print(
            f"  {label}: {out[label]['tok_s']:,.0f} tok/s ({best * 1e3:.0f} ms per step of {batch.n_tokens} tokens)",
            flush=True,
        )
        del trainer
        free(device)
    return out


# ---- 3. weight sync -------------------------------------------------------------------------------------------
def section_weight_sync(args, ctx) -> dict:
    from asyncrl.engine.local import LocalEngine
    from asyncrl.engine.requests import NO_STOP_TOKENS
    from asyncrl.types import SamplingParams
    from asyncrl.weights.publish import InProcessPublisher

    size, device, dtype = ctx["size"], ctx["device"], ctx["dtype"]
    trainer_model = copy.deepcopy(ctx["model"])  # the trainer's weights: float32, on the device
    sd = trainer_model.state_dict()
    engine = LocalEngine(
        ctx["model"],
        max_slots=size["max_slots"],
        max_len=size["prompt_len"] + 4 * size["new_tokens"],
        dtype=dtype,
        device=device,
        stop_token_ids=NO_STOP_TOKENS,
    ).start()
    publisher = InProcessPublisher([engine], timeout_s=120)
    version = 0
    try:
        idle = []
        for _ in range(size["sync_repeats"] + 1):
            version += 1
            idle.append(publisher.publish(sd, version))
        idle = idle[1:]  # the first writes into freshly allocated memory
        # with sequences running: they are re-prefilled under the new weights before decoding goes on
        running = []
        params = SamplingParams(max_new_tokens=3 * size["new_tokens"], temperature=1.0, stop_token_ids=NO_STOP_TOKENS)
        futures = [
            engine.submit(p, params)
            for p in random_prompts(ctx["model"].config.vocab_size, size["sync_running"], size["prompt_len"], 5)
        ]
        time.sleep(0.2)
        for _ in range(size["sync_repeats"]):
            version += 1
            running.append(publisher.publish(sd, version))
            time.sleep(0.05)
        for f in futures:
            f.result(timeout=600)
    finally:
        engine.stop()
    on_device = all(t.device.type == device.type for t in sd.values())
    out = {
        "params": sum(t.numel() for t in sd.values()),
        "engine_dtype": str(dtype).removeprefix("torch."),
        "source_on_device": on_device,
        "idle_ms": 1e3 * statistics.median(idle),
        "running_ms": 1e3 * statistics.median(running),
        "running_sequences": size["sync_running"],
    }
    print(
        f"  idle {out['idle_ms']:.1f} ms, with {size['sync_running']} sequences re-prefilled "
        f"{out['running_ms']:.1f} ms (median)",
        flush=True,
    )
    del engine, trainer_model, sd
    free(device)
    return out


# ---- 4. synchronous vs asynchronous RL ----------------------------------------------------------------------
class FixedLengthTask:
    """A reward-free dummy workflow: each item asks for exactly ``item["tokens"]`` new tokens (EOS ignored), ``n``
    samples; the reward is the share of even token ids (varies within a group, so the advantages are not 0)."""

    def __init__(self, n: int):
        self.n = n

    async def run(self, item: dict, engine):
        from asyncrl.engine.requests import NO_STOP_TOKENS
        from asyncrl.types import SamplingParams, Trajectory, TrajectoryGroup

        params = SamplingParams(n=self.n, max_new_tokens=item["tokens"], temperature=1.0, stop_token_ids=NO_STOP_TOKENS)
        completions = await engine.generate(item["prompt_ids"], params)
        return TrajectoryGroup(
            [
                Trajectory(
                    c.prompt_ids,
                    c.output_ids,
                    c.logprobs,
                    c.versions,
                    sum(t % 2 == 0 for t in c.output_ids) / len(c.output_ids),
                    c.finish_reason,
                )
                for c in completions
            ],
            item_id=item["id"],
        )


def task_items(vocab: int, prompt_len: int, short: int, tail_x: int, seed: int):
    """The endless prompt stream: the same sequence of (prompt, length) for every arm."""
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    i = 0
    while True:
        base = short * tail_x if rng.random() < TAIL_SHARE else short
        yield {
            "id": i,
            "prompt_ids": torch.randint(0, vocab, (prompt_len,), generator=g).tolist(),
            "tokens": max(1, int(base * rng.uniform(0.75, 1.25))),
        }
        i += 1


def run_arm(eta: int, args, ctx) -> dict:
    from asyncrl.data.collate import collate
    from asyncrl.engine.local import LocalEngine
    from asyncrl.loop.buffer import RolloutBuffer
    from asyncrl.loop.rollout import RolloutRunner
    from asyncrl.weights.publish import InProcessPublisher

    size, device, dtype = ctx["size"], ctx["device"], ctx["dtype"]
    base = ctx["model"]
    max_len = size["prompt_len"] + int(size["short"] * args.tail_x * 1.25) + 8
    try:
        trainer = make_trainer(copy.deepcopy(base), ctx, pack=True)
    except Exception:  # noqa: BLE001 - packing refused: padded micro-batches
        trainer = make_trainer(copy.deepcopy(base), ctx, pack=False)
    engine = LocalEngine(
        base, max_slots=size["max_slots"], max_len=max_len, dtype=dtype, seed=0, device=device, threads=ctx["threads"]
    ).start()
    buffer = RolloutBuffer(size["rl_groups"], eta)
    items = task_items(base.config.vocab_size, size["prompt_len"], size["short"], args.tail_x, seed=3)
    rollout = RolloutRunner(engine, buffer, FixedLengthTask(size["rl_n"]), items, timeout_s=600)
    publisher = InProcessPublisher([engine], timeout_s=120)
    steps = []
    try:
        t_start = time.perf_counter()
        rollout.start()
        for step in range(size["rl_steps"]):
            t0 = time.perf_counter()
            busy0 = engine.stats().busy_s
            groups = buffer.take(timeout=600)
            t_wait = time.perf_counter() - t0
            batch = collate(groups, 0)
            t1 = time.perf_counter()
            stats = trainer.step(batch, version=step)
            sync(device)
            t_train = time.perf_counter() - t1
            sync_s = publisher.publish(trainer.state_dict(), step + 1)
            buffer.set_version(step + 1)
            t_end = time.perf_counter()
            staleness = [step - v for g in groups for t in g.trajectories for v in t.versions]
            steps.append(
                {
                    "step_s": t_end - t0,
                    "wait_s": t_wait,
                    "train_s": t_train,
                    "sync_s": sync_s,
                    "engine_busy_s": engine.stats().busy_s - busy0,
                    "tokens": batch.n_tokens,
                    "generated": sum(len(t.output_ids) for g in groups for t in g.trajectories),
                    "max_staleness": max(staleness),
                    "loss": stats.get("loss"),
                }
            )
        total_s = time.perf_counter() - t_start
    finally:
        rollout.stop()
        engine.stop()
    del trainer, engine
    free(device)

    def summary(rows):
        wall = sum(r["step_s"] for r in rows)
        return {
            "steps": len(rows),
            "wall_s": wall,
            "step_s": wall / len(rows),
            "generated_tok_s": sum(r["generated"] for r in rows) / wall,
            "generator_idle": max(0.0, 1 - sum(r["engine_busy_s"] for r in rows) / wall),
            "trainer_wait": sum(r["wait_s"] for r in rows) / wall,
            "train_s": statistics.mean(r["train_s"] for r in rows),
            "sync_ms": 1e3 * statistics.median(r["sync_s"] for r in rows),
        }

    steady = steps[1:] if len(steps) > 1 else steps
    return {
        "eta": eta,
        "total_s": total_s,
        "all": summary(steps),
        "steady": summary(steady),
        "max_staleness": max(r["max_staleness"] for r in steps),
        "per_step": steps,
    }


def section_rl(args, ctx) -> dict:
    size = ctx["size"]
    out = {
        "steps": size["rl_steps"],
        "groups_per_batch": size["rl_groups"],
        "samples_per_group": size["rl_n"],
        "lengths": f"{1 - TAIL_SHARE:.0%} ~{size['short']} tokens, {TAIL_SHARE:.0%} ~{size['short'] * args.tail_x}",
    }
    for label, eta in (("sync", 0), ("async", 2)):
        arm = run_arm(eta, args, ctx)
        out[label] = arm
        s = arm["steady"]
        print(
            f"  {label} (eta={eta}): {s['step_s']:.2f} s/step, generator idle {s['generator_idle']:.0%}, "
            f"trainer waiting {s['trainer_wait']:.0%}, max staleness {arm['max_staleness']}",
            flush=True,
        )
    out["speedup"] = out["sync"]["steady"]["step_s"] / out["async"]["steady"]["step_s"]
    out["speedup_all_steps"] = out["sync"]["all"]["step_s"] / out["async"]["all"]["step_s"]
    out["target"] = ">= 1.5x step throughput"
    out["meets_target"] = out["speedup"] >= 1.5
    print(f"  speedup {out['speedup']:.2f}x (all steps {out['speedup_all_steps']:.2f}x)", flush=True)
    return out


# ---- driver -----------------------------------------------------------------------------------------------------
def free(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def table(results: dict) -> str:
    lines = [
        f"asyncrl GPU check: {results['env'].get('gpu', results['env']['device'])}, "
        f"torch {results['env']['torch']}, transformers {results['env']['transformers']}, "
        f"model {results['model']}, dtype {results['dtype']}"
    ]
    e = results.get("engine")
    if e and "by_batch" in e:
        lines += [
            "",
            "| B | engine decode tok/s | HF decode tok/s | ratio | engine call tok/s | HF call tok/s | "
            "ratio | engine TTFT ms | HF TTFT ms |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for b, c in e["by_batch"].items():
            lines.append(
                f"| {b} | {c['engine']['decode_tok_s']:,.0f} | {c['hf']['decode_tok_s']:,.0f} | "
                f"{c['decode_ratio']:.2f}x | {c['engine']['call_tok_s']:,.0f} | {c['hf']['call_tok_s']:,.0f} | "
                f"{c['call_ratio']:.2f}x | {c['engine']['ttft_ms']:.1f} | {c['hf']['ttft_ms']:.1f} |"
            )
        lines.append(f"target (B={e['target_batch']}): {e['target']}: {'MET' if e['meets_target'] else 'NOT MET'}")
    t = results.get("trainer")
    if t and "tokens" in t:
        lines += ["", f"trainer, {t['rows']} rows, {t['tokens']} tokens ({t['padded_positions']} padded positions):"]
        for label in ("packed", "padded"):
            r = t.get(label, {})
            lines.append(
                f"  {label}: "
                + (r["error"] if "error" in r else f"{r['tok_s']:,.0f} tok/s, {r['step_s'] * 1e3:.0f} ms/step")
            )
    w = results.get("weight_sync")
    if w and "idle_ms" in w:
        lines += [
            "",
            f"in-process weight sync ({w['params'] / 1e6:.0f}M params -> {w['engine_dtype']} engine, "
            f"device to device: {w['source_on_device']}): {w['idle_ms']:.1f} ms idle, "
            f"{w['running_ms']:.1f} ms with {w['running_sequences']} sequences re-prefilled",
        ]
    r = results.get("rl")
    if r and "speedup" in r:
        lines += [
            "",
            f"RL, {r['steps']} steps of {r['groups_per_batch']} groups x {r['samples_per_group']}, lengths "
            f"{r['lengths']} (steady state: first step left out)",
            "| arm | s/step | generated tok/s | generator idle | trainer waiting | train s | sync ms | max staleness |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for label in ("sync", "async"):
            a, s = r[label], r[label]["steady"]
            lines.append(
                f"| {label} (eta={a['eta']}) | {s['step_s']:.2f} | {s['generated_tok_s']:,.0f} | "
                f"{s['generator_idle']:.0%} | {s['trainer_wait']:.0%} | {s['train_s']:.2f} | "
                f"{s['sync_ms']:.1f} | {a['max_staleness']} |"
            )
        lines.append(
            f"speedup {r['speedup']:.2f}x (all steps {r['speedup_all_steps']:.2f}x); target {r['target']}: "
            f"{'MET' if r['meets_target'] else 'NOT MET'}"
        )
    failed = [k for k in SECTIONS if isinstance(results.get(k), dict) and "error" in results[k]]
    skipped = [k for k in SECTIONS if isinstance(results.get(k), dict) and "skipped" in results[k]]
    if failed:
        lines += ["", "FAILED: " + ", ".join(f"{k} ({results[k]['error'].splitlines()[0]})" for k in failed)]
    if skipped:
        lines += ["", "skipped: " + ", ".join(f"{k} ({results[k]['skipped']})" for k in skipped)]
    return "\n".join(lines)


SECTIONS = {"engine": section_engine, "trainer": section_trainer, "weight_sync": section_weight_sync, "rl": section_rl}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="run on the CPU (with --small: a one-minute plumbing check)")
    p.add_argument("--small", action="store_true", help="tiny model and sizes")
    p.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        help="engine / autocast dtype (default: bfloat16 on a GPU, float32 on the CPU)",
    )
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {list(SECTIONS)}")
    p.add_argument("--tail-x", type=int, default=12, help="how many times longer the long answers are (8-16)")
    p.add_argument("--budget-s", type=float, default=420.0, help="do not start a section after this many seconds")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = leave as is)")
    p.add_argument("--out", default=str(REPO / "outputs" / "gpu_check.json"))
    args = p.parse_args(argv)
    t_start = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.cpu and not torch.cuda.is_available():
        print("no CUDA device visible: run with --cpu (and --small for a quick check)", file=sys.stderr)
        return 2
    device = torch.device("cpu") if args.cpu else torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 stays float32 (as the engine's log-probs assume)
    dtype = getattr(torch, args.dtype or ("float32" if args.cpu else "bfloat16"))
    size = dict(SIZES["small" if args.small else "full"])
    shape = TINY if args.small else QWEN25_05B
    results: dict = {
        "env": env_info(device),
        "model": "tiny" if args.small else "Qwen2.5-0.5B shape (random)",
        "dtype": str(dtype).removeprefix("torch."),
        "tail_x": args.tail_x,
        "sizes": size,
    }
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def save():
        out_path.write_text(json.dumps(results, indent=1, default=str))

    print(json.dumps(results["env"]), flush=True)
    t0 = time.perf_counter()
    model = build_model(shape, device)
    results["model_build_s"] = time.perf_counter() - t0
    results["params"] = sum(p.numel() for p in model.parameters())
    print(
        f"model: {results['params'] / 1e6:.0f}M parameters on {device}, built in {results['model_build_s']:.1f} s",
        flush=True,
    )
    ctx = {"device": device, "dtype": dtype, "size": size, "model": model, "threads": args.threads or None}
    for name in args.sections.split(","):
        if name not in SECTIONS:
            print(f"unknown section '{name}' (one of {list(SECTIONS)})", file=sys.stderr)
            continue
        elapsed = time.perf_counter() - t_start
        if elapsed > args.budget_s:
            results[name] = {"skipped": f"{elapsed:.0f} s elapsed > --budget-s {args.budget_s:.0f}"}
            print(f"== {name}: skipped ({results[name]['skipped']})", flush=True)
            save()
            continue
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        try:
            results[name] = SECTIONS[name](args, ctx)
        except Exception as e:  # noqa: BLE001 - one failing section must not lose the others
            traceback.print_exc()
            results[name] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
            free(device)
        results[name]["seconds"] = time.perf_counter() - t0
        if device.type == "cuda":
            results[name]["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            torch.cuda.reset_peak_memory_stats(device)
        print(f"   ({results[name]['seconds']:.1f} s)", flush=True)
        save()
    results["total_s"] = time.perf_counter() - t_start
    save()
    print("\n" + table(results))
    print(f"\nJSON: {out_path}")
    return 1 if any("error" in results.get(k, {}) for k in SECTIONS) else 0


if __name__ == "__main__":
    sys.exit(main())
