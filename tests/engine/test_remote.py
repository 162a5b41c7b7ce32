"""The remote engine client (asyncrl.engine.remote) against real ``asyncrl serve`` servers on 127.0.0.1, and a run
with two servers that survives losing one."""

import asyncio
import time

import httpx
import pytest
import torch

from asyncrl.api.weights import WeightSyncError
from asyncrl.engine.fleet import RequestRejected, ServerError
from asyncrl.engine.local import LocalEngine
from asyncrl.engine.remote import RemoteEngine
from asyncrl.engine.spawn import asyncrl_server
from asyncrl.models.hf import build_tiny_model, load_model
from asyncrl.server.app import ServerThread, build_app
from asyncrl.server.state import ServerState
from asyncrl.types import SamplingParams, WeightUpdate
from asyncrl.weights.publish import DiskPublisher

from conftest import reference_logprobs
from timing_for_tests import loaded


@pytest.fixture(scope="module")
def models(tokenizer):
    return tuple(
        build_tiny_model(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128, seed=s).eval() for s in (0, 1)
    )


class _Servers:
    """In-process servers of one model, each with its own engine thread."""

    def __init__(self, model, n, **engine_kw):
        self.engines = [LocalEngine(model, max_slots=8, max_len=200, **engine_kw).start() for _ in range(n)]
        self.http = [ServerThread(build_app(ServerState(e, None, "tiny", "-"))) for e in self.engines]
        self.urls = [h.url for h in self.http]

    def close(self):
        for h in self.http:
            h.close()
        for e in self.engines:
            e.stop()


@pytest.fixture
def two_servers(models):
    servers = _Servers(models[0], 2)
    try:
        yield servers
    finally:
        servers.close()


def _prompts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 300, (int(l),), generator=g).tolist() for l in torch.randint(3, 12, (n,), generator=g)]


def _run(engine, prompts, params):
    async def main():
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

    return asyncio.run(main())


def test_greedy_through_two_servers_equals_the_local_engine(two_servers, models):
    engine = RemoteEngine(two_servers.urls).start()
    try:
        prompts = _prompts(12)
        params = SamplingParams(n=2, max_new_tokens=10, greedy=True)
        remote = _run(engine, prompts, params)
        local = LocalEngine(models[0], max_slots=8, max_len=200).generate_batch(prompts, params)
        for r, l in zip(remote, local):
            assert [c.output_ids for c in r] == [c.output_ids for c in l]
            assert all(
                torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5) for a, b in zip(r, l)
            )
            assert all(c.versions == [0] * 10 and c.prompt_ids == l[0].prompt_ids for c in r)
        # least-outstanding routing spread the concurrent requests over both servers
        served = [httpx.get(f"{u}/get_server_info").json()["requests_completed"] for u in two_servers.urls]
        assert sum(served) == len(prompts) and min(served) >= 3
        assert engine.stats().generated_tokens == 12 * 2 * 10
    finally:
        engine.stop()


def test_sampled_logprobs_through_the_client_match_a_forward(two_servers, models):
    engine = RemoteEngine(two_servers.urls).start()
    try:
        prompt = _prompts(1, seed=4)[0]
        (group,) = _run(engine, [prompt], SamplingParams(n=3, max_new_tokens=8, temperature=0.8))
        for c in group:
            ref = reference_logprobs(models[0], prompt, c.output_ids, temperature=0.8)
            assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)
    finally:
        engine.stop()


