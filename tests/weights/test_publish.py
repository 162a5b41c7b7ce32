"""Weight transports (asyncrl.weights.publish): in-process, disk and torch.distributed (gloo) broadcast to
engines and server processes; failures name the version; temporary directories go with their run."""

import asyncio
import contextlib
import os

import pytest
import torch

from asyncrl.api.weights import WeightSyncError
from asyncrl.engine.local import LocalEngine
from asyncrl.engine.remote import RemoteEngine
from asyncrl.engine.requests import NO_STOP_TOKENS
from asyncrl.engine.spawn import asyncrl_server
from asyncrl.models.hf import build_tiny_model, load_model
from asyncrl.types import SamplingParams
from asyncrl.weights.publish import DiskPublisher, DistPublisher, InProcessPublisher

from conftest import make_model


def _greedy(engine, prompt, n=8):
    ((c,),) = engine.generate_batch([prompt], SamplingParams(max_new_tokens=n, greedy=True))
    return c


def _hf_greedy(model, prompt, n=8):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


def test_disk_publisher_updates_a_local_engine_and_keeps_two_versions(tmp_path):
    old, new = make_model(seed=0), make_model(seed=1)
    engine = LocalEngine(old, max_slots=2, max_len=64)
    publisher = DiskPublisher([engine], str(tmp_path), keep=2)
    prompt = [3, 9, 27]
    for version, model in [(1, new), (2, old), (3, new)]:
        seconds = publisher.publish(model.state_dict(), version)
        assert seconds > 0 and engine.version == version
        c = _greedy(engine, prompt)
        assert c.output_ids == _hf_greedy(model, prompt) and c.versions == [version] * 8
    assert sorted(os.listdir(tmp_path)) == ["v000002", "v000003"]


def test_transport_failures_name_the_version(tmp_path):
    model = make_model()
    engine = LocalEngine(model, max_slots=2, max_len=64)
    partial = {k: v for k, v in model.state_dict().items() if "lm_head" not in k}
    with pytest.raises(WeightSyncError, match="version 4.*lm_head"):
        InProcessPublisher([engine]).publish(partial, 4)
    with pytest.raises(WeightSyncError, match="version 5.*lm_head"):
        DiskPublisher([engine], str(tmp_path)).publish(partial, 5)
    assert engine.version == 0  # the engine kept serving the old model
    engine.start().stop()
    with pytest.raises(WeightSyncError, match="version 6.*stopped"):
        InProcessPublisher([engine]).publish(model.state_dict(), 6)


def test_in_process_publish_to_a_running_engine_is_fast():
    old, new = make_model(seed=0), make_model(seed=1)
    engine = LocalEngine(old, max_slots=4, max_len=64).start()
    try:
        seconds = InProcessPublisher([engine], timeout_s=10).publish(new.state_dict(), 1)
        assert engine.version == 1 and seconds < 5
    finally:
        engine.stop()


@pytest.mark.slow
def test_dist_broadcast_to_a_server_process(tiny_model_dir, tokenizer, tmp_path):
    """gloo broadcast in small buckets from this process to an `asyncrl serve` process: greedy output afterwards
    is the new model's, every token tagged with the new version; a dead server fails the next publish loudly."""
    old = load_model(tiny_model_dir)
    new = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128, seed=5)
    server = asyncrl_server(tiny_model_dir, "--max-len", "128", "--threads", "1", log_path=str(tmp_path / "server.log"))
    engine = RemoteEngine([server.url]).start()
    publisher = DistPublisher([engine], backend="gloo", bucket_mb=1, timeout_s=30)
    prompt = [5, 17, 42, 99]
    params = SamplingParams(max_new_tokens=8, greedy=True, stop_token_ids=NO_STOP_TOKENS)
    try:
        (before,) = asyncio.run(engine.generate(prompt, params))
        assert before.output_ids == _hf_greedy(old, prompt)
        for version, model in [(1, new), (2, old), (3, new)]:
            publisher.publish(model.state_dict(), version)
            (after,) = asyncio.run(engine.generate(prompt, params))
            assert after.output_ids == _hf_greedy(model, prompt) and after.versions == [version] * 8
        server.kill()
        with pytest.raises(WeightSyncError, match="version 4"):
            publisher.publish(new.state_dict(), 4)
    finally:
        publisher.close()
        engine.stop()
        server.close()


def test_the_broadcast_group_follows_the_servers_that_take_each_update(monkeypatch):
    """The group is built again when the servers that take a version change (one retired, one back from a
    failed request's cool-down): a server left out of the group would keep serving old weights."""
    import asyncrl.weights.publish as publish

    monkeypatch.setattr(publish, "new_group", lambda *a, **k: "group")
    monkeypatch.setattr(publish, "broadcast", lambda *a, **k: None)

    class Fleet:
        addrs, posts = ["a", "b"], []

        def live_addrs(self):
            return list(self.addrs)

        def post(self, url, path, body=None, timeout=None):
            self.posts.append((url, path, (body or {}).get("weight_version")))
            return {}

        @contextlib.contextmanager
        def updating(self, version, timeout):
            yield list(self.addrs)

    fleet, state = Fleet(), {"w": torch.zeros(2)}
    publisher = DistPublisher([fleet], timeout_s=5)
    try:
        for version, addrs in [(1, ["a", "b"]), (2, ["a", "b"]), (3, ["a"]), (4, ["a", "b"])]:
            fleet.addrs = addrs
            publisher.publish(state, version)
            assert sorted(u for u, p, v in fleet.posts if v == str(version)) == addrs
    finally:
        publisher.close()
    joins = [u for u, p, _ in fleet.posts if p == "/init_weights_update_group"]
    assert joins == ["a", "b", "a", "a", "b"]


def test_temporary_weight_dirs_go_with_their_run_and_stale_ones_are_swept(tmp_path):
    import os
    import subprocess
    import sys

    from asyncrl.weights.publish import TEMP_PREFIX, DiskPublisher, sweep_stale_weight_dirs

    class Engine:
        def update_weights(self, update, timeout=None):
            self.path = update.path

    pub = DiskPublisher([Engine()])
    pub.publish({"w": torch.zeros(3)}, 1)
    mine = pub.weight_dir
    assert mine.name.startswith(f"{TEMP_PREFIX}{os.getpid()}-") and mine.exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = mine.parent / f"{TEMP_PREFIX}{int(dead.stdout)}-killedrun"
    stale.mkdir()
    assert stale in sweep_stale_weight_dirs() and not stale.exists() and mine.exists()  # a live run's stays
    pub.close()
    assert not mine.exists()
