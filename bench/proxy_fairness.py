"""One session's long messages against another session's short call, in the agent proxy.

Three sessions each send a chat of ``--chars`` characters (the proxy's limit is 1 Mi), and a fourth, 20 ms
later, a short one; the figure is the short call's latency, with the proxy's tokenising thread in arrival order
(as it was) and smallest job first (as it is: asyncrl/agent/fair.py), interleaved, ``--repeats`` times each:

    python bench/proxy_fairness.py [--chars 1000000] [--repeats 3]

The long prompts are longer than the tiny model's context, so the proxy refuses them after tokenising (their cost
is paid all the same); the short call is answered with one new token.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from machine import cpu  # bench/ is on the path of a script run from it

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class ArrivalOrder:
    """The proxy's tokenising thread as it was: one thread, jobs in arrival order."""

    def __init__(self):
        self._pool = ThreadPoolExecutor(1)

    def submit(self, size, fn):
        return self._pool.submit(fn)

    def shutdown(self):
        self._pool.shutdown(wait=False, cancel_futures=True)


async def short_call_latency(proxy, chars: int) -> float:
    long_body = {"messages": [{"role": "user", "content": "word " * (chars // 5 - 20)}], "max_tokens": 1}
    short_body = {"messages": [{"role": "user", "content": "Compute 2 + 3."}], "max_tokens": 1}
    keys = [proxy.open() for _ in range(4)]
    longs = [asyncio.ensure_future(proxy.chat(k, long_body)) for k in keys[:3]]
    await asyncio.sleep(0.02)
    t0 = time.perf_counter()
    await proxy.chat(keys[3], short_body)
    latency = time.perf_counter() - t0
    await asyncio.gather(*longs, return_exceptions=True)  # refused as too long for the context, after tokenising
    for k in keys:
        proxy.close(k)
    return latency


async def main(args) -> None:
    import torch

    from asyncrl.agent.chat import ChatRenderer
    from asyncrl.agent.proxy import AgentProxy
    from asyncrl.engine.local import LocalEngine
    from asyncrl.models.hf import load_model, load_tokenizer
    from asyncrl.types import SamplingParams

    torch.set_num_threads(1)
    tokenizer, model = load_tokenizer("builtin:tiny-sft"), load_model("builtin:tiny-sft")
    eos = tokenizer.eos_token_id
    engine = LocalEngine(model, max_slots=8, max_len=512, stop_token_ids=(eos,), threads=1).start()
    proxy = AgentProxy(ChatRenderer(tokenizer, eos), SamplingParams(max_new_tokens=1, stop_token_ids=(eos,)), 512)
    proxy.engine = engine
    smallest_first = proxy._tokenizing
    arms = {"arrival order (before)": ArrivalOrder(), "smallest first (now)": smallest_first}
    seen = {name: [] for name in arms}
    for _ in range(args.repeats):
        for name, worker in arms.items():
            proxy._tokenizing = worker
            seen[name].append(await short_call_latency(proxy, args.chars))
    engine.stop()
    print(cpu())
    print(f"3 sessions x {args.chars} characters, then a short call from a fourth; its latency (s), {args.repeats}x:")
    for name, values in seen.items():
        print(f"  {name:24s} median {statistics.median(values):7.3f}  all {', '.join(f'{v:.3f}' for v in values)}")
    before, now = (statistics.median(v) for v in seen.values())
    print(f"  ratio before / now: {before / now:.1f}x")
    for worker in arms.values():
        worker.shutdown()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chars", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=3)
    asyncio.run(main(p.parse_args()))