@pytest.mark.parametrize("mode", ["abort", "recompute"])
def test_weight_update_mid_run_through_the_client(two_servers, models, tmp_path, mode):
    """Long requests in flight; a disk publish lands; every sample continues under the new weights, and every
    token's log-prob matches a fresh forward of the version that produced it."""
    old, new = models
    engine = RemoteEngine(two_servers.urls, interrupt_mode=mode).start()
    publisher = DiskPublisher([engine], str(tmp_path / "w"))
    prompts = _prompts(4, seed=2)
    params = SamplingParams(n=2, max_new_tokens=180, temperature=1.0)
    try:

        async def main():
            tasks = [asyncio.ensure_future(engine.generate(p, params)) for p in prompts]
            while engine.stats().busy_s == 0 or _generated(two_servers) < 16:
                await asyncio.sleep(0.002)
            await asyncio.to_thread(publisher.publish, new.state_dict(), 1)
            return await asyncio.gather(*tasks)

        groups = asyncio.run(main())
        assert engine.version == 1
        spanning = 0
        for prompt, group in zip(prompts, groups):
            for c in group:
                assert len(c.output_ids) == 180 and c.finish_reason == "length"
                assert c.versions == sorted(c.versions) and set(c.versions) <= {0, 1}
                k = c.versions.index(1) if 1 in c.versions else len(c.versions)
                spanning += 0 < k < 180
                got = torch.tensor(c.logprobs)
                assert torch.allclose(got[:k], reference_logprobs(old, prompt, c.output_ids)[:k], atol=1e-4)
                assert torch.allclose(got[k:], reference_logprobs(new, prompt, c.output_ids)[k:], atol=1e-4)
        assert spanning >= 4  # the update really landed mid-generation
        if mode == "abort":
            assert engine.stats().interruptions >= 4
        (after,) = _run(engine, [prompts[0]], SamplingParams(max_new_tokens=8, greedy=True))
        ref = new.generate(torch.tensor([prompts[0]]), max_new_tokens=8, do_sample=False, pad_token_id=0)
        assert after[0].output_ids == ref[0, len(prompts[0]) :].tolist() and after[0].versions == [1] * 8
    finally:
        publisher.close()
        engine.stop()


def _generated(servers):
    return sum(e.stats().generated_tokens for e in servers.engines)


def test_pause_and_resume_hold_generation(two_servers):
    engine = RemoteEngine(two_servers.urls).start()
    try:

        async def main():
            engine.pause()
            task = asyncio.ensure_future(engine.generate([5, 6, 7], SamplingParams(max_new_tokens=4, greedy=True)))
            await asyncio.sleep(0.3)
            assert not task.done()
            await asyncio.to_thread(engine.resume)
            return await asyncio.wait_for(task, 30)

        (c,) = asyncio.run(main())
        assert len(c.output_ids) == 4
    finally:
        engine.stop()


def test_malformed_request_is_rejected_not_retried(two_servers):
    engine = RemoteEngine(two_servers.urls).start()
    try:
        with pytest.raises(RequestRejected, match="max_len"):
            _run(engine, [[5] * 190], SamplingParams(max_new_tokens=50))
        with pytest.raises(ValueError, match="in-memory state dict"):
            engine.update_weights(WeightUpdate(1, state_dict={}))
    finally:
        engine.stop()


def test_a_hung_server_times_out_and_the_request_moves(two_servers):
    """A server that accepts connections but never answers: the request times out there and completes on
    the other server."""
    from fastapi import FastAPI

    hung = FastAPI()

    @hung.get("/health")
    async def health():
        return {}

    @hung.post("/generate")
    async def never():
        await asyncio.sleep(3600)

    http = ServerThread(hung)
    engine = RemoteEngine([http.url, two_servers.urls[0]], request_timeout_s=1.0, dead_cooldown_s=60).start()
    try:
        t0 = time.monotonic()
        results = _run(engine, _prompts(2), SamplingParams(max_new_tokens=5, greedy=True))
        assert all(len(c.output_ids) == 5 for (c,) in results) and time.monotonic() - t0 < loaded(10)
        hung_only = RemoteEngine([http.url], request_timeout_s=0.5).start()
        with pytest.raises(WeightSyncError, match="version 1"):  # the hung server cannot take an update either
            hung_only.update_weights(WeightUpdate(1, path="/nowhere"), timeout=0.5)
        hung_only.stop()
    finally:
        engine.stop()
        http.server.force_exit = True
        http.close()


