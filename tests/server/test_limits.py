"""What one request may ask of ``asyncrl serve`` (asyncrl.server.limits): a body over the size limit gets a 413 and a
text over the character bound a 400 before it is tokenised, while /health keeps answering."""

import time

import httpx
import pytest

from asyncrl.models.hf import build_tiny_model
from asyncrl.server.limits import CHARS_PER_TOKEN, MAX_JSON_CONTAINERS, MAX_REQUEST_BYTES

from servers_for_tests import HEALTH_BOUND_S, MAX_LEN, health_watch, serving
from timing_for_tests import loaded


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
    assert max(times) < loaded(HEALTH_BOUND_S), times


def test_texts_over_the_character_bound_get_400_before_tokenising(server):
    url, _ = server
    huge = "Compute 12 + 30. " * (4 << 20 >> 4)  # 4 MB: ~10 s of tokenising, ~1 GB of memory
    cases = [
        ("/generate", {"text": huge}, "text"),
        ("/generate", {"text": ["1 + 1", huge]}, "text[1]"),
        ("/v1/completions", {"prompt": huge}, "prompt"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": huge}]}, "messages"),
    ]
    with health_watch(url) as times:
        for path, body, field in cases:
            t0 = time.monotonic()
            r = httpx.post(f"{url}{path}", json=body, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["message"].startswith(field), (path, r.text)
            assert f"{MAX_LEN * CHARS_PER_TOKEN})" in r.text and time.monotonic() - t0 < loaded(2.0)
    assert max(times) < loaded(HEALTH_BOUND_S), times
