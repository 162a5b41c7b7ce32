"""The lookup task's agent written with the OpenAI Agents SDK (``pip install 'asyncrl[agents]'``, PyPI
``openai-agents``): an ``Agent`` with a ``function_tool``, run by ``Runner``; the only asyncrl-specific line
is that its model is the chat-completions model over the client asyncrl hands in (the recording proxy, with
the episode's key)::

    asyncrl train --config examples/agent_lookup.yaml agent.episode=examples.agents.agents_sdk_lookup:episode \\
        agent.client=openai "agent.options={max_turns: 6}"

(``agent.options`` replaced: the YAML's are the built-in episode's keyword arguments, which this one does not
take.)
"""

from __future__ import annotations

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from agents.exceptions import AgentsException

from asyncrl.agent.tasks.lookup import lookup, run_python
from asyncrl.data.lookup import LOOKUP_TOOL, PYTHON_TOOL, extract_answer

set_tracing_disabled(True)  # no traces sent anywhere


async def episode(client, item: dict, max_turns: int = 6) -> float:
    @function_tool
    def lookup_number(key: str) -> str:
        """The number stored under a key."""
        return lookup(item, key)

    @function_tool
    def python_code(code: str) -> str:
        """Run Python code."""
        return run_python(code)

    # the names, descriptions and order of the tools builtin:tiny-agent was fine-tuned with
    lookup_number.name, lookup_number.description = "lookup", LOOKUP_TOOL["function"]["description"]
    python_code.name, python_code.description = "python", PYTHON_TOOL["function"]["description"]
    agent = Agent(
        name="lookup",
        instructions=None,
        tools=[lookup_number, python_code],
        model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
        model_settings=ModelSettings(),
    )
    try:
        result = await Runner.run(agent, item["question"], max_turns=max_turns)
    except AgentsException:  # out of turns, or a reply the SDK cannot use: the episode failed
        return 0.0
    return float(extract_answer(str(result.final_output)) == item["answer"])
