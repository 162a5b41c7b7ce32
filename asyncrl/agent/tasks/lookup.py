"""The environment and the episode of the built-in agentic task ``lookup`` (the task itself, its problems and
verifier: :mod:`asyncrl.data.lookup`).

The episode (:func:`episode`) talks to the model through an OpenAI client only: it sends the question with
the tools, runs the tool calls the model makes (the proxy returns them parsed, hermes syntax
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``), feeds the results back, and scores the first
reply without a tool call. Tools can be given a simulated latency (log-normal, ``tool_latency_s`` median and
``tool_latency_p99_s``), to study where asynchrony pays. A ``python`` tool runs code in the reward sandbox
(:mod:`asyncrl.reward.sandbox`); no problem needs it.
"""

from __future__ import annotations

import asyncio
import json
import math
import random

from asyncrl.data.lookup import lookup_reward, tool_result, tools


# ---- tools ---------------------------------------------------------------------------------------------
def normalize_key(key: str) -> str:
    """Case and spacing ignored; ``box 41's apples`` and ``box 41 apples`` read as ``apples of box 41``
    (a key that ends in a number, ``box 41``, stays as it is)."""
    words = str(key).replace("'s ", " ").casefold().split()
    if len(words) >= 2 and "of" not in words and not words[-1].isdigit():
        words = [words[-1], "of", *words[:-1]]
    return " ".join(words)


def lookup(item: dict, key) -> str:
    """The lookup tool: the item's fact stored under ``key``, the full key (``apples of box 41``) or just the
    box (``box 41``); case and spacing ignored. The result names the box it is of: ``box 41: 37``."""
    if not isinstance(key, str) or not key.strip():
        return "error: lookup needs a key, e.g. 'box 41'"
    wanted = normalize_key(key)
    for k, v in item["facts"].items():
        if wanted in (normalize_key(k), normalize_key(k.split(" of ", 1)[-1])):
            return tool_result(k, v)
    return f"no value for {key!r}"


MAX_TOOL_CHARS = 200


def run_python(code) -> str:
    """The python tool: ``code`` run in the reward sandbox (a few seconds of CPU at most); what it printed,
    else the last line of its error."""
    if not isinstance(code, str) or not code.strip():
        return "error: python needs code"
    from asyncrl.reward.sandbox import Limits, get_sandbox

    result = get_sandbox().run(code, limits=Limits(cpu_s=2.0, wall_s=5.0, memory_mb=256))
    if result.timed_out:
        return "error: timed out"
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        return "error: " + (lines[-1] if lines else f"exit status {result.returncode}")[:MAX_TOOL_CHARS]
    return result.stdout.strip()[:MAX_TOOL_CHARS]


class Latency:
    """Simulated tool latency: log-normal with the given median and 99th percentile (seconds; 0 = none)."""

    Z99 = 2.3263478740408408  # the standard normal's 99th percentile

    def __init__(self, median_s: float = 0.0, p99_s: float = 0.0, rng: random.Random | None = None):
        if median_s < 0 or p99_s < 0:
            raise ValueError("tool latency must be >= 0")
        self.mu = math.log(median_s) if median_s > 0 else None
        self.sigma = math.log(p99_s / median_s) / self.Z99 if median_s > 0 and p99_s > median_s else 0.0
        self.rng = rng or random.Random()

    def sample(self) -> float:
        if self.mu is None:
            return 0.0
        return self.rng.lognormvariate(self.mu, self.sigma) if self.sigma else math.exp(self.mu)

    async def wait(self) -> None:
        delay = self.sample()
        if delay > 0:
            await asyncio.sleep(delay)


async def call_tool(item: dict, name: str, arguments, *, python: bool = True) -> str:
    """Run one tool call of the model (``arguments`` as the JSON string the client returns, or a dict)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return "error: the arguments are not JSON"
    if not isinstance(arguments, dict):
        return "error: the arguments must be an object"
    if name == "lookup":
        return lookup(item, arguments.get("key"))
    if name == "python" and python:
        return await asyncio.to_thread(run_python, arguments.get("code"))
    return f"error: no tool named {name!r}"


# ---- the episode ---------------------------------------------------------------------------------------
async def episode(
    client,
    item: dict,
    *,
    max_turns: int = 6,
    python: bool = True,
    tool_latency_s: float = 0.0,
    tool_latency_p99_s: float = 0.0,
    max_tokens: int | None = None,
    seed: int | None = None,
) -> float:
    """One attempt at ``item`` through ``client`` (an ``openai.AsyncOpenAI`` or the in-process client): the
    question with the tools, the model's tool calls run and fed back, up to ``max_turns`` LLM calls. Returns 1.0
    if the first reply without a tool call states the right answer (``The answer is N.``), else 0.0; a
    conversation that outgrows the model's context scores 0.0 too.

    Options (``agent.options``): ``python`` offers the python tool; ``tool_latency_s`` / ``tool_latency_p99_s``
    delay each tool call by a log-normal time with that median and 99th percentile (``seed`` seeds it);
    ``max_tokens`` lowers the reply length of each call below ``gconfig.max_new_tokens``."""
    offered = tools(python)
    latency = Latency(tool_latency_s, tool_latency_p99_s, random.Random(seed) if seed is not None else None)
    messages = [{"role": "user", "content": item["question"]}]
    extra = {"max_tokens": max_tokens} if max_tokens else {}
    for _ in range(max_turns):
        try:
            reply = await client.chat.completions.create(model="policy", messages=messages, tools=offered, **extra)
        except Exception as e:  # noqa: BLE001 - only a context overflow (HTTP 400) is the episode's own failure
            if _status(e) == 400:
                return 0.0
            raise
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return lookup_reward(item["question"], message.content or "", item["answer"])
        for call in message.tool_calls:
            await latency.wait()
            result = await call_tool(item, call.function.name, call.function.arguments, python=python)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 0.0


def _status(error: Exception) -> int | None:
    return getattr(error, "status", None) or getattr(error, "status_code", None)
