"""AgentWorkflow and the agent section (asyncrl.agent.workflow): three turns with tool calls train exactly the engine's
tokens, through the real openai client over HTTP and in process, exported per call or concatenated; a failing
episode costs only itself; a proxy off loopback needs an admin key."""

import asyncio

import pytest

from asyncrl.agent.workflow import AgentWorkflow

from engines_for_tests import ScriptedEngine, agent_context


def _call(key, value):
    return f'<tool_call>{{"name": "lookup", "arguments": {{"key": "{key}"}}}}</tool_call>'


SCRIPT = [_call("a", 1), _call("b", 2) + _call("cc", 3), "The answer is 42."]


@pytest.mark.parametrize("client", ["openai", "inprocess"])
@pytest.mark.parametrize("export", ["individual", "concat"])
def test_three_turns_with_tool_calls_train_the_exact_engine_tokens(tokenizer, client, export):
    if client == "openai":
        pytest.importorskip("openai")
        pytest.importorskip("fastapi")
    engine = ScriptedEngine(tokenizer, SCRIPT)
    serve = None
    if client == "openai":
        from asyncrl.server.agent import serve_proxy as serve
    workflow = AgentWorkflow(
        agent_context(tokenizer), episode="agents_for_tests:tool_episode", client=client, export=export, serve=serve
    )
    try:
        group = asyncio.run(workflow.run({"id": 7, "question": "What is 6 x 7?"}, engine))
    finally:
        workflow.close()
    received, generated = engine.received, engine.generated
    assert len(received) == 3
    for k in (1, 2):  # every prompt continues the previous prompt + output token for token
        assert received[k][: len(received[k - 1]) + len(generated[k - 1])] == received[k - 1] + generated[k - 1]
    if export == "individual":
        assert [t.prompt_ids for t in group.trajectories] == received
        assert [t.output_ids for t in group.trajectories] == generated
        assert [t.reward for t in group.trajectories] == [1.0, 1.0, 1.0]  # the outcome flows back (γ = 1)
    else:
        (t,) = group.trajectories
        assert t.prompt_ids == received[0] and t.prompt_ids + t.output_ids == received[2] + generated[2]
        trained = [tok for tok, m in zip(t.output_ids, t.loss_mask) if m]
        assert trained == generated[0] + generated[1] + generated[2]  # only the engine's tokens train
        assert all(v == -1 for v, m in zip(t.versions, t.loss_mask) if not m)
    assert workflow.stats()["agent_tool_parse_errors"] == 0


def test_a_non_loopback_proxy_needs_an_admin_key():
    from asyncrl import configlib
    from asyncrl.config import TrainConfig
    from asyncrl.configlib import ConfigError

    with pytest.raises(ConfigError, match="not loopback"):
        configlib.load(
            TrainConfig,
            None,
            ["workflow.name=agent", "agent.episode=agents_for_tests:tool_episode", "agent.proxy_host=0.0.0.0"],
        )
    configlib.load(
        TrainConfig,
        None,
        [
            "workflow.name=agent",
            "agent.episode=agents_for_tests:tool_episode",
            "agent.proxy_host=0.0.0.0",
            "agent.admin_key=s3cret",
        ],
    )


def test_a_non_finite_reward_costs_only_its_episode(tokenizer):
    """A NaN outcome failed the whole group later (the group's check): it is that episode's failure now."""
    workflow = AgentWorkflow(
        agent_context(tokenizer, n=3), episode="agents_for_tests:sometimes_nan", client="inprocess"
    )
    group = asyncio.run(workflow.run({"id": 1, "question": "q"}, ScriptedEngine(tokenizer, SCRIPT * 2)))
    assert workflow.stats()["agent_episode_failures"] == 1 and len(group.trajectories) == 2


def test_an_episode_timeout_must_fit_in_the_groups(tmp_path):
    """rollout.request_timeout_s bounds the whole group: a longer agent.timeout_s let one slow episode cancel the
    others (counted as a rollout failure, which can stop the run)."""
    from asyncrl import configlib
    from asyncrl.config import TrainConfig
    from asyncrl.configlib import ConfigError

    agent = ["workflow.name=agent", "agent.episode=agents_for_tests:tool_episode"]
    with pytest.raises(ConfigError, match="agent.timeout_s=900 must be below rollout.request_timeout_s=600"):
        configlib.load(TrainConfig, None, agent + ["agent.timeout_s=900"])
    configlib.load(TrainConfig, None, agent + ["agent.timeout_s=900", "rollout.request_timeout_s=1200"])


def test_a_failing_episode_costs_only_itself(tokenizer):
    engine = ScriptedEngine(tokenizer, SCRIPT * 2)
    workflow = AgentWorkflow(
        agent_context(tokenizer, n=3), episode="agents_for_tests:sometimes_fails", client="inprocess"
    )
    group = asyncio.run(workflow.run({"id": 1, "question": "q"}, engine))
    stats = workflow.stats()
    assert stats["agent_episodes"] == 3 and stats["agent_episode_failures"] == 1 and len(group.trajectories) == 2
    with pytest.raises(RuntimeError, match="every episode"):
        asyncio.run(
            AgentWorkflow(agent_context(tokenizer), episode="agents_for_tests:always_fails", client="inprocess").run(
                {"id": 2}, engine
            )
        )


def test_held_out_evaluation_uses_the_training_client_over_http(tokenizer):
    """An episode that needs a real client (it reads client.base_url, as the Agents SDK example does) evaluated
    to 0 through the in-process client; with agent.client=openai evaluation goes over HTTP like training."""
    pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    from asyncrl.server.agent import serve_proxy

    context = agent_context(tokenizer)
    workflow = AgentWorkflow(context, episode="agents_for_tests:needs_base_url", client="openai", serve=serve_proxy)
    try:
        record = workflow.evaluate(
            ScriptedEngine(tokenizer, ["yes"] * 8), [{"question": "q"}] * 3, tokenizer, context.params
        )
    finally:
        workflow.close()
    assert record["eval_episode_failures"] == 0 and record["eval_accuracy"] == 1.0


def test_evaluation_reads_per_choice_rewards_drops_tool_latency_and_the_sdks_placeholders(tokenizer):
    """A documented reward ({id: [r0, r1]}) scored 0 in evaluation (TypeError); the simulated tool latency slowed
    every held-out episode; the in-process client sent openai.NOT_GIVEN on to the proxy (a 400)."""
    pytest.importorskip("openai")
    context = agent_context(tokenizer)
    workflow = AgentWorkflow(
        context, episode="agents_for_tests:two_choices_no_latency", client="inprocess", options={"tool_latency_s": 0.5}
    )
    try:
        record = workflow.evaluate(
            ScriptedEngine(tokenizer, ["a", "b"] * 3),
            [{"question": "q", "evaluation": 1}] * 3,
            tokenizer,
            context.params,
        )
    finally:
        workflow.close()
    assert record["eval_episode_failures"] == 0 and record["eval_reward_mean"] == 1.0
