"""The agent proxy's cost per LLM call, and many episodes at once.

Three ways to make the same call (a short chat, 1 new token, so the engine's own time is small and the same
for all three), run interleaved and timed one at a time:
- ``direct``: the chat template applied, then ``engine.generate`` with the prompt ids (what a built-in
  workflow does);
- ``inprocess``: the proxy through the in-process client (chat template, recording, response objects);
- ``http``: the official ``openai.AsyncOpenAI`` client over HTTP to the proxy (a second thread serves it).
Overhead = p50(way) - p50(direct). Then ``--episodes`` concurrent 3-turn episodes over HTTP, counting errors.

    python bench/agent_proxy.py [--calls 200] [--episodes 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from machine import cpu  # bench/ is on the path of a script run from it

os.environ.setdefault("HF_HUB_OFFLINE", "1")


async def main(args) -> None:
    import torch

    from asyncrl.agent.chat import ChatRenderer
    from asyncrl.agent.client import InProcessClient
    from asyncrl.agent.proxy import AgentProxy
    from asyncrl.engine.local import LocalEngine
    from asyncrl.models.hf import load_model, load_tokenizer
    from asyncrl.server.agent import build_app
    from asyncrl.server.app import ServerThread
    from asyncrl.types import SamplingParams

    torch.set_num_threads(1)
    tokenizer, model = load_tokenizer("builtin:tiny-sft"), load_model("builtin:tiny-sft")
    eos = tokenizer.eos_token_id
    engine = LocalEngine(model, max_slots=64, max_len=512, stop_token_ids=(eos,), threads=1).start()
    params = SamplingParams(max_new_tokens=1, stop_token_ids=(eos,))
    proxy = AgentProxy(ChatRenderer(tokenizer, eos), params, 512, engine=engine)
    import copy

    http_proxy = AgentProxy(ChatRenderer(copy.deepcopy(tokenizer), eos), params, 512, engine=engine)
    server_ms = []  # time inside the proxy (parse, render, engine, record, answer), server side
    chat_inside = http_proxy.chat

    async def timed_chat(key, body):
        t0 = time.perf_counter()
        try:
            return await chat_inside(key, body)
        finally:
            server_ms.append((time.perf_counter() - t0) * 1e3)

    http_proxy.chat = timed_chat
    server = ServerThread(build_app(http_proxy))
    from openai import AsyncOpenAI

    def chat(i: int) -> list[dict]:  # a different question each call: the proxy answers a repeated request once
        return [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": f"Compute {i} + 30."}]

    renderer = ChatRenderer(tokenizer, eos)
    key, http_key = proxy.open(), http_proxy.open()
    inproc = InProcessClient(proxy, key)
    client = AsyncOpenAI(base_url=server.url + "/v1", api_key=http_key, max_retries=0)

    async def direct(i):
        await engine.generate(renderer.render(chat(i)), params)

    async def via_inprocess(i):
        await inproc.chat.completions.create(model="m", messages=chat(i))

    async def via_http(i):
        await client.chat.completions.create(model="m", messages=chat(i))

    ways = {"direct": direct, "inprocess": via_inprocess, "http": via_http}
    times = {name: [] for name in ways}
    for i in range(10):  # warm-up
        for fn in ways.values():
            await fn(10**6 + i)
    for i in range(args.calls):
        for name, fn in ways.items():
            t0 = time.perf_counter()
            await fn(i)
            times[name].append((time.perf_counter() - t0) * 1e3)
    proxy.close(key)
    http_proxy.close(http_key)
    print(f"CPU: {cpu()}; tiny-sft, 1 new token per call, {args.calls} calls each, interleaved")
    base = statistics.median(times["direct"])
    print(f"{'way':>10} {'p50 ms':>8} {'p90 ms':>8} {'overhead p50 ms':>16}")
    for name, ts in times.items():
        p50, p90 = statistics.median(ts), statistics.quantiles(ts, n=10)[-1]
        print(f"{name:>10} {p50:8.2f} {p90:8.2f} {p50 - base:16.2f}")
    inside = statistics.median(server_ms[10:])
    print(
        f"http: {inside:.2f} ms p50 inside the proxy (server side), so {statistics.median(times['http']) - inside:.2f} "
        "ms in the openai client, HTTP and FastAPI"
    )

    async def episode(i: int) -> int:
        k = http_proxy.open()
        c = AsyncOpenAI(base_url=server.url + "/v1", api_key=k, max_retries=0, http_client=shared)
        msgs = [{"role": "user", "content": f"Compute {i} + 1."}]
        for _ in range(3):
            r = await c.chat.completions.create(model="m", messages=msgs, max_tokens=8)
            msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go on"}]
        return len(http_proxy.close(k).calls)

    import httpx

    shared = httpx.AsyncClient(limits=httpx.Limits(max_connections=None))
    t0 = time.perf_counter()
    results = await asyncio.gather(*(episode(i) for i in range(args.episodes)), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    calls = sum(r for r in results if isinstance(r, int))
    print(
        f"{args.episodes} concurrent 3-turn episodes over HTTP: {calls} calls recorded, {len(errors)} errors, "
        f"{time.perf_counter() - t0:.1f} s" + (f" (first: {errors[0]!r})" if errors else "")
    )
    await shared.aclose()
    await client.close()
    server.close()
    engine.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--episodes", type=int, default=64)
    asyncio.run(main(p.parse_args()))
