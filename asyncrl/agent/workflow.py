"""The agent workflow (``workflow.name: agent``): an item runs ``gconfig.n_samples`` episodes of the user's
``async def episode(client, item)`` at once (one admission for the group), each with a client bound to its
own key on the proxy; the calls they make become the group's samples.

An episode returns its reward (a number, for its last call) or ``{completion_id: reward}``; one that raises,
returns something else or runs past ``agent.timeout_s`` is counted (``agent_episode_failures``, the first of
each kind logged with its traceback) and dropped. A group whose episodes all failed is a failed rollout.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import math
import numbers
import time

from asyncrl.agent.chat import ChatRenderer
from asyncrl.agent.client import InProcessClient
from asyncrl.agent.config import resolve_episode
from asyncrl.agent.proxy import AgentProxy
from asyncrl.telemetry.account import EPISODES as EPISODE_PHASES
from asyncrl.types import TrajectoryGroup

log = logging.getLogger(__name__)

LATENCY_OPTIONS = ("tool_latency_s", "tool_latency_p99_s")
"""Episode options that only simulate tool latency: left out of held-out evaluation, which they would only slow."""


def outcome_values(outcome) -> list:
    """The rewards an episode returned: its number, or every value of its ``{completion_id: reward}`` (a list of
    rewards for a completion's choices counts each)."""
    if not isinstance(outcome, dict):
        return [outcome]
    return [x for v in outcome.values() for x in (v if isinstance(v, (list, tuple)) else [v])]


def outcome_score(outcome) -> float:
    """An episode's held-out score: its reward, or the sum of its ``{completion_id: reward}``."""
    if isinstance(outcome, dict):
        return float(sum(outcome_values(outcome)))
    if isinstance(outcome, numbers.Real) and not isinstance(outcome, bool):
        return float(outcome)
    raise TypeError(f"the episode returned {type(outcome).__name__}, not a reward or {{completion_id: reward}}")


class AgentWorkflow:
    """Runs the episodes of an item through the proxy and exports their calls as one group. ``serve(proxy, host,
    port, admin_key)`` puts the proxy on HTTP (a handle with ``url`` and ``close()``, e.g.
    ``asyncrl.server.agent.serve_proxy``); the ``openai`` client needs it, the in-process one does not."""

    def __init__(
        self,
        context,
        *,
        episode: str,
        timeout_s: float = 300.0,
        export: str = "individual",
        turn_discount: float = 1.0,
        tool_parser: str = "hermes",
        client: str = "auto",
        proxy_host: str = "127.0.0.1",
        proxy_port: int = 0,
        admin_key: str = "",
        options: dict | None = None,
        serve=None,
    ):
        self.episode_fn, self.options = resolve_episode(episode), dict(options or {})
        stop_token_id, max_len = context.stop_token_ids[0], context.max_len
        self.n, self.timeout_s, self.export, self.gamma = context.params.n, timeout_s, export, turn_discount
        self.tool_parser = tool_parser
        self.proxy = AgentProxy(
            ChatRenderer(context.tokenizer, stop_token_id), context.params, max_len, tool_parser=tool_parser
        )
        self.use_http = client == "openai" or (client == "auto" and _has_openai())
        self.server = self.http = self.serve_fn = None
        if self.use_http:
            if serve is None:
                raise ValueError("agent.client=openai needs the proxy on HTTP, and no server was given (serve=None)")
            self._serve(serve, context.tokenizer, stop_token_id, proxy_host, proxy_port, admin_key)
        self.episodes = self.failures = self.history_edits = self.retries = 0
        self.time = dict.fromkeys(EPISODE_PHASES, 0.0)  # episode-seconds per phase (asyncrl.telemetry.account)
        self._client_s: dict[str, float] = {}  # per episode key: time its HTTP calls took, seen by the client
        self._logged: set[str] = set()

    def _serve(self, serve, tokenizer, stop_token_id: int, host: str, port: int, admin_key: str) -> None:
        """The HTTP proxy on a thread of its own, with a tokenizer of its own (fast tokenizers are not safe
        across threads)."""
        import httpx

        self.proxy.renderer = ChatRenderer(copy.deepcopy(tokenizer), stop_token_id)
        self.proxy.tokenizer = self.proxy.renderer.tokenizer
        self.server = serve(self.proxy, host, port, admin_key or None)
        self.serve_fn = serve  # evaluation serves a proxy of its own the same way
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(self.timeout_s + 60),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )

    async def run(self, item: dict, engine) -> TrajectoryGroup | None:
        self.proxy.engine = engine
        outcomes = await asyncio.gather(*(self._episode(item) for _ in range(self.n)))
        samples = [t for result in outcomes if result is not None for t in result]
        if not samples:
            raise RuntimeError(f"every episode of item {item.get('id')} failed or made no call")
        return TrajectoryGroup(samples, item_id=item.get("id"))

    async def _episode(self, item: dict):
        key = self.proxy.open()
        client = self._client(key)
        t0 = time.perf_counter()
        try:
            outcome = await asyncio.wait_for(self.episode_fn(client, item, **self.options), self.timeout_s)
            if not isinstance(outcome, (numbers.Real, dict)) or isinstance(outcome, bool):
                raise TypeError(
                    f"the episode returned {type(outcome).__name__}, not a reward or {{completion_id: reward}}"
                )
            if not all(isinstance(v, numbers.Real) and math.isfinite(v) for v in outcome_values(outcome)):
                raise ValueError(f"the episode returned a reward that is not a finite number: {outcome!r}")
            episode = self.proxy.episodes[key]
            return episode.samples(outcome, self.export, self.gamma)
        except Exception as e:  # noqa: BLE001 - an episode costs only itself
            self._failed(item, e)
            return None
        finally:
            episode = self.proxy.close(key)
            self.episodes += 1
            self.history_edits += episode.history_edits
            self.retries += episode.retries
            self._account(time.perf_counter() - t0, episode, self._client_s.pop(key, episode.handler_s))

    def evaluate(self, engine, items: list[dict], tokenizer, params, success_threshold: float = 1.0) -> dict:
        """One episode per held-out item on ``engine`` with ``params`` (greedy by default), run from the calling
        thread with ``tokenizer`` (that thread's own) through the same kind of client as training's (the
        ``openai`` client over HTTP to a proxy of its own, or the in-process one), without the simulated tool
        latency (``LATENCY_OPTIONS``: it only slows evaluation down); a failed episode scores 0 and is counted in
        ``eval_episode_failures``."""
        t0 = time.perf_counter()
        proxy = AgentProxy(
            ChatRenderer(tokenizer, self.proxy.renderer.stop_token_id),
            params,
            self.proxy.max_len,
            tool_parser=self.tool_parser,
            engine=engine,
        )
        server = self.serve_fn(proxy, "127.0.0.1", 0, None) if self.use_http else None
        failures = []
        options = {k: v for k, v in self.options.items() if k not in LATENCY_OPTIONS}  # they only slow it down

        async def one(item: dict, http) -> float:
            key = proxy.open()
            client = (
                InProcessClient(proxy, key)
                if server is None
                else _timed_openai()(
                    base_url=server.url + "/v1", api_key=key, http_client=http, max_retries=2, on_call=lambda s: None
                )
            )
            try:
                outcome = await asyncio.wait_for(self.episode_fn(client, item, **options), self.timeout_s)
                return outcome_score(outcome)
            except Exception as e:  # noqa: BLE001 - counted; evaluation goes on
                failures.append(e)
                return 0.0
            finally:
                proxy.close(key)

        async def all_items():
            import httpx

            async with httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s + 60)) as http:
                return await asyncio.gather(*(one(item, http) for item in items))

        try:
            scores = asyncio.run(all_items())
        finally:
            proxy.shutdown()
            if server is not None:
                server.close()
        if failures:
            log.warning(
                "evaluation: %d of %d episodes failed (first: %s: %s)",
                len(failures),
                len(items),
                type(failures[0]).__name__,
                failures[0],
            )
        return {
            "eval_accuracy": sum(s >= success_threshold for s in scores) / len(scores),
            "eval_reward_mean": sum(scores) / len(scores),
            "eval_episode_failures": len(failures),
            "eval_calls_per_episode": proxy.calls / len(items),
            "eval_items": len(scores),
            "eval_time_s": time.perf_counter() - t0,
        }

    def _client(self, key: str):
        if not self.use_http:
            return InProcessClient(self.proxy, key)
        return _timed_openai()(
            base_url=self.server.url + "/v1",
            api_key=key,
            http_client=self.http,
            max_retries=2,
            on_call=lambda seconds: self._add_client_time(key, seconds),
        )

    def _add_client_time(self, key: str, seconds: float) -> None:
        self._client_s[key] = self._client_s.get(key, 0.0) + seconds

    def _failed(self, item: dict, error: Exception) -> None:
        self.failures += 1
        kind = type(error).__name__
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(
                "an episode of item %s failed; it is dropped and counted in agent_episode_failures "
                "(logged once per kind of error)",
                item.get("id"),
                exc_info=error,
            )

    def _account(self, wall_s: float, episode, client_s: float) -> None:
        """An episode's time: in the engine (queued, generating), in the proxy's own work, between the client and
        the proxy (HTTP; 0 in process), and the rest (its tools and code). ``client_s`` is how long its calls
        took as the client saw them, added over its calls: calls made at once add up to more than the time they
        took together, so then the phases of the calls are scaled down to the episode's wall time (no tool time)."""
        client_s = max(client_s, episode.handler_s)
        scale = min(1.0, wall_s / client_s) if client_s > 0 else 1.0
        self.time["llm_queue"] += episode.llm_queue_s * scale
        self.time["llm_gen"] += max(0.0, episode.llm_s - episode.llm_queue_s) * scale
        self.time["proxy"] += max(0.0, episode.handler_s - episode.llm_s) * scale
        self.time["http"] += (client_s - episode.handler_s) * scale
        self.time["tool"] += max(0.0, wall_s - client_s)

    def stats(self) -> dict:
        return {
            "agent_episodes": self.episodes,
            "agent_episode_failures": self.failures,
            "agent_calls": self.proxy.calls,
            "agent_tool_parse_errors": self.proxy.tool_parse_errors,
            "agent_history_edits": self.history_edits,
            "agent_retries": self.retries,
            "agent_tool_s": self.time["tool"],
            **{f"episode_{k}_s": v for k, v in self.time.items()},
        }

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self.proxy.shutdown()


@functools.cache
def _timed_openai():
    """``openai.AsyncOpenAI`` that reports how long each chat or text completion took as the agent saw it (the
    client library's own work, HTTP and the proxy included): an episode's time outside them is its own (its
    tools and code)."""
    from openai import AsyncOpenAI

    class TimedOpenAI(AsyncOpenAI):
        def __init__(self, *args, on_call, **kwargs):
            super().__init__(*args, **kwargs)
            self._on_call = on_call

        @functools.cached_property
        def chat(self):
            chat = super().chat
            chat.completions.create = self._timed(chat.completions.create)
            return chat

        @functools.cached_property
        def completions(self):
            completions = super().completions
            completions.create = self._timed(completions.create)
            return completions

        def _timed(self, create):
            @functools.wraps(create)
            async def timed(*args, **kwargs):
                t0 = time.perf_counter()
                try:
                    return await create(*args, **kwargs)
                finally:
                    self._on_call(time.perf_counter() - t0)

            return timed

    return TimedOpenAI


def _has_openai() -> bool:
    import importlib.util

    return importlib.util.find_spec("openai") is not None and importlib.util.find_spec("fastapi") is not None
