"""Episodes whose tools take a known time, for the time accounting of agent workflows
(tests/agent/test_episode_time.py)."""

import asyncio

from agents_for_tests import BARE_TOOLS

TOOL_S = 0.1
"""How long each call of the slow tool takes."""


async def _episode(client, item, tool_s: float):
    messages = [{"role": "user", "content": item["question"]}]
    for _ in range(4):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=BARE_TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return 1.0
        for call in message.tool_calls:
            if tool_s:
                await asyncio.sleep(tool_s)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "1"})
    return 0.0


async def parallel_calls(client, item):
    """Three LLM calls at once, then the answer: the episode's calls overlap."""
    messages = [{"role": "user", "content": item["question"]}]
    await asyncio.gather(*(client.chat.completions.create(model="policy", messages=messages) for _ in range(3)))
    return 1.0


async def instant_tools(client, item):
    return await _episode(client, item, 0.0)


async def slow_tools(client, item):
    return await _episode(client, item, TOOL_S)
