"""The engine Protocol over HTTP: a client for N inference servers (``asyncrl serve``, SGLang, vLLM).

- **Routing**: a new request goes to the live server with the fewest outstanding requests; its ``n`` samples
  are one request (one shared prefill). A sample cut short by an abort is resubmitted as prompt + tokens so
  far to the same server (AReaL's interruptible generation), tagged with the weight version of each chunk.
- **Failures**: a connection error or timeout marks the server dead for ``dead_cooldown_s``; a 5xx answer
  (it came over a working connection) is a failure of that request only, and leaves the server live. Either
  way the same chunk is retried, on another server if there is one (at most ``max_attempts`` tries per
  chunk). A chunk whose response arrived is never resubmitted, so a sample is never duplicated; tokens
  already received are kept. A server that misses a weight update (dead while it happened) is retired for
  good: it would serve stale weights. The servers' health, routing and control requests are
  :mod:`asyncrl.engine.fleet`.
- **Weight updates** (``update_weights`` with a path, or ``updating`` for other transports): with
  ``interrupt_mode="abort"`` the servers are paused (running requests end with finish reason ``abort``),
  new chunks wait at a client-side gate, the weights are loaded, the version is raised and generation
  continues; resubmitted chunks are re-prefilled under the new weights. ``"recompute"`` skips the pause: the
  server swaps the weights at a token boundary and re-prefills in place (``asyncrl serve`` only).

The servers' HTTP dialects (SGLang's, vLLM's) are :mod:`asyncrl.engine.dialects`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import weakref
from typing import Callable

from asyncrl.api.engine import EngineStats
from asyncrl.api.weights import WeightSyncError
from asyncrl.engine.continuation import continue_aborted
from asyncrl.engine.dialects import APIS
from asyncrl.engine.fleet import Fleet, RequestFailed, Server, ServerError, checked
from asyncrl.types import Completion, SamplingParams, WeightUpdate

log = logging.getLogger(__name__)


class _Gate:
    """Open/closed flag that threads set and asyncio tasks in any event loop can await."""

    def __init__(self):
        self._open = True
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    def close(self) -> None:
        with self._lock:
            self._open = False

    def open(self) -> None:
        with self._lock:
            self._open, waiters, self._waiters = True, self._waiters, []
        for loop, fut in waiters:
            loop.call_soon_threadsafe(lambda f=fut: f.done() or f.set_result(None))

    async def wait(self) -> None:
        while True:
            with self._lock:
                if self._open:
                    return
                loop = asyncio.get_running_loop()
                fut = loop.create_future()
                self._waiters.append((loop, fut))
            await fut


class RemoteEngine:
    """The engine Protocol against inference servers at ``addrs`` ("host:port" or URLs).

    ``launch``, if given, starts the servers on ``start`` and returns objects with ``url`` and ``close()``
    (``asyncrl.engine.spawn.ServerProcess``); ``stop`` closes them."""

    def __init__(
        self,
        addrs: list[str] = (),
        *,
        api: str = "sglang",
        interrupt_mode: str = "abort",
        request_timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        max_attempts: int = 3,
        dead_cooldown_s: float = 5.0,
        startup_timeout_s: float = 120.0,
        version: int = 0,
        launch: Callable[[], list] | None = None,
        api_key: str | None = None,
    ):
        if api not in APIS:
            raise ValueError(f"server api must be one of {sorted(APIS)}, got '{api}'")
        if interrupt_mode not in ("recompute", "abort"):
            raise ValueError(f"interrupt_mode must be 'recompute' or 'abort', got '{interrupt_mode}'")
        if api == "vllm" and interrupt_mode == "recompute":
            raise ValueError("vLLM servers cannot re-prefill in place on a weight update: use interrupt_mode='abort'")
        if not addrs and launch is None:
            raise ValueError("RemoteEngine needs server addresses (or a launcher)")
        self.api = APIS[api]()
        self.interrupt_mode = interrupt_mode
        self.request_timeout_s, self.connect_timeout_s = request_timeout_s, connect_timeout_s
        self.max_attempts, self.dead_cooldown_s = max_attempts, dead_cooldown_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}  # servers with --admin-key
        self.fleet = Fleet(
            addrs,
            launch=launch,
            headers=self._headers,
            request_timeout_s=request_timeout_s,
            connect_timeout_s=connect_timeout_s,
            startup_timeout_s=startup_timeout_s,
        )
        self._version = version
        self._gate = _Gate()
        self._failed_update: str | None = None
        self._lock = self.fleet.lock  # the counters below and the servers' outstanding requests
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.generated_tokens = 0  # counters, changed under _lock
        self.busy_s = 0.0
        self.interruptions = 0
        self.failovers = 0  # chunks retried after a failure (on another server when there is one)
        self._in_flight = 0
        self.paused_s, self._paused_since = 0.0, 0.0  # inside weight updates
        self._started_at = self._phase_since = 0.0  # since start; since the last change of phase (_advance)

    # ---- the engine Protocol ---------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    @property
    def addrs(self) -> list[str]:
        return [s.url for s in self.fleet.servers]

    def start(self) -> "RemoteEngine":
        self.fleet.start(self._version, self.api.set_version(self._version))
        self._started_at = self._phase_since = time.monotonic()
        return self

    def stop(self) -> None:
        self._gate.open()
        self.fleet.stop()

    def stats(self) -> EngineStats:
        """The counters as seen from the client, one phase at a time: paused is time inside a weight update
        (requests may stay outstanding through it: ``recompute``), generating the other time with a request
        outstanding (all of it ``decode_s``), idle the rest since ``start``."""
        with self._lock:
            now = time.monotonic()
            self._advance(now)
            idle = max(0.0, (now - self._started_at if self._started_at else 0.0) - self.busy_s - self.paused_s)
            return EngineStats(
                self.generated_tokens,
                self.busy_s,
                self.interruptions,
                decode_s=self.busy_s,
                paused_s=self.paused_s,
                idle_s=idle,
            )

    def _advance(self, now: float) -> None:
        """Book the time since the last change of phase to the phase it was in (holding ``_lock``)."""
        if self._started_at:
            if self._paused_since:
                self.paused_s += now - self._phase_since
            elif self._in_flight:
                self.busy_s += now - self._phase_since
        self._phase_since = now

    def pause(self) -> None:
        """Hold new chunks here and running requests at a token boundary on the servers."""
        self._gate.close()
        self.fleet.call_all(self.live_addrs(), self.api.pause(keep=True), self.request_timeout_s, "pausing")

    def resume(self) -> None:
        self.fleet.call_all(self.live_addrs(), self.api.resume(), self.request_timeout_s, "resuming")
        self._gate.open()

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        first, server = await self._chunk(self.fleet.pick(set()), prompt_ids, prompt_ids, params)
        return list(await asyncio.gather(*(self._finish(c, server, params, i) for i, c in enumerate(first))))

    def update_weights(self, update: WeightUpdate, timeout: float | None = 60.0) -> None:
        """Make every live server load ``update.path`` (a directory of safetensors) as ``update.version``."""
        if update.path is None:
            raise ValueError(
                f"a remote engine loads weights from disk or a broadcast, not an in-memory "
                f"state dict (update to version {update.version}): use weight_transport disk or dist"
            )
        timeout = timeout or self.request_timeout_s
        with self.updating(update.version, timeout) as addrs:
            self.fleet.call_all(
                addrs,
                self.api.load_from_disk(update.path, update.version),
                timeout,
                f"loading version {update.version} from {update.path}",
                survive=update.version,
            )

    # ---- weight updates ------------------------------------------------------------------------------------
    def live_addrs(self) -> list[str]:
        return self.fleet.live_addrs()

    @contextlib.contextmanager
    def updating(self, version: int, timeout: float):
        """Around a weight transport: pause (in abort mode), yield the live server URLs, then raise the version
        and continue. On failure the servers stay paused and every later request fails naming the version
        (a server may hold part of it)."""
        if self._failed_update:
            raise WeightSyncError(self._failed_update)
        addrs = self.fleet.retire_unreachable(version)  # not live_addrs(): a request failing meanwhile would set
        if not addrs:  # a cool-down again, and the server would miss this version
            raise WeightSyncError(f"no live server to update to version {version}")
        abort = self.interrupt_mode == "abort"
        with self._lock:
            self._advance(time.monotonic())
            self._paused_since = time.monotonic()
        try:
            if abort:
                self._gate.close()
                addrs = self.fleet.call_all(
                    addrs, self.api.pause(keep=False), timeout, f"pausing for version {version}", survive=version
                )
            yield addrs
        except BaseException as e:
            self._failed_update = f"weight update to version {version} failed: {type(e).__name__}: {e}"
            self._gate.open()  # waiting requests see the failure instead of hanging
            self._end_pause()
            raise
        self._version = version
        self._end_pause()
        if abort:
            try:
                self.fleet.call_all(
                    addrs, self.api.resume(), timeout, f"resuming after version {version}", survive=version
                )  # those paused: one in a cool-down since would stay paused
            except BaseException as e:  # later requests fail naming it instead of waiting at the closed gate
                self._failed_update = (
                    str(e)
                    if isinstance(e, WeightSyncError)
                    else f"resuming after version {version} failed: {type(e).__name__}: {e}"
                )
                raise
            finally:
                self._gate.open()

    def _end_pause(self) -> None:
        with self._lock:
            if self._paused_since:
                self._advance(time.monotonic())
                self._paused_since = 0.0

    def post(
        self, url: str, path: str, body: dict | None = None, timeout: float | None = None, params: dict | None = None
    ) -> dict:
        """A control request to one server (``asyncrl.engine.fleet.Fleet.post``)."""
        return self.fleet.post(url, path, body, timeout, params)

    # ---- generation ------------------------------------------------------------------------------------------
    async def _finish(self, c: Completion, server: Server, params: SamplingParams, index: int) -> Completion:
        """Continue a sample cut short by an abort on the server that had it (its prefix is cached there)."""

        async def resubmit(ids: list[int], rest: SamplingParams) -> Completion:
            nonlocal server
            with self._lock:
                self.interruptions += 1
            (more,), server = await self._chunk(server, c.prompt_ids, ids, rest)
            return more

        return await continue_aborted(c, params, resubmit, index)

    async def _chunk(
        self, server: Server | None, prompt_ids: list[int], ids: list[int], params: SamplingParams
    ) -> tuple[list[Completion], Server]:
        """One request for ``ids``; on a server failure, the same request on another server."""
        deadline = time.monotonic() + self.request_timeout_s
        tried: set[str] = set()
        errors: list[str] = []
        body = self.api.generate_body(ids, params)
        while True:
            await self._gate.wait()
            if self._failed_update:
                raise WeightSyncError(self._failed_update)
            if server is None or not server.live(time.monotonic()) or server.url in tried:
                server = self.fleet.pick(tried) or self.fleet.pick(set())
            if server is None:
                if time.monotonic() > deadline:
                    raise ServerError(f"no live server within {self.request_timeout_s}s: " + "; ".join(errors))
                await asyncio.sleep(min(self.dead_cooldown_s, 0.5))
                continue
            version = self._version
            try:
                result = self.api.parse(await self._post(server, body), prompt_ids, version)
            except ServerError as e:
                errors.append(str(e))
                tried.add(server.url)
                if not isinstance(e, RequestFailed):
                    server.dead_until = time.monotonic() + self.dead_cooldown_s
                self.failovers += 1
                log.warning("server %s failed (%s); retrying the request", server.url, e)
                if len(errors) >= self.max_attempts:
                    raise ServerError(f"request failed on {len(errors)} attempts: " + "; ".join(errors)) from e
                server = None
                continue
            if len(result) != params.n:
                raise ServerError(f"{server.url} returned {len(result)} samples for n={params.n}")
            with self._lock:
                self.generated_tokens += sum(len(c.output_ids) for c in result)
            return result, server

    async def _post(self, server: Server, body: dict):
        import httpx

        client = self._client()
        with self._lock:
            server.outstanding += 1
            self._advance(time.monotonic())
            self._in_flight += 1
        try:
            r = await client.post(server.url + self.api.generate_path, json=body)
        except httpx.HTTPError as e:  # connection refused/reset, timeout: the server is unusable for now
            raise ServerError(f"{server.url}: {type(e).__name__}: {e}") from e
        finally:
            with self._lock:
                server.outstanding -= 1
                self._advance(time.monotonic())
                self._in_flight -= 1
        return checked(r, server.url + self.api.generate_path)

    def _client(self):
        """An ``httpx.AsyncClient`` for the running event loop (clients cannot be shared across loops)."""
        import httpx

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.request_timeout_s, connect=self.connect_timeout_s),
                headers=self._headers,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            )
            self._clients[loop] = client
        return client
