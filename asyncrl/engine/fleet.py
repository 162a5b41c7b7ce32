"""The servers behind a remote engine: which are live, which one takes the next request, control requests to
all of them at once, and retirement.

- **Health**: a connection error or timeout of a request marks its server dead for ``dead_cooldown_s`` (the
  engine sets ``dead_until``); a 5xx answer (over a working connection) is a failure of that request only.
  Before a weight update every server that does not answer ``/health`` is retired for good: it would miss
  the version and serve stale weights.
- **Routing**: the live server with the fewest outstanding requests, ties in turn.
- **Control**: a list of calls run in order on every server at once (pause, load weights, set the version);
  with ``survive`` (a version being installed) a server lost meanwhile is retired and the others go on.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from asyncrl.api.weights import WeightSyncError
from asyncrl.engine.dialects import Call

log = logging.getLogger(__name__)


@dataclass
class Server:
    url: str
    outstanding: int = 0
    dead_until: float = 0.0
    retired: str | None = None  # why it will never be used again

    def live(self, now: float) -> bool:
        return self.retired is None and now >= self.dead_until


class ServerError(RuntimeError):
    """A server failed to serve a request (connection, timeout or 5xx): try another one."""


class RequestFailed(ServerError):
    """A server answered a request with a 5xx: that request failed there, but the server itself answered, so
    it is not taken for dead."""


class RequestRejected(ValueError):
    """A server refused a request as malformed (4xx): retrying elsewhere would not help."""


class Fleet:
    """The servers at ``addrs`` ("host:port" or URLs), or those ``launch`` starts (objects with ``url``,
    ``wait_healthy()`` and ``close()``: ``asyncrl.engine.spawn.ServerProcess``). ``lock`` guards the servers'
    outstanding counts and the turn (the engine's counters share it)."""

    def __init__(
        self,
        addrs: list[str] = (),
        *,
        launch: Callable[[], list] | None = None,
        headers: dict | None = None,
        request_timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        startup_timeout_s: float = 120.0,
    ):
        self.servers = [Server(url_of(a)) for a in addrs]
        self.launch, self.procs = launch, []
        self.headers = headers or {}
        self.request_timeout_s, self.connect_timeout_s = request_timeout_s, connect_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.lock = threading.Lock()
        self.sync = None  # the httpx.Client of control requests, from start()
        self._turn = 0
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="asyncrl-remote")

    def start(self, version: int, set_version: list[Call]) -> None:
        """Launch the servers (if ``launch``), wait until each is healthy, refuse one that serves a later version
        than ``version`` (another run's policy), then run ``set_version`` on them all."""
        import httpx

        from asyncrl.engine.spawn import wait_healthy

        if self.launch is not None and not self.procs:
            self.procs = list(self.launch())
            self.servers = [Server(p.url) for p in self.procs]
            for p in self.procs:
                p.wait_healthy()
        self.sync = httpx.Client(
            timeout=httpx.Timeout(self.request_timeout_s, connect=self.connect_timeout_s), headers=self.headers
        )
        for s in self.servers:
            wait_healthy(s.url, self.startup_timeout_s)
            self._check_not_ahead(s.url, version)
        self.call_all(self.live_addrs(), set_version, self.startup_timeout_s, f"setting version {version}")

    def _check_not_ahead(self, url: str, version: int) -> None:
        """Refuse a server that serves a later weight version than this run starts at: it holds another run's
        policy, and versions never decrease, so this run could neither sample its own policy nor update it."""
        try:
            served = int(self.sync.get(f"{url}/get_model_info").json()["weight_version"])
        except Exception:  # a server that does not say (SGLang, vLLM): the first weight update tells
            return
        if served > version:
            raise WeightSyncError(
                f"server {url} serves weight version {served}, from another run (this run starts at version "
                f"{version}): start a fresh server for this run (asyncrl serve ...), or resume the run that "
                "used it"
            )

    def stop(self) -> None:
        if self.sync is not None:
            self.sync.close()
            self.sync = None
        for p in self.procs:
            p.close()
        self.procs = []
        self._pool.shutdown(wait=False, cancel_futures=True)

    def live_addrs(self) -> list[str]:
        now = time.monotonic()
        return [s.url for s in self.servers if s.live(now)]

    def by_url(self, url: str) -> Server:
        return next(s for s in self.servers if s.url == url)

    def pick(self, exclude: set[str]) -> Server | None:
        """The live server with the fewest outstanding requests (ties in turn), or None."""
        now = time.monotonic()
        with self.lock:
            live = [s for s in self.servers if s.live(now) and s.url not in exclude]
            if not live:
                return None
            self._turn += 1
            return min(live, key=lambda s: (s.outstanding, (self.servers.index(s) - self._turn) % len(self.servers)))

    def retire(self, server: Server, why: str) -> None:
        if server.retired is None:
            server.retired = why
            log.error("server %s %s: retired; %d server(s) left", server.url, why, len(self.live_addrs()))

    def retire_unreachable(self, version: int) -> list[str]:
        """Before an update: a server that does not answer ``/health`` now is retired for good (it would miss
        this version and serve stale weights), however long ago it died; one that answers is live again, even
        within the cool-down of a failed request, so that it receives this version (left out, it would serve the
        old weights when its cool-down ended). Returns those that answered: the servers to update."""
        import httpx

        def healthy(server: Server) -> bool:
            try:
                return self.sync.get(server.url + "/health", timeout=self.connect_timeout_s).status_code == 200
            except httpx.HTTPError:
                return False

        candidates = [s for s in self.servers if s.retired is None]
        answered = []
        for server, ok in zip(candidates, self._pool.map(healthy, candidates)):
            if ok:
                server.dead_until = 0.0
                answered.append(server.url)
            else:
                self.retire(server, f"did not answer /health before the update to version {version}")
        return answered

    def post(
        self, url: str, path: str, body: dict | None = None, timeout: float | None = None, params: dict | None = None
    ) -> dict:
        """A control request to one server; raises ``ServerError`` (``RequestFailed`` for a 5xx answer) or
        ``RequestRejected`` with its message."""
        import httpx

        client = self.sync
        if client is None:
            raise RuntimeError("remote engine not started")
        try:
            r = client.post(url + path, json=body, params=params, timeout=timeout or self.request_timeout_s)
        except httpx.HTTPError as e:
            raise ServerError(f"{url}{path}: {type(e).__name__}: {e}") from e
        return checked(r, url + path)

    def call_all(
        self, addrs: list[str], calls: list[Call], timeout: float, what: str, survive: int | None = None
    ) -> list[str]:
        """Run ``calls`` (in order) on every server at once; return the servers that succeeded. A failure raises
        ``WeightSyncError`` naming ``what``, except with ``survive`` (the version being installed): a server
        that cannot be reached (connection lost, timeout: it died) is then retired and the others go on, as
        long as one is left; a server that answered with an error still fails the update."""
        if not calls or not addrs:
            return list(addrs)

        def run(url: str) -> None:
            for c in calls:
                self.post(url, c.path, c.json, timeout, c.params)

        futures = {url: self._pool.submit(run, url) for url in addrs}
        errors, done = [], []
        for url, f in futures.items():
            try:
                f.result(timeout=timeout)
                done.append(url)
            except ServerError as e:
                if survive is None or isinstance(e, RequestFailed):
                    errors.append(f"{url}: {e}")
                else:
                    self.retire(self.by_url(url), f"was lost while {what}")
            except Exception as e:  # noqa: BLE001 - collected and raised together
                errors.append(f"{url}: {e}")
        if errors or not done:
            raise WeightSyncError(
                f"{what} failed on {len(errors) or len(addrs)} of {len(addrs)} servers: "
                + "; ".join(errors or ["every server was lost"])
            )
        return done


def checked(r, where: str):
    """The JSON body of an httpx response, or the error its status says (5xx: ``RequestFailed``, 4xx:
    ``RequestRejected``)."""
    if r.status_code >= 500:
        raise RequestFailed(f"{where}: HTTP {r.status_code}: {r.text[:500]}")
    if r.status_code >= 400:
        raise RequestRejected(f"{where}: HTTP {r.status_code}: {r.text[:500]}")
    return r.json() if r.content else {}


def url_of(addr: str) -> str:
    addr = addr.strip().rstrip("/")
    return addr if "://" in addr else f"http://{addr}"
