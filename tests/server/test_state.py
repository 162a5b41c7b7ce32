"""``asyncrl serve`` under abuse: oversized and malformed requests, a weight-group join that cannot succeed,
SIGTERM, internal errors, bad weights and versions, bad start-up flags. Each test starts its own server on
127.0.0.1; every one of them must stay healthy (``/health`` within a second, meanwhile and afterwards)."""

import argparse
import asyncio
import json
import math
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
import torch

from asyncrl.engine.requests import VersionConflict
from asyncrl.engine.remote import RemoteEngine, ServerError
from asyncrl.engine.spawn import asyncrl_server, free_port
from asyncrl.models import build_tiny_model
from asyncrl.publish import write_weights
from asyncrl.server import cli
from asyncrl.server.limits import CHARS_PER_TOKEN, MAX_JSON_CONTAINERS, MAX_REQUEST_BYTES
from asyncrl.types import SamplingParams, WeightUpdate
from servers_for_tests import MAX_LEN, greedy, health_watch, serving


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_model(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128, seed=0).eval()


@pytest.fixture
def server(model, tokenizer):
    with serving(model, tokenizer) as s:
        yield s


# ---- size limits -------------------------------------------------------------------------------------------
def test_a_body_over_the_limit_gets_413_and_health_keeps_answering(server):
    """Over the size limit (declared or streamed) or the JSON container limit: 413 before parsing. Just under
    the size limit, the costliest JSON to parse (integers) is answered while ``/health`` still answers."""
    url, _ = server
    big = b'{"input_ids": [' + b"1, " * (MAX_REQUEST_BYTES // 3) + b"1]}"
    under = b'{"input_ids": [' + b"1," * (MAX_REQUEST_BYTES // 2 - 16) + b"1]}"
    lists = b'{"input_ids": [' + b"[1]," * (MAX_JSON_CONTAINERS + 1) + b"[1]]}"

    def chunked():
        for _ in range(9):
            yield b" " * (1 << 20)
        yield b'{"input_ids": [1]}'

    with health_watch(url) as times, httpx.Client(timeout=60) as client:
        declared = client.post(f"{url}/generate", content=big, headers={"content-type": "application/json"})
        streamed = client.post(f"{url}/generate", content=chunked(), headers={"content-type": "application/json"})
        nested = client.post(f"{url}/generate", content=lists, headers={"content-type": "application/json"})
        parsed = client.post(f"{url}/generate", content=under, headers={"content-type": "application/json"})
        after = client.post(f"{url}/generate", json={"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}})
    for r in (declared, streamed):
        assert r.status_code == 413 and "--max-request-bytes" in r.json()["error"]["message"], r.text
    assert nested.status_code == 413 and "arrays and objects" in nested.text
    assert parsed.status_code == 400 and "max_len" in parsed.text and len(under) <= MAX_REQUEST_BYTES
    assert after.status_code == 200
    assert max(times) < 1.0, times


def test_texts_over_the_character_bound_get_400_before_tokenising(server):
    url, _ = server
    huge = "Compute 12 + 30. " * (4 << 20 >> 4)  # 4 MB: ~10 s of tokenising, ~1 GB of memory
    cases = [("/generate", {"text": huge}, "text"),
             ("/generate", {"text": ["1 + 1", huge]}, "text[1]"),
             ("/v1/completions", {"prompt": huge}, "prompt"),
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": huge}]}, "messages")]
    with health_watch(url) as times:
        for path, body, field in cases:
            t0 = time.monotonic()
            r = httpx.post(f"{url}{path}", json=body, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["message"].startswith(field), (path, r.text)
            assert f"{MAX_LEN * CHARS_PER_TOKEN})" in r.text and time.monotonic() - t0 < 2.0
    assert max(times) < 1.0, times


# ---- weight update groups ----------------------------------------------------------------------------------
def test_a_join_with_an_unreachable_master_fails_within_the_group_timeout(model, tokenizer):
    with serving(model, tokenizer, group_timeout_s=1.5) as (url, state):
        body = {"master_address": "127.0.0.1", "master_port": free_port(), "rank_offset": 1, "world_size": 2,
                "group_name": "g"}
        answers = {}

        def call(name, path, payload, delay):
            time.sleep(delay)
            t0 = time.monotonic()
            answers[name] = (httpx.post(f"{url}{path}", json=payload, timeout=60), time.monotonic() - t0)

        calls = [threading.Thread(target=call, args=("init", "/init_weights_update_group", body, 0)),
                 threading.Thread(target=call, args=("destroy", "/destroy_weights_update_group", {}, 0.3))]
        with health_watch(url) as times:
            for t in calls:
                t.start()
            for t in calls:
                t.join()
        init, init_s = answers["init"]
        destroy, destroy_s = answers["destroy"]
        assert init.status_code == 400 and "127.0.0.1" in init.text and init_s < 1.5 + 1.0, (init.text, init_s)
        assert destroy.status_code == 200 and destroy_s < 0.5
        assert max(times) < 1.0, times
        r = httpx.post(f"{url}/update_weights_from_distributed", json={"names": ["a"], "dtypes": ["float32"],
                                                                       "shapes": [[1]]})
        assert r.status_code == 400 and "no weight update group" in r.text


# ---- shutting down -----------------------------------------------------------------------------------------
def test_sigterm_stops_a_busy_server_process_within_seconds(tmp_path):
    """A server generating and stuck joining a weight group exits with status 0 a few seconds after SIGTERM;
    both requests are answered with a 503."""
    server = asyncrl_server("builtin:tiny-sft", "--max-slots", "4", "--max-len", "2048", "--group-timeout", "60",
                            log_path=str(tmp_path / "server.log"))
    try:
        answers = {}

        def post(name, path, body):
            try:
                answers[name] = httpx.post(f"{server.url}{path}", json=body, timeout=60).status_code
            except httpx.HTTPError as e:
                answers[name] = type(e).__name__

        stuck = {"master_address": "127.0.0.1", "master_port": free_port(), "rank_offset": 1, "world_size": 2}
        long = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2000, "n": 4, "ignore_eos": True}}
        calls = [threading.Thread(target=post, args=("join", "/init_weights_update_group", stuck)),
                 threading.Thread(target=post, args=("generate", "/generate", long))]
        for t in calls:
            t.start()
        deadline = time.monotonic() + 30
        while httpx.get(f"{server.url}/get_server_info").json()["generated_tokens"] == 0:
            assert time.monotonic() < deadline, "generation never started"
            time.sleep(0.05)
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(timeout=15)
        assert code == 0 and time.monotonic() - t0 < 8.0
        for t in calls:
            t.join(timeout=30)
        assert answers == {"generate": 503, "join": 503}  # failed by the stopped engine; cancelled at the grace end
    finally:
        server.close()


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
        answers = [client.post("/generate", json={"input_ids": [7, 7, 7]}),  # 500
                   client.post("/generate", json={"input_ids": [10**9]}),  # 400
                   client.post("/generate", json={"input_ids": [True]}),  # 422
                   client.post("/generate", content=b"x" * (MAX_REQUEST_BYTES + 1))]  # 413
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


# ---- weights and versions ----------------------------------------------------------------------------------
def test_non_finite_weights_are_refused_and_the_old_model_keeps_serving(server, model, tmp_path):
    url, state = server
    before = greedy(url)
    nan = {k: torch.full_like(v, float("nan")) for k, v in model.state_dict().items()}
    path = write_weights(nan, tmp_path, 1)
    r = httpx.post(f"{url}/update_weights_from_disk", json={"model_path": str(path), "weight_version": 1},
                   timeout=60)
    assert r.status_code == 400 and "model.embed_tokens.weight" in r.text and "non-finite" in r.text
    assert state.engine.version == 0 and greedy(url) == before
    one_inf = dict(model.state_dict())
    one_inf["model.layers.1.mlp.down_proj.weight"] = one_inf["model.layers.1.mlp.down_proj.weight"].clone()
    one_inf["model.layers.1.mlp.down_proj.weight"][3, 5] = float("inf")
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.down_proj\.weight"):  # the in-process path
        state.engine.update_weights(WeightUpdate(2, state_dict=one_inf), timeout=30)
    assert state.engine.version == 0 and greedy(url) == before


def test_versions_never_decrease_and_stay_in_the_int64_range(server, model, tmp_path):
    url, state = server
    path = str(write_weights(model.state_dict(), tmp_path, 1))

    def load(version):
        body = {"model_path": path} if version is None else {"model_path": path, "weight_version": version}
        return httpx.post(f"{url}/update_weights_from_disk", json=body, timeout=60)

    steps = [(-5, 400, "2**63"), (10**30, 400, "2**63"), (str(2**63), 400, "2**63"), (7, 200, "7"),
             ("3", 409, "below the version 7"), (7, 200, "7"), (None, 200, "8")]
    for version, status, needle in steps:
        r = load(version)
        assert r.status_code == status and needle in r.text, (version, r.text)
    assert httpx.get(f"{url}/get_model_info").json()["weight_version"] == "8"

    answers = {}
    calls = [threading.Thread(target=lambda v=v: answers.__setitem__(v, load(v).status_code)) for v in range(10, 22)]
    for t in calls:
        t.start()
    for t in calls:
        t.join()
    assert set(answers.values()) <= {200, 409} and answers[21] == 200
    assert state.engine.version == 21
    with pytest.raises(VersionConflict):
        state.engine.update_weights(WeightUpdate(20, path=path))


# ---- fuzz --------------------------------------------------------------------------------------------------
TEMPLATES = {
    "/generate": {"input_ids": [5, 6, 7], "text": "1 + 2", "return_logprob": True, "sampling_params": {
        "max_new_tokens": 4, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "n": 2, "stop": ["=", "x"],
        "stop_token_ids": [3], "ignore_eos": False}},
    "/v1/completions": {"prompt": "1 + 2", "max_tokens": 4, "temperature": 0, "n": 1, "logprobs": 1, "stop": "\n"},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "2 + 2?"}], "max_tokens": 4, "logprobs": True},
    "/pause_generation": {"mode": "in_place"},
    "/continue_generation": {},
    "/update_weights_from_disk": {"model_path": "WEIGHTS", "weight_version": "1"},
    "/init_weights_update_group": {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1,
                                   "world_size": 2, "group_name": "g", "backend": "gloo"},
    "/update_weights_from_distributed": {"names": ["a"], "dtypes": ["float32"], "shapes": [[2, 3]],
                                         "weight_version": 2},
    "/destroy_weights_update_group": {"group_name": "g"},
}
GETS = ["/health", "/get_model_info", "/get_server_info", "/v1/models", "/openapi.json"]


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(12 if depth < 2 else 8)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 2, 7, 10**9, -(10**12), 2**63, 10**30])
    if kind == 3:
        return rng.choice([0.0, -0.5, 1e-30, 0.5, 1e300, math.nan, math.inf, -math.inf])
    if kind == 4:
        return rng.choice(["", "abc", "\ud800", "a\udfffb", "é中🙂", "abort", "gloo", "-1", "NaN", "x" * 5000])
    if kind in (5, 6, 7):
        return rng.choice([[1, 2, 3], [], [[]], [[1], [2, 3]], ["a", "b"], [True, False], [1.5], [None]])
    if kind in (8, 9):
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["mode", "n", "role", "content", "x"]): _random_value(rng, depth + 1)
            for _ in range(rng.randrange(3))}


