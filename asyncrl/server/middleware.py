"""The ASGI middlewares of ``asyncrl serve``: the request size limit, 500s that keep the connection open, the admin
key on the engine's routes, and generation that stops when its client goes away.

Plain ASGI (no framework base class), so they work the same on every Starlette/FastAPI version.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from starlette.responses import JSONResponse

from asyncrl.server.limits import BODY_STALL_S
from asyncrl.server.render import error_body

log = logging.getLogger(__name__)


def bearer(authorization: str) -> str | None:
    """The key of an ``Authorization: Bearer KEY`` header, else None."""
    return authorization[7:].strip() if authorization.lower().startswith("bearer ") else None


class AdminOnly:
    """With an admin key, every route but ``open_prefixes`` (``/health``; the agent proxy's under ``/agent/``,
    which checks its own keys) answers 401 without ``Authorization: Bearer KEY``: on a server with
    ``--admin-key`` nobody else may generate, pause the engine or load weights."""

    def __init__(self, app, key: str, open_prefixes: tuple[str, ...] = ("/health", "/agent/")):
        self.app, self.key, self.open_prefixes = app, key, open_prefixes

    async def __call__(self, scope, receive, send) -> None:
        import secrets

        if scope["type"] != "http" or scope["path"].startswith(self.open_prefixes):
            return await self.app(scope, receive, send)
        given = bearer(dict(scope.get("headers", ())).get(b"authorization", b"").decode("latin-1")) or ""
        if secrets.compare_digest(given.encode(), self.key.encode()):
            return await self.app(scope, receive, send)
        response = JSONResponse(
            error_body("this server has an admin key: send it as Authorization: Bearer KEY"), status_code=401
        )
        await response(scope, receive, send)


class BodyLimit:
    """Refuses a request body over ``max_bytes`` with a 413 before anything parses it: at once when its
    Content-Length says so, else as soon as the bytes received (a chunked body) pass the limit. Below the
    limit the body is read here (into at most ``max_bytes``) and handed on whole, unless it holds more than
    ``max_containers`` JSON arrays and objects (413 too: they are what makes parsing slow). After a 413, uvicorn
    discards whatever the client still sends, so the connection stays usable."""

    def __init__(self, app, max_bytes: int, max_containers: int, stall_s: float = BODY_STALL_S):
        self.app, self.max_bytes, self.max_containers, self.stall_s = app, max_bytes, max_containers, stall_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            return await self._refuse(scope, receive, send, f"{declared} bytes")
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), timeout=self.stall_s)
            except asyncio.TimeoutError:
                response = JSONResponse(
                    error_body(f"the request body sent nothing for {self.stall_s:g} s"),
                    status_code=408,
                    headers={"connection": "close"},
                )
                return await response(scope, receive, send)
            if message["type"] != "http.request":  # the client went away mid-body
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._refuse(scope, receive, send, f"more than {self.max_bytes} bytes")
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        containers = body.count(b"[") + body.count(b"{")
        if containers > self.max_containers:
            message = (
                f"request body holds {containers} JSON arrays and objects (counting brackets in strings), "
                f"more than the {self.max_containers} this server parses"
            )
            return await _answer(scope, receive, send, 413, message)
        delivered = False

        async def replay():
            nonlocal delivered
            if delivered:  # after the body, the app may only wait for the disconnect
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, scope, receive, send, size: str) -> None:
        await _answer(
            scope,
            receive,
            send,
            413,
            f"request body of {size} exceeds this server's limit of "
            f"{self.max_bytes} bytes (asyncrl serve --max-request-bytes)",
        )


async def _answer(scope, receive, send, status: int, message: str) -> None:
    await JSONResponse(error_body(message, "request_too_large"), status_code=status)(scope, receive, send)


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class CancelOnDisconnect:
    """Cancels a request to one of ``paths`` whose client goes away before its answer: the cancellation reaches
    the engine (``LocalEngine.submit``'s future), whose samples leave their slots at the next token boundary.
    Without it a client that timed out left its samples generating to ``max_new_tokens`` in slots that new
    requests waited for. ``on_cancel`` counts them."""

    def __init__(self, app, paths: tuple[str, ...], on_cancel: Callable[[], None] = lambda: None):
        self.app, self.paths, self.on_cancel = app, paths, on_cancel

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or _route_path(scope) not in self.paths:
            return await self.app(scope, receive, send)
        body_read, gone = asyncio.Event(), asyncio.Event()

        async def app_receive():
            if body_read.is_set():  # after the body, the app may only wait for the disconnect, which watch() reads
                await gone.wait()
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()
            elif not message.get("more_body", False):
                body_read.set()
            return message

        async def watch() -> None:
            await body_read.wait()
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        task, watcher = asyncio.ensure_future(self.app(scope, app_receive, send)), asyncio.ensure_future(watch())
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # this request is cancelled itself (the shutdown): the app answers it (503),
            watcher.cancel()  # and the request is over, as InternalErrors has it (re-raising logs a traceback)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return
        watcher.cancel()
        if task.done():
            return task.result()
        task.cancel()  # the client went away: nobody will read the answer
        self.on_cancel()
        await asyncio.gather(task, return_exceptions=True)


def _route_path(scope) -> str:
    """The request's path within this app (an app mounted at ``/agent`` sees ``/v1/...``)."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


class InternalErrors:
    """Answers an unexpected exception with a 500 that carries its message, and does not re-raise it.

    Why not ``app.exception_handler(Exception)``: Starlette runs that handler in its outermost middleware, which
    re-raises the exception after answering (so that servers can log it); uvicorn, seeing an exception after
    the response started, closes the connection. Every 500 then reset the client's keep-alive connection, and
    the remote client took a working server for a dead one. ``on_error`` counts them. A request cancelled by
    the shutdown gets a 503."""

    def __init__(self, app, on_error: Callable[[], None]):
        self.app, self.on_error = app, on_error

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            # only uvicorn cancels a request, when it is still running at the end of the shutdown grace period:
            # a 503 lets the client go elsewhere (instead of uvicorn's bare 500 and a logged traceback), and the
            # request is over either way
            if not started:
                response = JSONResponse(error_body("the server is shutting down", "unavailable"), status_code=503)
                await response(scope, receive, send)
        except Exception as e:  # noqa: BLE001 - any failure becomes a 500; the server keeps serving
            if started:  # part of a response is out: only closing the connection can tell the client
                raise
            log.exception("request %s failed", scope.get("path"))
            self.on_error()
            response = JSONResponse(error_body(f"{type(e).__name__}: {e}", "internal_error"), status_code=500)
            await response(scope, receive, send)