def test_a_server_cooling_down_after_a_failed_request_still_gets_the_update(two_servers, models, tmp_path):
    """A request that timed out marks its server dead for a while; if it answers /health when weights are
    published it takes the new version too, instead of coming back after its cool-down with the old weights
    (tokens older than the staleness gate allows)."""
    engine = RemoteEngine(two_servers.urls, dead_cooldown_s=60).start()
    publisher = DiskPublisher([engine], str(tmp_path / "w"))
    try:
        engine.fleet.servers[0].dead_until = time.monotonic() + 60  # what a timed-out request does
        publisher.publish(models[1].state_dict(), 1)
        served = [int(httpx.get(f"{url}/get_model_info").json()["weight_version"]) for url in two_servers.urls]
        assert served == [1, 1] and engine.live_addrs() == two_servers.urls
        results = _run(engine, _prompts(8), SamplingParams(max_new_tokens=4, greedy=True))
        assert {v for (c,) in results for v in c.versions} == {1}
    finally:
        publisher.close()
        engine.stop()


@pytest.mark.parametrize("mode", ["recompute", "abort"])
def test_a_request_failing_right_after_the_health_check_does_not_leave_its_server_out(
    two_servers, models, tmp_path, monkeypatch, mode
):
    """A request that fails between the update's /health check and the update itself sets a cool-down again: the
    server that answered is updated all the same (left out, it served the old weights after its cool-down), and
    in abort mode resumed (it stayed paused: requests sent to it after its cool-down hung)."""
    engine = RemoteEngine(two_servers.urls, dead_cooldown_s=60, interrupt_mode=mode).start()
    check = engine.fleet.retire_unreachable

    def then_a_request_fails(version):
        answered = check(version)
        engine.fleet.servers[0].dead_until = time.monotonic() + 60  # what the failing request does meanwhile
        return answered

    monkeypatch.setattr(engine.fleet, "retire_unreachable", then_a_request_fails)
    publisher = DiskPublisher([engine], str(tmp_path / "w"))
    try:
        publisher.publish(models[1].state_dict(), 1)
        served = [int(httpx.get(f"{url}/get_model_info").json()["weight_version"]) for url in two_servers.urls]
        assert served == [1, 1]
        assert [httpx.get(f"{url}/get_server_info").json()["paused"] for url in two_servers.urls] == [False, False]
    finally:
        publisher.close()
        engine.stop()


def test_the_clients_phases_never_overlap_through_a_weight_update(two_servers, models, tmp_path, monkeypatch):
    """interrupt_mode=recompute keeps requests outstanding while the servers load new weights: that time is
    paused, not also generating, so the phases sum to the wall time (the run's accounting reads them)."""
    engine = RemoteEngine(two_servers.urls, interrupt_mode="recompute").start()
    load = engine.fleet.call_all

    def slow_load(addrs, call, timeout, what, **kw):  # a larger model: loading takes half a second
        if what.startswith("loading"):
            time.sleep(0.5)
        return load(addrs, call, timeout, what, **kw)

    monkeypatch.setattr(engine.fleet, "call_all", slow_load)
    publisher = DiskPublisher([engine], str(tmp_path / "w"))
    params = SamplingParams(n=2, max_new_tokens=150, temperature=1.0, stop_token_ids=[])

    async def main():
        tasks = [asyncio.ensure_future(engine.generate(p, params)) for p in _prompts(4)]
        while engine.stats().decode_s == 0:
            await asyncio.sleep(0.002)
        before, t0 = engine.stats(), time.monotonic()
        await asyncio.to_thread(publisher.publish, models[1].state_dict(), 1)
        after, wall = engine.stats(), time.monotonic() - t0
        await asyncio.gather(*tasks)
        return before, after, wall

    try:
        before, after, wall = asyncio.run(main())
    finally:
        publisher.close()
        engine.stop()
    phases = {k: getattr(after, k) - getattr(before, k) for k in ("decode_s", "paused_s", "idle_s")}
    assert phases["paused_s"] >= 0.5 and sum(phases.values()) == pytest.approx(wall, abs=0.02), (phases, wall)


