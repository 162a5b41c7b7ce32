"""Agent episodes referenced by import path from tests, written against the OpenAI client interface only."""

import json

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a value up.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        },
    }
]


async def three_turns(client, item):
    """Three calls: the question, then two tool results fed back (whatever the model wrote)."""
    messages = [{"role": "user", "content": item["question"]}]
    for turn in range(3):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=8)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if turn < 2:
            messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": json.dumps({"value": turn})})
    return float(len(message.content or "") % 3)


async def edits_history(client, item):
    """The second call drops the first reply (the agent summarised its history): a new chain."""
    first = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "a"}], max_tokens=4
    )
    await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "summary: b"}], max_tokens=4
    )
    return {first.id: 1.0}


BARE_TOOLS = [
    {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}},
    }
]
"""The lookup tool without a description or required keys (what tool_episode offers)."""


async def tool_episode(client, item):
    """Asks, runs the lookup tool for every call the model makes (arguments echoed back as JSON strings,
    as OpenAI clients do), and stops at the first reply without a tool call."""
    messages = [{"role": "system", "content": "Use the tool."}, {"role": "user", "content": item["question"]}]
    for _ in range(4):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=BARE_TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return 1.0 if "42" in (message.content or "") else 0.0
        for call in message.tool_calls:
            key = json.loads(call.function.arguments)["key"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(len(key))})
    return 0.0


_calls = {"n": 0}


async def sometimes_fails(client, item):
    _calls["n"] += 1
    if _calls["n"] == 2:
        raise KeyError("the tool server is down")
    reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "q"}])
    return float(len(reply.choices[0].message.content) > 0)


async def sometimes_nan(client, item):
    """Its second episode scores NaN (a reward computed from nothing)."""
    _calls["nan"] = mine = _calls.get("nan", 0) + 1
    reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "q"}])
    return float("nan") if mine == 2 else float(len(reply.choices[0].message.content) > 0)


async def always_fails(client, item):
    raise TimeoutError("the sandbox queue is full")


async def needs_base_url(client, item):
    """An episode that reads the client's base_url (as the Agents SDK example does) before one call."""
    assert str(client.base_url).startswith("http://127.0.0.1")
    reply = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    return float(bool(reply.choices[0].message.content))


async def two_choices_no_latency(client, item, tool_latency_s=0.0, **_):
    """One request with n = 2 (max_tokens left out the SDK's way: NOT_GIVEN), rewarded per choice; fails if any
    simulated tool latency reaches it (held-out evaluation runs without)."""
    import openai

    if tool_latency_s and item.get("evaluation"):
        raise AssertionError(f"evaluation got tool_latency_s={tool_latency_s}")
    reply = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "q"}], n=2, max_tokens=openai.NOT_GIVEN
    )
    return {reply.id: [1.0, 0.0]}