def _mutated(rng: random.Random, template: dict) -> dict:
    body = json.loads(json.dumps(template))
    target = body["sampling_params"] if "sampling_params" in body and rng.random() < 0.5 else body
    for _ in range(rng.randrange(1, 4)):
        keys = list(target)
        if keys and rng.random() < 0.2:
            del target[rng.choice(keys)]
        elif keys:
            target[rng.choice(keys)] = _random_value(rng)
    return body


def _fuzz_body(rng: random.Random, path: str, weights: str) -> bytes:
    template = json.loads(json.dumps(TEMPLATES[path]).replace("WEIGHTS", weights))
    if path == "/generate":  # the template has both prompts: keep one, usually
        del template[rng.choice(["input_ids", "text"])]
    roll = rng.random()
    if roll < 0.1:
        return rng.choice([b"", b"{", b"[]", b"null", b'{"a": 1', b"\xff\xfe", b"[" * 5000, b'"\\ud800"'])
    if roll < 0.25:
        return json.dumps(_random_value(rng)).encode()
    return json.dumps(template if roll < 0.35 else _mutated(rng, template)).encode()


def test_fuzzed_requests_never_get_a_5xx(model, tokenizer, tmp_path):
    """A few hundred random and malformed bodies (seeded) to every endpoint: each gets a 2xx or a 4xx, never a
    5xx, and the server is healthy and generating afterwards."""
    weights = str(write_weights(model.state_dict(), tmp_path, 1))
    rng = random.Random(1234)
    with serving(model, tokenizer, group_timeout_s=0.5) as (url, state), httpx.Client(timeout=60) as client:
        for i in range(300):
            path = rng.choice(list(TEMPLATES) + GETS[:2])
            if path in GETS:
                r = client.get(f"{url}{path}")
            else:
                body = _fuzz_body(rng, path, weights)
                r = client.post(f"{url}{path}", content=body, headers={"content-type": "application/json"})
            assert r.status_code < 500, (i, path, body, r.status_code, r.text)
            if r.status_code >= 400:
                assert r.json()["error"]["message"], (path, r.text)
            if path == "/pause_generation":
                client.post(f"{url}/continue_generation")
        for path in GETS:
            assert client.get(f"{url}{path}").status_code == 200, path
        assert state.internal_errors == 0 and len(greedy(url)) == 6