def test_a_failed_resume_after_an_update_fails_later_requests_instead_of_hanging(models, tmp_path):
    """interrupt_mode=abort: the weights loaded, but one server answered the resume with a 500. The update
    raises, and a later request fails naming it (it waited forever at the client's closed gate)."""
    from starlette.responses import JSONResponse

    def failing_resume(app):
        async def wrapped(scope, receive, send):
            if scope["type"] == "http" and scope["path"] == "/continue_generation":

                async def drop(message):
                    pass

                await app(scope, receive, drop)  # the server does resume; its answer is lost
                return await JSONResponse({"error": {"message": "boom"}}, status_code=500)(scope, receive, send)
            return await app(scope, receive, send)

        return wrapped

    engines = [LocalEngine(models[0], max_slots=4, max_len=64).start() for _ in range(2)]
    http = [
        ServerThread(wrap(build_app(ServerState(e, None, "tiny", "-"))))
        for e, wrap in zip(engines, (lambda app: app, failing_resume))
    ]
    remote = RemoteEngine([h.url for h in http], interrupt_mode="abort").start()
    try:
        with pytest.raises(WeightSyncError, match="resuming after version 1"):
            DiskPublisher([remote], str(tmp_path / "w")).publish(models[1].state_dict(), 1)

        async def one():
            return await asyncio.wait_for(remote.generate([5, 6, 7], SamplingParams(max_new_tokens=4, greedy=True)), 10)

        with pytest.raises(WeightSyncError, match="resuming after version 1"):
            asyncio.run(one())
    finally:
        remote.stop()
        for h in http:
            h.close()
        for e in engines:
            e.stop()


def test_all_servers_down_fails_with_a_reason(models):
    servers = _Servers(models[0], 1)
    engine = RemoteEngine(servers.urls, request_timeout_s=2.0, max_attempts=2, dead_cooldown_s=0.1).start()
    servers.close()
    try:
        with pytest.raises(ServerError, match=servers.urls[0]):
            _run(engine, [[1, 2, 3]], SamplingParams(max_new_tokens=3))
    finally:
        engine.stop()


