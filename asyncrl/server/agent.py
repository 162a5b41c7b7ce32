"""The agent proxy over HTTP (FastAPI; the ``serve`` extra): ``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``, authenticated by the episode's key (``Authorization: Bearer KEY``). Loopback only unless an
admin key is set (a proxy on a network interface without one would let anyone who guesses a path in).

Stand-alone use (``asyncrl serve --agent-proxy``) adds session routes for the admin: ``POST /rl/sessions``
opens an episode and returns its key, ``POST /rl/sessions/{key}/end`` closes it and returns its recorded calls
(prompt ids, output ids, log-probs, versions, finish reasons).
"""

from __future__ import annotations

import asyncio
import json
import secrets

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from asyncrl.agent.proxy import AgentProxy, ProxyError, check_bind
from asyncrl.server.app import ServerThread
from asyncrl.server.middleware import BodyLimit, CancelOnDisconnect, bearer

MAX_BODY_BYTES = 4 << 20
MAX_CONTAINERS = 1 << 16
END_WAIT_S = 120.0  # how long ending a session waits for its calls in flight (those still running: "unfinished")


def build_app(
    proxy: AgentProxy, admin_key: str | None = None, sessions: bool = False, max_body_bytes: int = MAX_BODY_BYTES
) -> FastAPI:
    app = FastAPI(title="asyncrl agent proxy")

    @app.exception_handler(ProxyError)
    async def _refused(request: Request, exc: ProxyError):
        kind = "authentication_error" if exc.status == 401 else "invalid_request_error"
        return JSONResponse(status_code=exc.status, content={"error": {"message": str(exc), "type": kind}})

    async def body_of(request: Request) -> dict:
        try:
            body = json.loads(await request.body())
        except RecursionError:
            raise ProxyError(400, "the request body is nested too deep") from None
        except ValueError as e:  # not JSON, not UTF-8, an integer beyond Python's 4300 digits
            raise ProxyError(400, f"the request body is not JSON: {str(e)[:200]}") from None
        if not isinstance(body, dict):
            raise ProxyError(400, "the request body must be a JSON object")
        return body

    @app.get("/v1/models")
    async def models(request: Request):
        proxy.episode(_bearer(request))
        return _json(proxy.models())

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        key = _bearer(request)
        proxy.episode(key)  # 401 before the body is looked at
        return _json(await proxy.chat(key, await body_of(request), _retried(request)))

    @app.post("/v1/completions")
    async def completions(request: Request):
        key = _bearer(request)
        proxy.episode(key)
        return _json(await proxy.complete(key, await body_of(request)))

    if sessions:

        def admin(request: Request) -> None:
            if not admin_key or not secrets.compare_digest(_bearer(request) or "", admin_key):
                raise ProxyError(401, "session routes need the admin key")

        @app.post("/rl/sessions")
        async def open_session(request: Request):
            admin(request)
            return {"api_key": proxy.open()}

        @app.post("/rl/sessions/{key}/end")
        async def end_session(key: str, request: Request):
            admin(request)
            episode = proxy.episodes.get(key)
            if episode is None:
                raise ProxyError(404, "no live session has this key")
            episode.ending = True  # a call answered after the end would never be recorded: those in flight finish
            pending = episode.in_flight()
            if pending:
                await asyncio.wait(pending, timeout=END_WAIT_S)
            proxy.close(key)
            return {
                "unfinished": sum(not f.done() for f in pending),
                "calls": [
                    {
                        "id": c.id,
                        "choice": c.choice,
                        "parent": c.parent,
                        "prompt_ids": c.prompt_ids,
                        "output_ids": c.output_ids,
                        "logprobs": c.logprobs,
                        "versions": c.versions,
                        "finish_reason": c.finish_reason,
                    }
                    for c in episode.calls
                ],
            }

    # an episode whose client went away (agent.timeout_s) stops generating: its samples free the engine's slots
    return BodyLimit(
        CancelOnDisconnect(app, ("/v1/chat/completions", "/v1/completions")), max_body_bytes, MAX_CONTAINERS
    )


def _json(body: dict) -> Response:
    """The answer serialised once, without FastAPI's per-field encoder (a chat answer with log-probs has one
    entry per token)."""
    return Response(json.dumps(body, ensure_ascii=False).encode(), media_type="application/json")


def _bearer(request: Request) -> str | None:
    return bearer(request.headers.get("authorization", ""))


def _retried(request: Request) -> bool:
    """Whether the request is a client's retry: the OpenAI SDKs count their tries in ``x-stainless-retry-count``."""
    count = request.headers.get("x-stainless-retry-count", "0").strip()
    return count.isdigit() and int(count) > 0


def serve_proxy(
    proxy: AgentProxy, host: str = "127.0.0.1", port: int = 0, admin_key: str | None = None
) -> ServerThread:
    """``proxy`` over HTTP on a thread of this process (``.url``, ``.close()``): how a training run's agent
    workflow gives its episodes a real OpenAI endpoint. ValueError for a non-loopback ``host`` without
    ``admin_key``."""
    check_bind(host, admin_key)
    return ServerThread(build_app(proxy, admin_key or None), host, port)
