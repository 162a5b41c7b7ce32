"""The agent proxy and workflow: exact tokens over several turns, history edits, discounts, per-episode keys,
retries, malformed tool calls, weight updates mid-episode, through the real openai client over HTTP."""

import asyncio

import pytest

from asyncrl.agent.chat import ChatRenderer
from asyncrl.agent.proxy import AgentProxy
from asyncrl.agent.session import Episode
from asyncrl.agent.workflow import AgentWorkflow
from engines_for_tests import ScriptedEngine, agent_context

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {
    "key": {"type": "string"}}}}}]


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
    workflow = AgentWorkflow(agent_context(tokenizer), episode="agents_for_tests:tool_episode", client=client,
                             export=export, serve=serve)
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


def test_history_edit_starts_a_new_chain(tokenizer):
    proxy = AgentProxy(ChatRenderer(tokenizer, tokenizer.eos_token_id), agent_context(tokenizer).params, 512,
                       engine=ScriptedEngine(tokenizer, ["one", "two", "three"]))
    key = proxy.open()

    async def main():
        a = await proxy.chat(key, {"messages": [{"role": "user", "content": "q"}]})
        msg = a["choices"][0]["message"]
        await proxy.chat(key, {"messages": [{"role": "user", "content": "q"}, msg, {"role": "user", "content": "go"}]})
        await proxy.chat(key, {"messages": [{"role": "user", "content": "summary of q"}, {"role": "user", "content": "go"}]})

    asyncio.run(main())
    episode = proxy.close(key)
    assert [c.parent for c in episode.calls] == [None, 0, None] and episode.history_edits == 1
    assert len(episode.samples(1.0, "concat")) == 2 and len(episode.samples(1.0, "individual")) == 3


def test_rewards_flow_back_over_calls_with_the_discount(tokenizer):
    episode = Episode("k", None)
    from asyncrl.agent.session import Call

    episode.calls = [Call(f"id{i}", [], "[]", [1], None, 0, [2], [0.0], [0], "stop") for i in range(3)]
    assert episode.returns(10.0, gamma=0.9) == pytest.approx([8.1, 9.0, 10.0])
    assert episode.returns({"id0": 1.0, "id2": 2.0}, gamma=0.5) == pytest.approx([1.5, 1.0, 2.0])
    with pytest.raises(ValueError, match="unknown completion ids"):
        episode.returns({"nope": 1.0})


def test_a_retried_request_makes_one_sample(tokenizer):
    engine = ScriptedEngine(tokenizer, ["first", "second"])
    proxy = AgentProxy(ChatRenderer(tokenizer, tokenizer.eos_token_id), agent_context(tokenizer).params, 512,
                       engine=engine)
    key = proxy.open()
    body = {"messages": [{"role": "user", "content": "q"}], "max_tokens": 8}

    async def main():
        return await asyncio.gather(proxy.chat(key, body), proxy.chat(key, dict(body)))  # an SDK retry meanwhile

    first, again = asyncio.run(main())
    later = asyncio.run(proxy.chat(key, body))
    episode = proxy.close(key)
    assert first["id"] == again["id"] == later["id"] and len(episode.calls) == 1 and episode.retries == 2
    assert len(engine.received) == 1


def test_a_malformed_tool_call_is_counted_and_harmless(tokenizer):
    bad = '<tool_call>{"name": "lookup", "arguments": {"key": }</tool_call>'
    engine = ScriptedEngine(tokenizer, [bad])
    proxy = AgentProxy(ChatRenderer(tokenizer, tokenizer.eos_token_id), agent_context(tokenizer).params, 512,
                       engine=engine)
    key = proxy.open()
    reply = asyncio.run(proxy.chat(key, {"messages": [{"role": "user", "content": "q"}], "tools": TOOLS}))
    message = reply["choices"][0]["message"]
    assert "tool_calls" not in message and message["content"] == bad and reply["choices"][0]["finish_reason"] == "stop"
    assert proxy.tool_parse_errors == 1
    (sample,) = proxy.close(key).samples(0.0)
    assert sample.output_ids == engine.generated[0]  # the trained tokens are the engine's, whatever was parsed


def test_keys_isolate_episodes_over_http(tokenizer):
    pytest.importorskip("fastapi")
    import httpx

    from asyncrl.server.agent import build_app
    from asyncrl.server.app import ServerThread

    proxy = AgentProxy(ChatRenderer(tokenizer, tokenizer.eos_token_id), agent_context(tokenizer).params, 512,
                       engine=ScriptedEngine(tokenizer, ["hello"] * 4))
    server = ServerThread(build_app(proxy))
    try:
        a, b = proxy.open(), proxy.open()
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        url = server.url + "/v1/chat/completions"
        assert httpx.post(url, json=body).status_code == 401
        assert httpx.post(url, json=body, headers={"Authorization": "Bearer sk-guess"}).status_code == 401
        assert httpx.get(server.url + "/v1/models").status_code == 401
        r = httpx.post(url, json=body, headers={"Authorization": f"Bearer {a}"})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hello"
        assert len(proxy.episodes[a].calls) == 1 and not proxy.episodes[b].calls  # b sees nothing of a
        proxy.close(a)
        assert httpx.post(url, json=body, headers={"Authorization": f"Bearer {a}"}).status_code == 401
        bad = httpx.post(url, content=b"{not json", headers={"Authorization": f"Bearer {b}"})
        assert bad.status_code == 400 and "not JSON" in bad.json()["error"]["message"]
        huge = httpx.post(url, json={"messages": [{"role": "user", "content": "x" * (5 << 20)}]},
                          headers={"Authorization": f"Bearer {b}"})
        assert huge.status_code == 413
        too_long = httpx.post(url, json={"messages": [{"role": "user", "content": "7 " * 600}]},
                              headers={"Authorization": f"Bearer {b}"})
        assert too_long.status_code == 400 and "exceeds the context" in too_long.json()["error"]["message"]
    finally:
        server.close()


