"""The FastAPI application of ``asyncrl serve`` (routes and error answers) and the uvicorn server that runs it.

Error answers, all ``{"error": {"message", "type"}}``: 400 a request the engine cannot serve, 409 a weight
version going backwards, 413 a body over ``--max-request-bytes``, 422 a body that fails validation (the
message names the field), 503 while shutting down or when a weight update does not finish in time, 500
anything unexpected. None of them closes the connection, and the server keeps serving. A generating request whose
client goes away stops generating (its samples free their slots at the next token).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from asyncrl.server import render
from asyncrl.server.limits import HEADER_TIMEOUT_S, MAX_JSON_CONTAINERS, SHUTDOWN_GRACE_S
from asyncrl.server.middleware import BodyLimit, CancelOnDisconnect, InternalErrors
from asyncrl.server.net import bind
from asyncrl.server.schemas import (
    BadRequest,
    ChatRequest,
    CompletionRequest,
    DestroyGroup,
    GenerateRequest,
    InitGroup,
    PauseRequest,
    UpdateFromDisk,
    UpdateFromDistributed,
    sampling_params,
    stop_list,
)
from asyncrl.server.state import Conflict, ServerState, Unavailable, in_daemon_thread, version_arg

log = logging.getLogger(__name__)

GENERATING_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
"""Routes whose request stops generating when its client goes away (``CancelOnDisconnect``)."""

STATUS = {BadRequest: (400, "invalid_request_error"), Conflict: (409, "conflict"), Unavailable: (503, "unavailable")}


def build_app(state: ServerState) -> FastAPI:
    """The FastAPI application serving ``state.engine`` (which must be started)."""
    app = FastAPI(title="asyncrl serve")
    app.state.server = state
    _error_answers(app, state)
    _native_routes(app, state)
    _weight_routes(app, state)
    _openai_routes(app, state)
    return app


def _error_answers(app: FastAPI, state: ServerState) -> None:
    def count_error() -> None:
        state.internal_errors += 1

    def count_cancel() -> None:
        state.requests_cancelled += 1

    app.add_middleware(InternalErrors, on_error=count_error)
    app.add_middleware(CancelOnDisconnect, paths=GENERATING_PATHS, on_cancel=count_cancel)
    app.add_middleware(
        BodyLimit,
        max_bytes=state.max_request_bytes,  # added last: runs first
        max_containers=MAX_JSON_CONTAINERS,
    )

    async def known(request: Request, exc: Exception):
        status, kind = next(answer for error, answer in STATUS.items() if isinstance(exc, error))
        return JSONResponse(render.error_body(str(exc), kind), status_code=status)

    for kind in STATUS:
        app.add_exception_handler(kind, known)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        # FastAPI's own answer quotes the input, which may hold a NaN that JSON cannot carry (a 500 instead)
        errors = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in exc.errors()[:20]
        ]
        message = "; ".join(_describe(e) for e in exc.errors()[:5])
        return JSONResponse({**render.error_body(message), "detail": errors}, status_code=422)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):  # unknown route, wrong method, unreadable body
        return JSONResponse(render.error_body(str(exc.detail)), status_code=exc.status_code, headers=exc.headers)


def _describe(error: dict) -> str:
    """One validation error, naming its field: ``sampling_params.temperature: Input should be ...``."""
    loc = list(error.get("loc", ()))
    if error.get("type") == "json_invalid":
        return f"the body is not valid JSON: {error.get('ctx', {}).get('error', '')} (character {loc[-1]})"
    path = [str(p) for p in loc[1:]] if loc[:1] == ["body"] else [str(p) for p in loc]
    return f"{'.'.join(path) or 'body'}: {error.get('msg', '')}"


async def _json(build, *args) -> JSONResponse:
    """A JSON answer built (decoded, serialised) on a worker thread."""
    return await asyncio.to_thread(lambda: JSONResponse(build(*args)))


# ---- SGLang's native API ----------------------------------------------------------------------------------
def _native_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/get_model_info")
    async def model_info():
        e = state.engine
        return {
            "model_path": state.model_path,
            "tokenizer_path": state.model_path,
            "is_generation": True,
            "weight_version": str(e.version),
            "max_len": e.max_len,
            "max_slots": e.max_slots,
            "vocab_size": e.vocab_size,
            "max_request_bytes": state.max_request_bytes,
        }

    @app.get("/get_server_info")
    async def server_info():
        e = state.engine
        return {
            **dataclasses.asdict(e.stats()),
            "weight_version": str(e.version),
            "paused": e.paused,
            "running": e.n_running,
            "requests_completed": state.requests_completed,
            "requests_cancelled": state.requests_cancelled,
            "internal_errors": state.internal_errors,
            "interrupt_mode": e.interrupt_mode,
        }

    @app.post("/generate")
    async def generate(req: GenerateRequest):
        sp = req.sampling_params
        if (req.input_ids is None) == (req.text is None):
            raise BadRequest("give exactly one of input_ids and text")
        stops = stop_list(sp.stop)
        params = sampling_params(
            n=sp.n,
            max_new_tokens=sp.max_new_tokens,
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=sp.top_k,
            stop_token_ids=sp.stop_token_ids,
            ignore_eos=sp.ignore_eos,
            eos=state.eos,
            stop=stops,
            seed=sp.sampling_seed,
        )
        if req.text is not None:
            prompts = await state.encode([req.text] if isinstance(req.text, str) else req.text, "text")
            single = isinstance(req.text, str)
        else:
            single = not req.input_ids or isinstance(req.input_ids[0], int)
            prompts = [req.input_ids] if single else req.input_ids
        groups = await state.generate(prompts, params)

        def answer():
            out = render.native_results(state, groups, stops, req.return_logprob)
            return out[0] if single and len(out) == 1 else out

        return await _json(answer)

    @app.post("/pause_generation")
    async def pause(req: PauseRequest | None = None):
        mode = req.mode if req is not None else "abort"
        if mode not in ("abort", "in_place"):
            raise BadRequest(f"mode must be 'abort' or 'in_place', got '{mode[:40]}'")
        state.engine.pause()
        if mode == "abort":
            state.engine.abort()
        return {"success": True, "message": f"paused ({mode})"}

    @app.post("/continue_generation")
    async def resume():
        state.engine.resume()
        return {"success": True, "message": "continued"}


def _weight_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/update_weights_from_disk")
    async def update_from_disk(req: UpdateFromDisk):
        version = version_arg(req.weight_version)
        t0 = time.perf_counter()
        applied = await in_daemon_thread(state.update_from_disk, req.model_path, version)
        return {
            "success": True,
            "message": f"loaded {req.model_path} as version {applied} in {time.perf_counter() - t0:.3f}s",
            "weight_version": str(applied),
        }

    @app.post("/init_weights_update_group")
    async def init_group(req: InitGroup):
        if req.rank_offset >= req.world_size:
            raise BadRequest(f"rank_offset {req.rank_offset} must be below world_size {req.world_size}")
        if req.backend != "gloo":
            raise BadRequest(f"backend: this server receives weights over gloo (CPU), not '{req.backend[:40]}'")
        timeout = state.group_timeout_s
        join = in_daemon_thread(
            state.receiver.init_group,
            req.master_address,
            req.master_port,
            req.rank_offset,
            req.world_size,
            req.group_name,
            req.backend,
            timeout,
        )
        try:
            await asyncio.wait_for(join, timeout)
        except asyncio.TimeoutError as e:
            state.receiver.destroy(req.group_name)  # the join goes on in its thread, but will not install its group
            raise BadRequest(_join_failed(req, f"no answer within {timeout:g}s (--group-timeout)")) from e
        except (RuntimeError, ValueError, OSError) as e:  # torch's DistNetworkError is a RuntimeError
            raise BadRequest(_join_failed(req, str(e).strip().splitlines()[0] if str(e).strip() else repr(e))) from e
        return {"success": True, "message": f"joined '{req.group_name}' as rank {req.rank_offset}"}

    @app.post("/update_weights_from_distributed")
    async def update_from_distributed(req: UpdateFromDistributed):
        version = version_arg(req.weight_version)
        try:
            applied = await in_daemon_thread(
                state.receiver.receive, req.names, req.dtypes, req.shapes, req.group_name, version
            )
        except (KeyError, ValueError) as e:
            if isinstance(e, (BadRequest, Conflict)):
                raise
            raise BadRequest(str(e)) from e
        msg = f"applied version {applied}" if applied is not None else f"staged {len(req.names)} tensors"
        return {"success": True, "message": msg}

    @app.post("/destroy_weights_update_group")
    async def destroy_group(req: DestroyGroup | None = None):
        state.receiver.destroy(req.group_name if req is not None else None)
        return {"success": True, "message": "destroyed"}


def _join_failed(req: InitGroup, cause: str) -> str:
    return (
        f"could not join weight update group '{req.group_name}' at {req.master_address}:{req.master_port}: "
        f"{cause}; check master_address and master_port, and that the trainer is listening"
    )


# ---- OpenAI-compatible API --------------------------------------------------------------------------------
def _openai_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "owned_by": "asyncrl"}]}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        if req.stream or req.echo:
            raise BadRequest("stream and echo are not supported")
        prompt = req.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], str)):
            prompts = await state.encode([prompt] if isinstance(prompt, str) else prompt, "prompt")
        else:
            prompts = [prompt] if not prompt or isinstance(prompt[0], int) else prompt
        stops = stop_list(req.stop)
        params = sampling_params(
            n=req.n,
            max_new_tokens=req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            eos=state.eos,
            stop=stops,
            seed=req.seed,
        )
        groups = await state.generate(prompts, params)
        return await _json(render.completions, state, groups, stops, req.logprobs)

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest):
        if req.stream:
            raise BadRequest("stream is not supported")
        prompt = await state.chat_prompt([m.model_dump() for m in req.messages])
        stops = stop_list(req.stop)
        room = max(1, state.engine.max_len - len(prompt))  # no max_tokens: what the context has left, as OpenAI
        params = sampling_params(
            n=req.n,
            max_new_tokens=req.max_completion_tokens or req.max_tokens or room,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            eos=state.eos,
            stop=stops,
            seed=req.seed,
        )
        (group,) = await state.generate([prompt], params)
        return await _json(render.chat, state, group, stops, req.logprobs)


# ---- running the app --------------------------------------------------------------------------------------
def uvicorn_config(app, log_level: str = "warning") -> uvicorn.Config:
    """How every ``asyncrl serve`` runs: requests still running at shutdown get ``SHUTDOWN_GRACE_S``; a request
    whose headers take longer than ``HEADER_TIMEOUT_S`` loses its connection (``HeaderTimeout``)."""
    return uvicorn.Config(
        app, log_level=log_level, lifespan="off", timeout_graceful_shutdown=SHUTDOWN_GRACE_S, http=HeaderTimeout
    )


class HeaderTimeout(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for each request's line and headers: from the connection (or
    the end of the previous response) until a request starts. uvicorn itself waits for ever."""

    timeout_s = HEADER_TIMEOUT_S

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not before and self._deadline is not None:  # a request started: its headers are in
            self._deadline.cancel()
            self._deadline = None

    def connection_lost(self, exc) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self.timeout_s, self._expire)

    def _expire(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()


class Server(uvicorn.Server):
    """uvicorn's server that, on SIGTERM or SIGINT, also stops the engine at once: requests still running end
    with a 503 (so clients move on) instead of holding the shutdown until they finish."""

    def __init__(self, config: uvicorn.Config, engine):
        super().__init__(config)
        self.engine = engine

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        threading.Thread(target=self.engine.stop, name="asyncrl-stop", daemon=True).start()


class ServerThread:
    """An app served by uvicorn on a background thread of this process (tests, benches)."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        self.sock = bind(host, port)
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn_config(app))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True, name="asyncrl-http"
        )
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"HTTP server on {self.url} did not start")
            time.sleep(0.01)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()
