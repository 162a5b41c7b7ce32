"""``asyncrl serve``: the built-in engine behind HTTP.

Two APIs on one port:

- SGLang's native API, the one AReaL's client speaks: ``POST /generate`` (``input_ids`` or ``text``,
  ``sampling_params``, ``return_logprob``), ``/pause_generation`` (``mode``: ``abort`` ends running requests
  with finish reason ``abort``, ``in_place`` holds them at a token boundary), ``/continue_generation``,
  ``/update_weights_from_disk``, ``/init_weights_update_group`` + ``/update_weights_from_distributed`` +
  ``/destroy_weights_update_group`` (the gloo transport of ``asyncrl.publish``), ``GET /health``,
  ``/get_model_info``, ``/get_server_info``. Each ``/generate`` result also carries
  ``meta_info.output_token_versions``: the weight version of every output token.
- OpenAI's ``/v1/completions``, ``/v1/chat/completions`` and ``/v1/models`` (no streaming).

A malformed request gets a 4xx with a message (422 from schema validation, 400 from the engine's checks);
an unexpected failure a 500 with the error; the server keeps serving. It binds 127.0.0.1 unless told
otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from asyncrl.engine.local import NO_STOP_TOKENS, LocalEngine
from asyncrl.types import Completion, SamplingParams, WeightUpdate

log = logging.getLogger(__name__)



# ---- request schemas (fields of other servers' APIs are accepted and ignored) ---------------------------
class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class NativeSampling(_Lenient):
    max_new_tokens: int = Field(128, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False


class GenerateRequest(_Lenient):
    input_ids: list[int] | list[list[int]] | None = None
    text: str | list[str] | None = None
    sampling_params: NativeSampling = Field(default_factory=NativeSampling)
    return_logprob: bool = False
    rid: str | list[str] | None = None


class PauseRequest(_Lenient):
    mode: str = "abort"


class UpdateFromDisk(_Lenient):
    model_path: str
    weight_version: str | int | None = None


class InitGroup(_Lenient):
    master_address: str
    master_port: int
    rank_offset: int = Field(ge=1)
    world_size: int = Field(ge=2)
    group_name: str = "weight_update_group"
    backend: str = "gloo"


class UpdateFromDistributed(_Lenient):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str | None = None
    weight_version: str | int | None = None


class DestroyGroup(_Lenient):
    group_name: str | None = None


class CompletionRequest(_Lenient):
    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    logprobs: int | None = Field(None, ge=0)
    stream: bool = False
    echo: bool = False


class Message(_Lenient):
    role: str
    content: str


class ChatRequest(_Lenient):
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    logprobs: bool = False
    stream: bool = False


class BadRequest(ValueError):
    """A request the server understood but cannot serve (400)."""


def _stop_list(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if any(not s for s in stops):
        raise BadRequest("stop strings must be non-empty")
    return stops


def sampling_params(*, n: int, max_new_tokens: int, temperature: float, top_p: float, top_k: int,
                    stop_token_ids: list[int] | None = None, ignore_eos: bool = False,
                    eos: tuple[int, ...] = (), stop: tuple[str, ...] = ()) -> SamplingParams:
    """Engine sampling parameters from an API's fields: temperature 0 means greedy, top_k -1 or 0 means off,
    the model's end-of-sequence tokens stop a sample unless ``ignore_eos``."""
    stops = tuple(t for t in stop_token_ids or () if t >= 0) + (() if ignore_eos else eos)
    try:
        return SamplingParams(n=n, max_new_tokens=max_new_tokens, temperature=temperature or 1.0,
                              top_p=top_p, top_k=max(top_k, 0), greedy=temperature == 0,
                              stop_token_ids=stops or NO_STOP_TOKENS, stop=stop)
    except ValueError as e:
        raise BadRequest(str(e)) from e


def trim_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, str | None]:
    """The text before the first stop string it contains, and that string (None if none)."""
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return text, None
    at, s = min(hits)
    return text[:at], s