def test_a_non_loopback_proxy_needs_an_admin_key():
    from asyncrl import configlib
    from asyncrl.config import TrainConfig
    from asyncrl.configlib import ConfigError

    with pytest.raises(ConfigError, match="not loopback"):
        configlib.load(TrainConfig, None, ["workflow.name=agent", "agent.episode=agents_for_tests:tool_episode",
                                           "agent.proxy_host=0.0.0.0"])
    configlib.load(TrainConfig, None, ["workflow.name=agent", "agent.episode=agents_for_tests:tool_episode",
                                       "agent.proxy_host=0.0.0.0", "agent.admin_key=s3cret"])


def test_a_weight_update_during_an_episode_keeps_its_tokens_with_both_versions(tokenizer):
    """A weight update lands while the episode's second call decodes: the call is not aborted (the engine
    re-prefills), and its tokens carry both versions."""
    from asyncrl.engine.local import LocalEngine
    from asyncrl.models import build_tiny_model
    from asyncrl.types import WeightUpdate

    old = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128, seed=1)
    new = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128, seed=2)
    engine = LocalEngine(old, max_slots=4, max_len=512, stop_token_ids=(-1,)).start()  # never stops early
    context = agent_context(tokenizer, max_new_tokens=200)
    proxy = AgentProxy(ChatRenderer(tokenizer, tokenizer.eos_token_id), context.params, 512, engine=engine)
    key = proxy.open()

    async def main():
        first = await proxy.chat(key, {"messages": [{"role": "user", "content": "q"}], "max_tokens": 4})
        msgs = [{"role": "user", "content": "q"}, first["choices"][0]["message"], {"role": "user", "content": "more"}]
        second = asyncio.ensure_future(proxy.chat(key, {"messages": msgs}))
        while engine.stats().generated_tokens < 4 + 10:
            await asyncio.sleep(0.001)
        await asyncio.to_thread(engine.update_weights, WeightUpdate(1, state_dict=new.state_dict()))
        return await second

    try:
        asyncio.run(main())
    finally:
        engine.stop()
    first, second = proxy.close(key).samples(1.0)
    assert set(first.versions) == {0} and second.versions[0] == 0 and second.versions[-1] == 1
    assert len(second.output_ids) == 200 and second.finish_reason == "length"


def test_a_failing_episode_costs_only_itself(tokenizer):
    engine = ScriptedEngine(tokenizer, SCRIPT * 2)
    workflow = AgentWorkflow(agent_context(tokenizer, n=3), episode="agents_for_tests:sometimes_fails",
                             client="inprocess")
    group = asyncio.run(workflow.run({"id": 1, "question": "q"}, engine))
    stats = workflow.stats()
    assert stats["agent_episodes"] == 3 and stats["agent_episode_failures"] == 1 and len(group.trajectories) == 2
    with pytest.raises(RuntimeError, match="every episode"):
        asyncio.run(AgentWorkflow(agent_context(tokenizer), episode="agents_for_tests:always_fails", client="inprocess")
                    .run({"id": 2}, engine))


def test_standalone_proxy_in_asyncrl_serve(tiny_model_dir):
    """`asyncrl serve --agent-proxy`: the admin opens a session, an openai client talks to /agent/v1 with its
    key, and ending the session returns the recorded calls token for token."""
    openai = pytest.importorskip("openai")
    import httpx

    from asyncrl.engine.spawn import asyncrl_server

    server = asyncrl_server(tiny_model_dir, "--agent-proxy", "--admin-key", "adm", "--agent-max-tokens", "6")
    try:
        admin = {"Authorization": "Bearer adm"}
        assert httpx.post(server.url + "/agent/rl/sessions").status_code == 401
        key = httpx.post(server.url + "/agent/rl/sessions", headers=admin).json()["api_key"]

        async def talk():
            client = openai.AsyncOpenAI(base_url=server.url + "/agent/v1", api_key=key)
            first = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            msgs = [{"role": "user", "content": "hi"}, first.choices[0].message.model_dump(exclude_none=True),
                    {"role": "user", "content": "again"}]
            await client.chat.completions.create(model="m", messages=msgs)
            await client.close()

        asyncio.run(talk())
        calls = httpx.post(f"{server.url}/agent/rl/sessions/{key}/end", headers=admin).json()["calls"]
        assert len(calls) == 2 and calls[1]["parent"] == 0
        assert calls[1]["prompt_ids"][: len(calls[0]["prompt_ids"]) + len(calls[0]["output_ids"])] == \
            calls[0]["prompt_ids"] + calls[0]["output_ids"]
        assert all(len(c["output_ids"]) == len(c["logprobs"]) == len(c["versions"]) for c in calls)
        gone = httpx.post(server.url + "/agent/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                          headers={"Authorization": f"Bearer {key}"})
        assert gone.status_code == 401
    finally:
        server.close()
