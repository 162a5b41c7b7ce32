"""``asyncrl serve`` over real HTTP on 127.0.0.1 (asyncrl.server.app): the SGLang-native and OpenAI APIs,
interruption, bad requests, and a few hundred fuzzed requests that never get a 5xx."""

import asyncio
import json
import math
import random

import httpx
import pytest
import torch

from asyncrl.engine.local import LocalEngine
from asyncrl.models.hf import build_tiny_model
from asyncrl.server.app import ServerThread, build_app
from asyncrl.server.state import ServerState
from asyncrl.weights.wire import write_weights

from conftest import reference_logprobs
from servers_for_tests import greedy, serving


@pytest.fixture(scope="module")
def models(tokenizer):
    old = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128, seed=0).eval()
    new = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128, seed=1).eval()
    return old, new


@pytest.fixture
def server(models, tokenizer, tmp_path):
    """A fresh server (version 0, the old model) for each test; always shut down."""
    old, _ = models
    engine = LocalEngine(
        old, max_slots=8, max_len=600, stop_token_ids=(tokenizer.eos_token_id,), tokenizer=tokenizer
    ).start()
    http = ServerThread(build_app(ServerState(engine, tokenizer, "tiny", str(tmp_path))))
    try:
        yield http.url
    finally:
        http.close()
        engine.stop()


def _generate(url, ids, **sampling):
    r = httpx.post(
        f"{url}/generate", json={"input_ids": ids, "sampling_params": sampling, "return_logprob": True}, timeout=60
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_native_generate_greedy_matches_hf_with_logprobs_and_versions(server, models):
    old, _ = models
    prompt = [5, 17, 42, 99, 7]
    out = _generate(server, prompt, max_new_tokens=12, temperature=0, ignore_eos=True)
    ref = old.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0)[0, 5:].tolist()
    meta = out["meta_info"]
    ids = [t for _, t, _ in meta["output_token_logprobs"]]
    assert out["output_ids"] == ids == ref
    assert torch.allclose(
        torch.tensor([lp for lp, _, _ in meta["output_token_logprobs"]]),
        reference_logprobs(old, prompt, ref),
        atol=1e-4,
    )
    assert meta["finish_reason"] == {"type": "length", "length": 12} and meta["output_token_versions"] == [0] * 12
    assert meta["completion_tokens"] == 12 and meta["prompt_tokens"] == 5


def test_native_generate_n_samples_batches_and_text(server, tokenizer):
    group = _generate(server, [5, 6, 7], max_new_tokens=6, n=3, temperature=1.0, ignore_eos=True)
    assert isinstance(group, list) and len(group) == 3 and all(len(g["output_ids"]) == 6 for g in group)
    batch = _generate(server, [[5, 6, 7], [8, 9]], max_new_tokens=4, temperature=0, ignore_eos=True)
    assert len(batch) == 2 and all(len(b["output_ids"]) == 4 for b in batch)
    r = httpx.post(f"{server}/generate", json={"text": "Compute 3 + 4.", "sampling_params": {"max_new_tokens": 4}})
    assert r.status_code == 200 and r.json()["meta_info"]["prompt_tokens"] == len(tokenizer("Compute 3 + 4.").input_ids)


def test_stop_strings_end_a_sample_and_trim_the_text(server, tokenizer):
    prompt = tokenizer("Compute 12 + 30.").input_ids
    free = _generate(server, prompt, max_new_tokens=30, temperature=0, ignore_eos=True)
    text = tokenizer.decode(free["output_ids"], skip_special_tokens=True)
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert len(stop) == 2 and stop.strip(), f"need a visible stop string in {text!r}"
    out = _generate(server, prompt, max_new_tokens=30, temperature=0, ignore_eos=True, stop=[stop])
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    n = len(out["output_ids"])
    assert out["output_ids"] == free["output_ids"][:n] and n < 30
    assert stop in tokenizer.decode(out["output_ids"]) and stop not in tokenizer.decode(out["output_ids"][:-1])
    assert out["text"] == text[: text.index(stop)]


