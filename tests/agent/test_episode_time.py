"""Where an agent episode's time goes (AgentWorkflow's episode_*_s): an agent whose tools are instant spends
next to no time "in tools" even over HTTP (the proxy's and HTTP's time are their own phases), and a tool that
takes 0.1 s a call is counted as that."""

import asyncio
import gc
import time

import pytest

from asyncrl.agent.workflow import AgentWorkflow

from engines_for_tests import ScriptedEngine, agent_context
from timing_agents_for_tests import TOOL_S

CALL = '<tool_call>{"name": "lookup", "arguments": {"key": "a"}}</tool_call>'


class SlowScriptedEngine(ScriptedEngine):
    """Takes 20 ms a call, like a model generating."""

    async def generate(self, prompt_ids, params):
        await asyncio.sleep(0.02)
        return await super().generate(prompt_ids, params)


def _run(tokenizer, episode: str, client: str, items: int = 8) -> dict:
    if client == "openai":
        pytest.importorskip("openai")
        pytest.importorskip("fastapi")
    from asyncrl.server.agent import serve_proxy

    engine = SlowScriptedEngine(tokenizer, [CALL, CALL, "The answer is 42."] * items * 2)
    workflow = AgentWorkflow(
        agent_context(tokenizer, n=1), episode=f"timing_agents_for_tests:{episode}", client=client, serve=serve_proxy
    )

    async def all_items():  # one event loop, as the rollout thread has
        for i in range(items):
            await workflow.run({"id": i, "question": "What is 6 x 7?"}, engine)

    gc.collect()  # a full collection of the test process's heap (0.1-0.3 s) during the run lands in some phase
    gc.disable()
    try:
        asyncio.run(all_items())
    finally:
        gc.enable()
        workflow.close()
    return workflow.stats()


@pytest.mark.parametrize("client", ["openai", "inprocess"])
def test_instant_tools_cost_next_to_no_tool_time(tokenizer, client):
    stats = _run(tokenizer, "instant_tools", client)
    phases = {k: stats[f"episode_{k}_s"] for k in ("llm_queue", "llm_gen", "proxy", "http", "tool")}
    total = sum(phases.values())
    assert stats["agent_episodes"] == 8 and phases["llm_gen"] >= 8 * 3 * 0.02 * 0.9  # 3 calls of 20 ms each
    # what is left is the agent's own code (and its client's first use); before, tool time was the episode's
    # wall time minus the engine's, so the proxy's and HTTP's time counted as tools too
    assert phases["tool"] < 0.15 * total, phases
    assert phases["tool"] < 0.25 * (phases["tool"] + phases["http"] + phases["proxy"]) or client == "inprocess"
    assert stats["agent_tool_s"] == phases["tool"]
    if client == "openai":
        assert phases["http"] > 0
    else:
        assert phases["http"] == 0


@pytest.mark.parametrize("client", ["openai", "inprocess"])
def test_calls_made_at_once_are_not_counted_twice(tokenizer, client):
    """An episode's phases share its wall time: three overlapping 20 ms calls are not 60 ms of the episode."""
    t0 = time.monotonic()
    stats = _run(tokenizer, "parallel_calls", client)
    wall = time.monotonic() - t0
    phases = {k: stats[f"episode_{k}_s"] for k in ("llm_queue", "llm_gen", "proxy", "http", "tool")}
    assert stats["agent_episodes"] == 8 and phases["llm_gen"] > 0
    assert sum(phases.values()) <= wall, (phases, wall)


def test_a_slow_tool_is_counted_as_tool_time(tokenizer):
    stats = _run(tokenizer, "slow_tools", "openai")
    tool, expected = stats["episode_tool_s"], 8 * 2 * TOOL_S  # 8 episodes, 2 tool calls each
    assert expected * 0.9 <= tool <= expected * 1.5, stats
