"""Agent episodes referenced by import path from tests, written against the OpenAI client interface only."""

import json

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a value up.",
                                            "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                                                           "required": ["key"]}}}]


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
    first = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "a"}],
                                                 max_tokens=4)
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "summary: b"}],
                                         max_tokens=4)
    return {first.id: 1.0}
