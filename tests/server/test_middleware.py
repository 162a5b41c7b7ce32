"""``asyncrl serve``'s middleware (asyncrl.server.middleware): errors keep the connection open, and a 5xx does not
retire the server in the remote client."""

import asyncio

import httpx
import pytest

from asyncrl.engine.fleet import ServerError
from asyncrl.engine.remote import RemoteEngine
from asyncrl.models.hf import build_tiny_model
from asyncrl.server.limits import MAX_REQUEST_BYTES
from asyncrl.types import SamplingParams

from servers_for_tests import serving
from timing_for_tests import loaded


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_model(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128, seed=0).eval()


@pytest.fixture
def server(model, tokenizer):
    with serving(model, tokenizer) as s:
        yield s


# ---- internal errors ---------------------------------------------------------------------------------------
def test_errors_keep_the_connection_and_a_5xx_does_not_retire_the_server(server, monkeypatch):
    url, state = server
    real = state.generate

    async def failing(prompts, params):  # the test hook: one prompt breaks the server's code
        if prompts == [[7, 7, 7]]:
            raise RuntimeError("broken on purpose")
        return await real(prompts, params)

    monkeypatch.setattr(state, "generate", failing)
    with httpx.Client(base_url=url, timeout=60) as client:

        def local_port():
            return client.get("/health").extensions["network_stream"].get_extra_info("client_addr")

        first = local_port()
        answers = [
            client.post("/generate", json={"input_ids": [7, 7, 7]}),  # 500
            client.post("/generate", json={"input_ids": [10**9]}),  # 400
            client.post("/generate", json={"input_ids": [True]}),  # 422
            client.post("/generate", content=b"x" * (MAX_REQUEST_BYTES + 1)),
        ]  # 413
        assert [r.status_code for r in answers] == [500, 400, 422, 413]
        assert answers[0].json()["error"] == {"message": "RuntimeError: broken on purpose", "type": "internal_error"}
        assert local_port() == first  # one connection all along: no answer closed it
    assert httpx.get(f"{url}/get_server_info").json()["internal_errors"] == 1

    engine = RemoteEngine([url], max_attempts=2, dead_cooldown_s=60, request_timeout_s=10).start()
    try:
        params = SamplingParams(max_new_tokens=3, greedy=True)
        with pytest.raises(ServerError, match="broken on purpose"):
            asyncio.run(engine.generate([7, 7, 7], params))
        assert engine.live_addrs() == [url]  # an error of that request, not of the server
        (c,) = asyncio.run(engine.generate([5, 6, 7], params))
        assert len(c.output_ids) == 3
    finally:
        engine.stop()


def test_with_an_admin_key_the_engine_routes_need_it(model, tokenizer):
    """A server with --admin-key: generating, pausing and loading weights need the key (/health does not), and
    the remote client sends it when given one (rollout.server_key_env)."""
    with serving(model, tokenizer, admin_key="adm") as (url, _):
        body = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}}
        for path in ("/generate", "/pause_generation", "/update_weights_from_disk", "/v1/chat/completions"):
            r = httpx.post(url + path, json=body)
            assert r.status_code == 401 and "admin key" in r.text, (path, r.text)
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.post(url + "/generate", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.post(url + "/generate", json=body, headers={"Authorization": "Bearer adm"}).status_code == 200
        engine = RemoteEngine([url], api_key="adm").start()
        try:
            out = asyncio.run(engine.generate([5, 6], SamplingParams(max_new_tokens=2)))
            assert len(out[0].output_ids) == 2
        finally:
            engine.stop()


def test_slow_headers_and_stalled_bodies_lose_their_connection(model, tokenizer, monkeypatch):
    """A client that never finishes its headers, or stops sending its body, no longer holds a connection for ever
    (10 such connections were held 45 s): the headers get HEADER_TIMEOUT_S, a silent body BODY_STALL_S (408)."""
    import socket
    import time

    from asyncrl.server.app import HeaderTimeout
    from asyncrl.server.middleware import BodyLimit

    monkeypatch.setattr(HeaderTimeout, "timeout_s", 1.0)
    monkeypatch.setattr(BodyLimit.__init__, "__defaults__", (1.0,))
    with serving(model, tokenizer) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        slow = socket.create_connection((host, int(port)))
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # no blank line: the headers never end
        stalled = socket.create_connection((host, int(port)))
        stalled.sendall(
            b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"input_ids": ['
        )
        t0 = time.monotonic()
        for s in (slow, stalled):
            s.settimeout(20)
            data = b""
            while chunk := s.recv(4096):
                data += chunk
            s.close()
            if s is stalled:
                assert b" 408 " in data.split(b"\r\n")[0], data[:200]
            else:
                assert data == b""  # closed without an answer
        assert time.monotonic() - t0 < loaded(10)
        assert httpx.get(url + "/health").status_code == 200  # the server is fine
