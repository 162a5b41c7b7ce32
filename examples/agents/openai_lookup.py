"""The lookup task's agent written with the official ``openai`` package, as one would for any OpenAI endpoint.

Standalone: ``python examples/agents/openai_lookup.py --base-url http://127.0.0.1:30000/agent/v1 --api-key KEY``
runs one problem against any OpenAI-compatible server. Trained by asyncrl without a change: asyncrl calls
``episode(client, item)`` with an ``openai.AsyncOpenAI`` whose base URL is the run's recording proxy and whose key
is the episode's own (``agent.client=openai``)::

    asyncrl train --config examples/agent_lookup.yaml agent.episode=examples.agents.openai_lookup:episode \\
        agent.client=openai "agent.options={max_turns: 6}"

(``agent.options`` replaced: the YAML's are the built-in episode's keyword arguments, which this one does not
take.)
"""

from __future__ import annotations

import openai

from asyncrl.agent.tasks.lookup import call_tool
from asyncrl.data.lookup import LOOKUP_TOOL, PYTHON_TOOL, extract_answer

TOOLS = [LOOKUP_TOOL, PYTHON_TOOL]  # the tools, and their order, that builtin:tiny-agent was fine-tuned with


async def episode(client: openai.AsyncOpenAI, item: dict, max_turns: int = 6) -> float:
    """Ask, run every tool the model calls, stop at the first reply without a tool call; 1.0 if it states the
    right answer."""
    messages = [{"role": "user", "content": item["question"]}]
    for _ in range(max_turns):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return float(extract_answer(message.content) == item["answer"])
        for call in message.tool_calls:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": await call_tool(item, call.function.name, call.function.arguments),
                }
            )
    return 0.0


def main() -> None:
    import argparse
    import asyncio
    import random

    from asyncrl.data.lookup import LookupTask

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True)
    p.add_argument("--api-key", default="none")
    args = p.parse_args()
    item = LookupTask().problem(random.Random(0))
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key)
    print(item["question"], "->", asyncio.run(episode(client, item)))


if __name__ == "__main__":
    main()