def test_openai_completions_and_chat(server, tokenizer, models):
    old, _ = models
    r = httpx.post(
        f"{server}/v1/completions",
        json={"model": "tiny", "prompt": [5, 17, 42], "max_tokens": 5, "temperature": 0, "logprobs": 0},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"]) <= 5
    assert torch.allclose(
        torch.tensor(choice["logprobs"]["token_logprobs"]),
        reference_logprobs(old, [5, 17, 42], choice["token_ids"]),
        atol=1e-4,
    )
    r = httpx.post(
        f"{server}/v1/chat/completions",
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "Compute 2 + 2."}],
            "max_tokens": 8,
            "n": 2,
            "logprobs": True,
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["choices"]) == 2 and body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == sum(len(c["logprobs"]["content"]) for c in body["choices"])
    assert httpx.get(f"{server}/v1/models").json()["data"][0]["id"] == "tiny"


def test_openai_seed_reproduces_a_sample_and_chat_without_max_tokens_gets_the_context_left(
    server, models, tokenizer, tmp_path
):
    def chat(server=server, **extra):
        r = httpx.post(
            f"{server}/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "Compute 2 + 2."}], "n": 3, **extra},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        return [c["message"]["content"] for c in r.json()["choices"]], r.json()["usage"]

    first, usage = chat(seed=7, max_tokens=12)
    assert chat(seed=7, max_tokens=12)[0] == first and chat(seed=8, max_tokens=12)[0] != first
    small = LocalEngine(models[0], max_slots=4, max_len=64, tokenizer=tokenizer).start()
    http = ServerThread(build_app(ServerState(small, tokenizer, "tiny", str(tmp_path))))
    try:  # no max_tokens on a 64-token server: what the context has left (a default of 256 was refused)
        _, usage = chat(server=http.url, n=1, temperature=0)
        assert usage["prompt_tokens"] + usage["completion_tokens"] <= 64
    finally:
        http.close()
        small.stop()
    r = httpx.post(
        f"{server}/v1/completions",
        json={"model": "tiny", "prompt": [5, 17], "max_tokens": 8, "seed": 3, "n": 2},
        timeout=60,
    )
    again = httpx.post(
        f"{server}/v1/completions",
        json={"model": "tiny", "prompt": [5, 17], "max_tokens": 8, "seed": 3, "n": 2},
        timeout=60,
    )
    assert [c["token_ids"] for c in r.json()["choices"]] == [c["token_ids"] for c in again.json()["choices"]]


@pytest.mark.parametrize(
    "body,status,needle",
    [
        (b"{not json", 422, ""),
        ({"sampling_params": {"max_new_tokens": 4}}, 400, "exactly one of input_ids and text"),
        ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -3}}, 422, "max_new_tokens"),
        ({"input_ids": [1, 2], "sampling_params": {"temperature": "hot"}}, 422, "temperature"),
        ({"input_ids": "abc"}, 422, "input_ids"),
        ({"input_ids": []}, 400, "empty"),
        ({"input_ids": [100000]}, 400, "token ids"),
        ({"input_ids": [1] * 590, "sampling_params": {"max_new_tokens": 20}}, 400, "max_len"),
        ({"input_ids": [1], "sampling_params": {"n": 99}}, 400, "slots"),
        ({"input_ids": [1], "sampling_params": {"stop": [""]}}, 400, "stop"),
    ],
)
def test_malformed_generate_requests_get_4xx(server, body, status, needle):
    raw = isinstance(body, bytes)
    kw = {"content": body, "headers": {"content-type": "application/json"}} if raw else {"json": body}
    r = httpx.post(f"{server}/generate", timeout=30, **kw)
    assert r.status_code == status and needle in r.text
    assert httpx.get(f"{server}/health").status_code == 200