# ---- start-up ----------------------------------------------------------------------------------------------
def _run(capsys, *flags: str) -> tuple[int, list[str]]:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    code = cli.run(parser.parse_args(["--port", str(free_port()), *flags]))
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("flags,needle", [
    (["--max-slots", "0"], "--max-slots"),
    (["--max-len", "0"], "--max-len"),
    (["--max-len", "1"], "--max-len"),
    (["--port", "70000"], "--port"),
    (["--threads", "0"], "--threads"),
    (["--weight-version", "-1"], "--weight-version"),
    (["--max-request-bytes", "10"], "--max-request-bytes"),
    (["--group-timeout", "0"], "--group-timeout"),
    (["--update-timeout", "nan"], "--update-timeout"),
    (["--max-len", "100000"], "lower --max-len or --max-slots"),
])
def test_bad_flags_are_refused_in_one_line(capsys, monkeypatch, flags, needle):
    monkeypatch.setattr("asyncrl.server.state.physical_memory", lambda: 16 << 30)
    code, lines = _run(capsys, "--model", "builtin:tiny-sft", *flags)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("asyncrl serve: error: ") and needle in lines[0]


def test_bad_model_paths_are_refused_in_one_line(capsys, tmp_path):
    for model, needle in [(str(tmp_path / "missing"), "does not exist"), (str(tmp_path), "config.json"),
                          ("builtin:nope", "no built-in model")]:
        code, lines = _run(capsys, "--model", model)
        assert code == 2 and len(lines) == 1 and needle in lines[0], lines


def test_a_port_in_use_is_refused_in_one_line(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        code, lines = _run(capsys, "--model", "builtin:tiny-sft", "--port", port)
    assert code == 2 and len(lines) == 1 and f"cannot listen on 127.0.0.1:{port}" in lines[0], lines


def test_the_cli_module_imports_and_explains_without_the_serve_extra():
    script = ("import argparse, sys\n"
              "sys.modules.update(fastapi=None, uvicorn=None, pydantic=None, starlette=None)\n"
              "from asyncrl.server.cli import add_arguments, run\n"
              "p = argparse.ArgumentParser()\n"
              "add_arguments(p)\n"
              "sys.exit(run(p.parse_args(['--model', 'builtin:tiny-sft'])))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("asyncrl serve: error: needs the 'serve' extra (fastapi, uvicorn): "
                           "pip install 'asyncrl[serve]'\n")