@pytest.mark.slow
def test_killed_server_mid_run_every_request_completes_once(tiny_model_dir, tokenizer, tmp_path):
    """Two `asyncrl serve` processes; one is killed while requests are in flight. Every request completes with
    exactly the greedy output of an unbroken run: nothing lost, nothing duplicated."""
    servers = [
        asyncrl_server(
            tiny_model_dir,
            "--max-slots",
            "8",
            "--max-len",
            "200",
            "--threads",
            "1",
            wait=False,
            log_path=str(tmp_path / f"server{i}.log"),
        )
        for i in range(2)
    ]
    try:
        for s in servers:
            s.wait_healthy()
        engine = RemoteEngine([s.url for s in servers], dead_cooldown_s=60).start()
        prompts = _prompts(48, seed=7)  # six waves of 8 slots a server: the kill lands mid-run even on a busy machine
        params = SamplingParams(n=2, max_new_tokens=60, greedy=True)

        async def main():
            tasks = [asyncio.ensure_future(engine.generate(p, params)) for p in prompts]
            first = engine.fleet.servers[0]  # the one killed: it must hold requests when it dies
            while (engine.stats().generated_tokens < 60 or first.outstanding == 0) and not all(
                t.done() for t in tasks
            ):  # some requests done, most in flight
                await asyncio.sleep(0.01)
            await asyncio.to_thread(servers[0].kill)
            return await asyncio.gather(*tasks)

        results = asyncio.run(main())
        local = LocalEngine(
            load_model(tiny_model_dir), max_slots=8, max_len=200, stop_token_ids=(tokenizer.eos_token_id,)
        )
        expected = local.generate_batch(prompts, params)
        assert len(results) == len(prompts)
        for got, want in zip(results, expected):
            assert [(c.output_ids, c.finish_reason) for c in got] == [(c.output_ids, c.finish_reason) for c in want]
            assert all(
                torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4) for a, b in zip(got, want)
            )
        assert servers[0].url not in engine.live_addrs() and engine.failovers > 0
        engine.stop()
    finally:
        for s in servers:
            s.close()


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["dist"])
def test_controller_with_asyncrl_servers_by_config_alone(tmp_path, tiny_model_dir, transport):
    """`rollout.backend=asyncrl:d2`: the controller starts two `asyncrl serve` processes, rolls out through the
    remote client, pushes each version over the weight transport and stops the servers at the end."""
    from asyncrl import configlib
    from asyncrl.config import TrainConfig
    from asyncrl.launch.train import train

    cfg = configlib.load(
        TrainConfig,
        None,
        [
            f"model.path={tiny_model_dir}",
            f"output_dir={tmp_path}",
            "progress_bar=false",
            "report=false",
            "total_train_steps=3",
            "train_dataset.batch_size=2",
            "gconfig.n_samples=4",
            "gconfig.max_new_tokens=24",
            "valid_dataset.size=8",
            "evaluator.freq_steps=0",
            "rollout.max_slots=16",
            "actor.lr=1e-3",
            "reward.fn=rewards_for_tests:digit_count_reward",
            "rollout.backend=asyncrl:d2",
            f"rollout.weight_transport={transport}",
            "rollout.max_head_offpolicyness=1",
        ],
    )
    last = train(cfg)
    assert last["version"] == 3 and last["rollout_failures"] == 0 and last["staleness_max"] <= 1


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["generation", "weight-sync", "evaluation"])
def test_a_run_with_two_servers_survives_losing_one(tmp_path, tiny_model_dir, moment):
    """kill -9 of one of two engine servers while generating, during a weight update or during evaluation:
    the server is retired, its requests move to the other, and the run trains every step."""
    import threading

    from asyncrl import configlib
    from asyncrl.config import TrainConfig
    from asyncrl.launch.build import assemble
    from asyncrl.loop.controller import run
    from asyncrl.weights.publish import DiskPublisher

    cfg = configlib.load(
        TrainConfig,
        None,
        [
            f"model.path={tiny_model_dir}",
            f"output_dir={tmp_path}",
            "progress_bar=false",
            "report=false",
            "total_train_steps=6",
            "train_dataset.batch_size=2",
            "gconfig.n_samples=2",
            "gconfig.max_new_tokens=24",
            "valid_dataset.size=8",
            "evaluator.freq_steps=2",
            "rollout.backend=asyncrl:d2",
            "rollout.max_slots=8",
            "reward.fn=rewards_for_tests:digit_count_reward",
            "reward.workers=0",
            "max_train_time_s=0",
        ],
    )
    with assemble(cfg) as parts:
        victim = parts.engine.fleet.procs[0]
        if moment == "generation":

            def kill_while_generating():
                while parts.engine.stats().generated_tokens < 100:
                    time.sleep(0.005)
                victim.kill()

            threading.Thread(target=kill_while_generating, daemon=True).start()
        elif moment == "weight-sync":
            publish = parts.publisher.publish

            def publish_and_kill(state_dict, version):
                if version == 3:
                    victim.kill()
                return publish(state_dict, version)

            parts.publisher.publish = publish_and_kill
            assert isinstance(parts.publisher, DiskPublisher)
        else:
            evaluate = parts.evaluate

            def evaluate_and_kill(version):
                if version == 2:
                    victim.kill()
                return evaluate(version)

            parts.evaluate = evaluate_and_kill
        last = run(parts)
        retired = [s for s in parts.engine.fleet.servers if s.retired]
    assert last["version"] == 6 and len(retired) == 1, (last.get("version"), retired)


def test_a_server_left_at_another_runs_version_is_refused_naming_it(models):
    """A second run attached to a server that the first run left at version 3 would sample the first run's policy
    and then fail its first update (versions never decrease): it is refused at start, naming the server."""
    servers = _Servers(models[0], 1, version=3)
    try:
        with pytest.raises(WeightSyncError, match=f"server {servers.urls[0]} serves weight version 3.*fresh server"):
            RemoteEngine(servers.urls, version=0).start()
        for version in (3, 5):  # the run that used it, resumed; or one further along
            engine = RemoteEngine(servers.urls, version=version).start()
            engine.stop()
    finally:
        servers.close()