# ---- the app ----------------------------------------------------------------------------------------------
@dataclass
class ServerState:
    engine: LocalEngine
    tokenizer: Any
    model_name: str
    model_path: str
    update_timeout_s: float = 600.0

    def __post_init__(self):
        from asyncrl.publish import DistReceiver

        self.eos = tuple(self.engine.default_stop)
        self.receiver = DistReceiver(self._apply_state_dict)
        self.update_lock = threading.Lock()
        self.requests_completed = 0

    def _apply_state_dict(self, state_dict: dict, version: int) -> None:
        self.engine.update_weights(WeightUpdate(version, state_dict=state_dict), timeout=self.update_timeout_s)

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise BadRequest("this server has no tokenizer: send token ids")
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def decode(self, ids: list[int]) -> str:
        return "" if self.tokenizer is None else self.tokenizer.decode(ids, skip_special_tokens=True)

    async def run(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        try:
            future = self.engine.submit(prompt_ids, params)
        except ValueError as e:
            raise BadRequest(str(e)) from e
        result = await asyncio.wrap_future(future)
        self.requests_completed += 1
        return result

    def update_from_disk(self, path: str, version: int | None) -> int:
        if not os.path.isdir(path):
            raise BadRequest(f"model_path '{path}' is not a directory")
        with self.update_lock:
            version = self.engine.version + 1 if version is None else version
            self.engine.update_weights(WeightUpdate(version, path=path), timeout=self.update_timeout_s)
        return version


def build_app(state: ServerState):
    """The FastAPI application serving ``state.engine`` (which must be started)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    app = FastAPI(title="asyncrl serve")
    app.state.server = state

    @app.exception_handler(BadRequest)
    async def _bad_request(request: Request, exc: BadRequest):
        return JSONResponse(status_code=400, content=_error(str(exc)))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):  # the server stays up
        log.exception("request %s failed", request.url.path)
        return JSONResponse(status_code=500, content=_error(f"{type(exc).__name__}: {exc}", "internal_error"))

    # ---- SGLang native API -------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/get_model_info")
    async def model_info():
        e = state.engine
        return {"model_path": state.model_path, "tokenizer_path": state.model_path, "is_generation": True,
                "weight_version": str(e.version), "max_len": e.max_len, "max_slots": e.max_slots,
                "vocab_size": e.vocab_size}

    @app.get("/get_server_info")
    async def server_info():
        e = state.engine
        return {**dataclasses.asdict(e.stats()), "weight_version": str(e.version), "paused": e.paused, "running": e.n_running,
                "requests_completed": state.requests_completed, "interrupt_mode": e.interrupt_mode}

    @app.post("/generate")
    async def generate(req: GenerateRequest):
        sp = req.sampling_params
        prompts, single = _native_prompts(state, req.input_ids, req.text)
        stops = _stop_list(sp.stop)
        params = sampling_params(n=sp.n, max_new_tokens=sp.max_new_tokens, temperature=sp.temperature,
                                 top_p=sp.top_p, top_k=sp.top_k, stop_token_ids=sp.stop_token_ids,
                                 ignore_eos=sp.ignore_eos, eos=state.eos, stop=stops)
        groups = await asyncio.gather(*(state.run(p, params) for p in prompts))
        out = [_native_result(state, c, stops, req.return_logprob) for group in groups for c in group]
        return out[0] if single and len(out) == 1 else out

    @app.post("/pause_generation")
    async def pause(req: PauseRequest | None = None):
        mode = req.mode if req is not None else "abort"
        if mode not in ("abort", "in_place"):
            raise BadRequest(f"pause mode must be 'abort' or 'in_place', got '{mode}'")
        state.engine.pause()
        if mode == "abort":
            state.engine.abort()
        return {"success": True, "message": f"paused ({mode})"}

    @app.post("/continue_generation")
    async def resume():
        state.engine.resume()
        return {"success": True, "message": "continued"}

    @app.post("/update_weights_from_disk")
    async def update_from_disk(req: UpdateFromDisk):
        version = _version_arg(req.weight_version)
        t0 = time.perf_counter()
        try:
            applied = await asyncio.to_thread(state.update_from_disk, req.model_path, version)
        except (FileNotFoundError, KeyError, ValueError) as e:
            if isinstance(e, BadRequest):
                raise
            raise BadRequest(f"could not load weights from '{req.model_path}': {e}") from e
        return {"success": True, "message": f"loaded {req.model_path} as version {applied} "
                f"in {time.perf_counter() - t0:.3f}s", "weight_version": str(applied)}

    @app.post("/init_weights_update_group")
    async def init_group(req: InitGroup):
        try:
            await asyncio.to_thread(state.receiver.init_group, req.master_address, req.master_port,
                                    req.rank_offset, req.world_size, req.group_name, req.backend,
                                    state.update_timeout_s)
        except ValueError as e:
            raise BadRequest(str(e)) from e
        return {"success": True, "message": f"joined '{req.group_name}' as rank {req.rank_offset}"}

    @app.post("/update_weights_from_distributed")
    async def update_from_distributed(req: UpdateFromDistributed):
        version = _version_arg(req.weight_version)
        try:
            applied = await asyncio.to_thread(state.receiver.receive, req.names, req.dtypes, req.shapes,
                                              req.group_name, None if version is None else str(version))
        except (KeyError, ValueError) as e:
            raise BadRequest(str(e)) from e
        msg = f"applied version {applied}" if applied is not None else f"staged {len(req.names)} tensors"
        return {"success": True, "message": msg}

    @app.post("/destroy_weights_update_group")
    async def destroy_group(req: DestroyGroup | None = None):
        state.receiver.destroy(req.group_name if req is not None else None)
        return {"success": True, "message": "destroyed"}

    # ---- OpenAI-compatible API ---------------------------------------------------------------------------
    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "owned_by": "asyncrl"}]}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        if req.stream or req.echo:
            raise BadRequest("stream and echo are not supported")
        prompts, _ = _openai_prompts(state, req.prompt)
        stops = _stop_list(req.stop)
        params = sampling_params(n=req.n, max_new_tokens=req.max_tokens, temperature=req.temperature,
                                 top_p=req.top_p, top_k=req.top_k, eos=state.eos, stop=stops)
        groups = await asyncio.gather(*(state.run(p, params) for p in prompts))
        choices = []
        for c in (c for g in groups for c in g):
            text, _ = trim_at_stop(state.decode(c.output_ids), stops)
            choice = {"index": len(choices), "text": text, "finish_reason": _openai_reason(c),
                      "logprobs": None, "token_ids": c.output_ids}
            if req.logprobs is not None:
                tokens = [state.decode([t]) for t in c.output_ids]
                offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": c.logprobs,
                                      "top_logprobs": [{t: lp} for t, lp in zip(tokens, c.logprobs)],
                                      "text_offset": offsets}
            choices.append(choice)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": state.model_name, "choices": choices, "usage": _usage(groups)}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest):
        if req.stream:
            raise BadRequest("stream is not supported")
        if state.tokenizer is None or not getattr(state.tokenizer, "chat_template", None):
            raise BadRequest("this server's tokenizer has no chat template")
        text = state.tokenizer.apply_chat_template([m.model_dump() for m in req.messages],
                                                   add_generation_prompt=True, tokenize=False)
        stops = _stop_list(req.stop)
        params = sampling_params(n=req.n, max_new_tokens=req.max_completion_tokens or req.max_tokens or 256,
                                 temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, eos=state.eos,
                                 stop=stops)
        group = await state.run(state.encode(text), params)
        choices = []
        for i, c in enumerate(group):
            content, _ = trim_at_stop(state.decode(c.output_ids), stops)
            logprobs = None
            if req.logprobs:
                logprobs = {"content": [{"token": state.decode([t]), "logprob": lp, "top_logprobs": []}
                                        for t, lp in zip(c.output_ids, c.logprobs)]}
            choices.append({"index": i, "message": {"role": "assistant", "content": content},
                            "finish_reason": _openai_reason(c), "logprobs": logprobs})
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": state.model_name, "choices": choices, "usage": _usage([group])}

    return app


def _error(message: str, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind}}


def _version_arg(v: str | int | None) -> int | None:
    if v is None:
        return None
    try:
        return int(v)
    except ValueError as e:
        raise BadRequest(f"weight_version must be an integer, got '{v}'") from e


def _native_prompts(state: ServerState, input_ids, text) -> tuple[list[list[int]], bool]:
    if (input_ids is None) == (text is None):
        raise BadRequest("give exactly one of input_ids and text")
    if text is not None:
        texts = [text] if isinstance(text, str) else text
        return [state.encode(t) for t in texts], isinstance(text, str)
    if not input_ids:
        raise BadRequest("input_ids is empty")
    if isinstance(input_ids[0], int):
        return [input_ids], True
    return input_ids, False


def _openai_prompts(state: ServerState, prompt) -> tuple[list[list[int]], bool]:
    if isinstance(prompt, str):
        return [state.encode(prompt)], True
    if not prompt:
        raise BadRequest("prompt is empty")
    if isinstance(prompt[0], int):
        return [prompt], True
    if isinstance(prompt[0], str):
        return [state.encode(p) for p in prompt], False
    return prompt, False


def _native_result(state: ServerState, c: Completion, stops: tuple[str, ...], return_logprob: bool) -> dict:
    text, matched = trim_at_stop(state.decode(c.output_ids), stops)
    if c.finish_reason == "stop":
        reason = {"type": "stop", "matched": matched if matched is not None else c.output_ids[-1]}
    elif c.finish_reason == "length":
        reason = {"type": "length", "length": len(c.output_ids)}
    else:
        reason = {"type": "abort", "message": "aborted by pause_generation or a weight update"}
    meta = {"id": uuid.uuid4().hex, "finish_reason": reason, "prompt_tokens": len(c.prompt_ids),
            "completion_tokens": len(c.output_ids), "cached_tokens": 0,
            "weight_version": str(c.versions[-1] if c.versions else state.engine.version),
            "output_token_versions": c.versions}
    if return_logprob:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(c.logprobs, c.output_ids)]
    return {"text": text, "output_ids": c.output_ids, "meta_info": meta}


def _openai_reason(c: Completion) -> str:
    return c.finish_reason if c.finish_reason in ("stop", "length") else "abort"


def _usage(groups: list[list[Completion]]) -> dict:
    prompt = sum(len(g[0].prompt_ids) for g in groups if g)
    completion = sum(len(c.output_ids) for g in groups for c in g)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


# ---- running a server -------------------------------------------------------------------------------------
def load_state(model: str, *, max_slots: int = 64, max_len: int | None = None, dtype: str = "float32",
               threads: int = 1, interrupt_mode: str = "recompute", seed: int = 0, name: str | None = None,
               version: int = 0, native_kernels: bool = True) -> ServerState:
    """Load a checkpoint into a started ``LocalEngine`` and wrap it for serving."""
    import torch

    from asyncrl.models import DTYPES, load_model, resolve_model_path

    path = resolve_model_path(model)
    torch.set_num_threads(threads)
    hf = load_model(path)
    tokenizer = _load_tokenizer_if_any(path)
    eos = _eos_ids(hf, tokenizer)
    max_len = max_len or min(hf.config.max_position_embeddings, 2048)
    engine = LocalEngine(hf, max_slots=max_slots, max_len=max_len, dtype=DTYPES[dtype], seed=seed,
                         interrupt_mode=interrupt_mode, stop_token_ids=eos, threads=threads, tokenizer=tokenizer,
                         version=version, native_kernels=native_kernels)
    del hf
    return ServerState(engine.start(), tokenizer, name or os.path.basename(path.rstrip("/")), path)


def _load_tokenizer_if_any(path: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        log.warning("no tokenizer in %s (%s): the server takes token ids only", path, e)
        return None


def _eos_ids(model, tokenizer) -> tuple[int, ...]:
    ids = getattr(model.generation_config, "eos_token_id", None) or getattr(model.config, "eos_token_id", None)
    if ids is None and tokenizer is not None:
        ids = tokenizer.eos_token_id
    if ids is None:
        return ()
    return tuple(ids) if isinstance(ids, (list, tuple)) else (int(ids),)


class ServerThread:
    """An app served by uvicorn on a background thread of this process (tests, benches)."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                       name="asyncrl-http")
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


def main(argv: list[str]) -> int:
    """``asyncrl serve --model PATH --port N [...]``: serve until interrupted."""
    p = argparse.ArgumentParser(prog="asyncrl serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="checkpoint directory or builtin:NAME")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--max-slots", type=int, default=64, help="sequences decoded at once")
    p.add_argument("--max-len", type=int, default=None, help="prompt + output tokens per sequence")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--threads", type=int, default=1, help="torch threads of the engine")
    p.add_argument("--interrupt-mode", default="recompute", choices=["recompute", "abort"],
                   help="in-flight requests on a weight update: re-prefill and continue, or end with 'abort'")
    p.add_argument("--no-native-kernels", dest="native_kernels", action="store_false",
                   help="decode through torch alone, without the compiled float32 kernels (docs/engine.md)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--weight-version", type=int, default=0, help="version of the weights loaded at start")
    p.add_argument("--log-level", default="warning")
    args = p.parse_args(argv[1:] if argv[:1] == ["--"] else argv)  # `asyncrl serve -- --model ...`
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import uvicorn
    except ImportError:
        print("asyncrl serve needs the serve extra: pip install 'asyncrl[serve]'", file=sys.stderr)
        return 2
    state = load_state(args.model, max_slots=args.max_slots, max_len=args.max_len, dtype=args.dtype,
                       threads=args.threads, interrupt_mode=args.interrupt_mode, seed=args.seed,
                       name=args.served_model_name, version=args.weight_version,
                       native_kernels=args.native_kernels)
    log.info("serving %s on http://%s:%d", state.model_path, args.host, args.port)
    try:
        uvicorn.run(build_app(state), host=args.host, port=args.port, log_level=args.log_level)
    finally:
        state.engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
