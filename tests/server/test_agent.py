"""The agent proxy over HTTP (asyncrl.server.agent): keys isolate episodes, and `asyncrl serve --agent-proxy` records an
openai client's calls token for token."""

import asyncio

import pytest

from asyncrl.agent.chat import ChatRenderer
from asyncrl.agent.proxy import AgentProxy
from engines_for_tests import ScriptedEngine, agent_context


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


@pytest.mark.slow
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
