"""The environment of ``bench/agent_async.py``: an agent that checks each answer with a slow tool and retries.

Each episode asks the model the item's question; a checker "tool" then takes a log-normal time
(``tool_latency_s`` median, ``tool_latency_p99_s`` 99th percentile; ``asyncio.sleep``, as a remote
verifier, a sandbox queue or a web call would) to say whether the answer is right; if not, the agent asks
again (a fresh conversation), up to ``attempts`` LLM calls. Every call is rewarded by its own correctness
(``{completion_id: reward}``: the built-in arithmetic reward); the episode counts as solved (held-out
accuracy) when one of its attempts is right. What is measured is the system: episodes wait on the checker
while the engine serves others (async), or the whole batch waits for its slowest episode (sync).
"""

from __future__ import annotations

import random

from asyncrl.agent.tasks.lookup import Latency
from asyncrl.data.arith import arith_reward


async def episode(
    client,
    item: dict,
    *,
    attempts: int = 3,
    tool_latency_s: float = 1.0,
    tool_latency_p99_s: float = 8.0,
    seed: int | None = None,
) -> dict:
    latency = Latency(tool_latency_s, tool_latency_p99_s, random.Random(seed) if seed is not None else None)
    rewards = {}
    for _ in range(attempts):
        reply = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": item["question"]}]
        )
        reward = arith_reward(item["question"], reply.choices[0].message.content or "", item["answer"])
        await latency.wait()  # the checker
        rewards[reply.id] = reward
        if reward == 1.0:
            break
    return rewards
