"""What ``asyncrl serve`` holds between requests (asyncrl.server.state): a weight-group join with an unreachable master
fails within the group timeout, non-finite weights are refused while the old model keeps serving, and versions
never decrease and stay in the int64 range."""

import threading
import time

import httpx
import pytest
import torch

from asyncrl.engine.requests import VersionConflict
from asyncrl.engine.spawn import free_port
from asyncrl.models.hf import build_tiny_model
from asyncrl.types import WeightUpdate
from asyncrl.weights.wire import write_weights

from servers_for_tests import HEALTH_BOUND_S, greedy, health_watch, serving
from timing_for_tests import loaded


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_model(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128, seed=0).eval()


@pytest.fixture
def server(model, tokenizer):
    with serving(model, tokenizer) as s:
        yield s


# ---- weight update groups ----------------------------------------------------------------------------------
def test_a_join_with_an_unreachable_master_fails_within_the_group_timeout(model, tokenizer):
    with serving(model, tokenizer, group_timeout_s=1.5) as (url, state):
        body = {
            "master_address": "127.0.0.1",
            "master_port": free_port(),
            "rank_offset": 1,
            "world_size": 2,
            "group_name": "g",
        }
        answers = {}

        def call(name, path, payload, delay):
            time.sleep(delay)
            t0 = time.monotonic()
            answers[name] = (httpx.post(f"{url}{path}", json=payload, timeout=60), time.monotonic() - t0)

        calls = [
            threading.Thread(target=call, args=("init", "/init_weights_update_group", body, 0)),
            threading.Thread(target=call, args=("destroy", "/destroy_weights_update_group", {}, 0.3)),
        ]
        with health_watch(url) as times:
            for t in calls:
                t.start()
            for t in calls:
                t.join()
        init, init_s = answers["init"]
        destroy, destroy_s = answers["destroy"]
        assert init.status_code == 400 and "127.0.0.1" in init.text and init_s < 1.5 + 1.0, (init.text, init_s)
        assert destroy.status_code == 200 and destroy_s < 0.5
        assert max(times) < loaded(HEALTH_BOUND_S), times
        name, shape = next(iter(state.engine.weight_shapes.items()))  # a real tensor: it gets as far as the group
        r = httpx.post(
            f"{url}/update_weights_from_distributed",
            json={"names": [name], "dtypes": ["float32"], "shapes": [list(shape)]},
        )
        assert r.status_code == 400 and "no weight update group" in r.text


# ---- weights and versions ----------------------------------------------------------------------------------
def test_non_finite_weights_are_refused_and_the_old_model_keeps_serving(server, model, tmp_path):
    url, state = server
    before = greedy(url)
    nan = {k: torch.full_like(v, float("nan")) for k, v in model.state_dict().items()}
    path = write_weights(nan, tmp_path, 1)
    r = httpx.post(f"{url}/update_weights_from_disk", json={"model_path": str(path), "weight_version": 1}, timeout=60)
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

    steps = [
        (-5, 400, "2**63"),
        (10**30, 400, "2**63"),
        (str(2**63), 400, "2**63"),
        (7, 200, "7"),
        ("3", 409, "below the version 7"),
        (7, 200, "7"),
        (None, 200, "8"),
    ]
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