def test_malformed_control_and_openai_requests_get_4xx(server, tmp_path):
    cases = [
        ("/v1/completions", {"prompt": [1, 2], "stream": True}, 400),
        ("/v1/completions", {"max_tokens": 3}, 422),
        ("/v1/chat/completions", {"messages": []}, 422),
        ("/pause_generation", {"mode": "sideways"}, 400),
        ("/update_weights_from_disk", {"model_path": str(tmp_path / "missing")}, 400),
        ("/update_weights_from_disk", {"model_path": str(tmp_path)}, 400),  # a directory without weights
        ("/update_weights_from_disk", {"model_path": str(tmp_path), "weight_version": "v2"}, 400),
        ("/update_weights_from_distributed", {"names": ["a"], "dtypes": ["float32"], "shapes": [[1]]}, 400),
        (
            "/init_weights_update_group",
            {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 0, "world_size": 2},
            422,
        ),
    ]
    for path, body, status in cases:
        r = httpx.post(f"{server}{path}", json=body, timeout=30)
        assert r.status_code == status, (path, body, r.status_code, r.text)
        assert r.json().get("error") or r.json().get("detail")
    assert _generate(server, [1, 2, 3], max_new_tokens=2)["meta_info"]["completion_tokens"] >= 1


async def _generate_async(url, ids, **sampling):
    async with httpx.AsyncClient(timeout=60) as client:
        r = await client.post(
            f"{url}/generate", json={"input_ids": ids, "sampling_params": sampling, "return_logprob": True}
        )
        assert r.status_code == 200, r.text
        return r.json()


async def _when_generating(url):
    """Wait until the server has decoded a few tokens (the request is in flight)."""
    async with httpx.AsyncClient(timeout=10) as client:
        for _ in range(2000):
            if (await client.get(f"{url}/get_server_info")).json()["generated_tokens"] >= 4:
                return
            await asyncio.sleep(0.002)
    raise AssertionError("generation never started")


def test_update_from_disk_mid_request_recomputes_and_continues(server, models, tmp_path):
    old, new = models
    path = write_weights(new.state_dict(), tmp_path, 1)
    prompt = [5, 17, 42, 99, 7]

    async def main():
        task = asyncio.ensure_future(
            _generate_async(server, prompt, max_new_tokens=580, temperature=0, ignore_eos=True)
        )
        await _when_generating(server)
        async with httpx.AsyncClient(timeout=60) as client:
            r = await client.post(
                f"{server}/update_weights_from_disk", json={"model_path": str(path), "weight_version": "1"}
            )
        assert r.status_code == 200 and r.json()["weight_version"] == "1", r.text
        return await task

    out = asyncio.run(main())
    meta = out["meta_info"]
    versions, ids = meta["output_token_versions"], out["output_ids"]
    k = versions.index(1)
    assert 0 < k < len(ids) and versions == [0] * k + [1] * (len(ids) - k)
    got = torch.tensor([lp for lp, _, _ in meta["output_token_logprobs"]])
    assert torch.allclose(got[:k], reference_logprobs(old, prompt, ids)[:k], atol=1e-4)
    assert torch.allclose(got[k:], reference_logprobs(new, prompt, ids)[k:], atol=1e-4)
    info = httpx.get(f"{server}/get_model_info").json()
    assert info["weight_version"] == "1"
    assert httpx.get(f"{server}/get_server_info").json()["interruptions"] == 1


def test_pause_abort_returns_partial_output_and_continue_resumes(server):
    async def main():
        task = asyncio.ensure_future(
            _generate_async(server, [3, 4, 5], max_new_tokens=590, temperature=1.0, ignore_eos=True)
        )
        await _when_generating(server)
        async with httpx.AsyncClient(timeout=30) as client:
            assert (await client.post(f"{server}/pause_generation", json={"mode": "abort"})).status_code == 200
            aborted = await task
            held = asyncio.ensure_future(_generate_async(server, [3, 4, 5], max_new_tokens=3, ignore_eos=True))
            await asyncio.sleep(0.3)
            assert not held.done()  # paused: queued, not served
            assert (await client.post(f"{server}/continue_generation")).status_code == 200
            return aborted, await held

    aborted, held = asyncio.run(main())
    meta = aborted["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and 0 < meta["completion_tokens"] < 590
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    assert held["meta_info"]["completion_tokens"] == 3


def test_pause_in_place_holds_running_requests(server):
    async def main():
        task = asyncio.ensure_future(_generate_async(server, [3, 4, 5], max_new_tokens=590, ignore_eos=True))
        await _when_generating(server)
        async with httpx.AsyncClient(timeout=30) as client:
            await client.post(f"{server}/pause_generation", json={"mode": "in_place"})
            before = (await client.get(f"{server}/get_server_info")).json()["generated_tokens"]
            await asyncio.sleep(0.3)
            after = (await client.get(f"{server}/get_server_info")).json()["generated_tokens"]
            assert not task.done() and after - before <= 2  # at most the step that was running
            await client.post(f"{server}/continue_generation")
        return await task

    out = asyncio.run(main())
    assert out["meta_info"]["finish_reason"]["type"] == "length" and out["meta_info"]["completion_tokens"] == 590


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_model(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128, seed=0).eval()


# ---- fuzz --------------------------------------------------------------------------------------------------
TEMPLATES = {
    "/generate": {
        "input_ids": [5, 6, 7],
        "text": "1 + 2",
        "return_logprob": True,
        "sampling_params": {
            "max_new_tokens": 4,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 5,
            "n": 2,
            "stop": ["=", "x"],
            "stop_token_ids": [3],
            "ignore_eos": False,
        },
    },
    "/v1/completions": {"prompt": "1 + 2", "max_tokens": 4, "temperature": 0, "n": 1, "logprobs": 1, "stop": "\n"},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "2 + 2?"}], "max_tokens": 4, "logprobs": True},
    "/pause_generation": {"mode": "in_place"},
    "/continue_generation": {},
    "/update_weights_from_disk": {"model_path": "WEIGHTS", "weight_version": "1"},
    "/init_weights_update_group": {
        "master_address": "127.0.0.1",
        "master_port": 1,
        "rank_offset": 1,
        "world_size": 2,
        "group_name": "g",
        "backend": "gloo",
    },
    "/update_weights_from_distributed": {
        "names": ["a"],
        "dtypes": ["float32"],
        "shapes": [[2, 3]],
        "weight_version": 2,
    },
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
    return {
        rng.choice(["mode", "n", "role", "content", "x"]): _random_value(rng, depth + 1)
        for _ in range(rng.randrange(3))
    }


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


def test_a_client_that_goes_away_frees_its_slots(models, tokenizer):
    """A client closing its connection mid-request (a timeout) stops the generation: its samples leave their
    slots at the next token instead of running to max_new_tokens, and the server goes on serving. The engine
    holds itself right after admitting the request (so that the count does not depend on this machine's speed)
    while the client leaves."""
    import socket
    import time
    from urllib.parse import urlparse

    with serving(models[0], tokenizer) as (url, state):
        engine = state.engine
        admit = engine._admit

        def admit_then_hold():
            admit()
            if engine._active:
                engine._paused = True  # as pause() does, from the engine's own thread: held after this step

        engine._admit = admit_then_hold

        def info_when(ready):
            for _ in range(1000):
                info = httpx.get(f"{url}/get_server_info").json()
                if ready(info):
                    return info
                time.sleep(0.01)
            raise AssertionError(info)

        address = urlparse(url)
        body = json.dumps(
            {"input_ids": [3, 4, 5], "sampling_params": {"n": 4, "max_new_tokens": 50, "ignore_eos": True}}
        ).encode()
        with socket.create_connection((address.hostname, address.port)) as sock:
            sock.sendall(
                b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            held = info_when(lambda info: info["paused"] and info["running"] == 4)
        assert info_when(lambda info: info["requests_cancelled"] == 1)["running"] == 4  # still in their slots
        engine._admit = admit
        assert httpx.post(f"{url}/continue_generation").status_code == 200
        info = info_when(lambda info: info["running"] == 0)
        assert info["generated_tokens"] <= held["generated_tokens"] + 4  # one more token each, then out
        assert _generate(url, [3, 4, 5], max_new_tokens=3, ignore_eos=True)["meta_info"]["completion_tokens"] == 3
        assert httpx.get(f"{url}/get_server_info").json()["requests_cancelled"] == 1
