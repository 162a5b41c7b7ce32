"""``asyncrl serve``: its flags, the start-up checks and serving until SIGTERM/SIGINT.

This module imports only the standard library (and ``limits``), so that the main CLI can add these flags, and
say which extra is missing, without fastapi, uvicorn or pydantic installed. Every refusal to start is one line
on stderr, ``asyncrl serve: error: <problem and fix>``, and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import os
import signal
import socket
import sys

from asyncrl.server import limits
from asyncrl.server.net import bind

PROG = "asyncrl serve"
EXTRA = ("fastapi", "uvicorn", "pydantic")
log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``asyncrl serve``."""
    p = parser
    p.add_argument("--model", required=True, help="checkpoint directory or builtin:NAME")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="port to listen on, 1..65535 (default 30000)")
    p.add_argument("--max-slots", type=int, default=64, help="sequences decoded at once")
    p.add_argument(
        "--max-len",
        type=int,
        default=None,
        help="prompt + output tokens per sequence (default: the model's, at most 2048)",
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--threads", type=int, default=1, help="torch threads of the engine")
    p.add_argument("--device", default="cpu", help="where the weights and the KV cache live: cpu | cuda | cuda:N")
    p.add_argument(
        "--interrupt-mode",
        default="recompute",
        choices=["recompute", "abort"],
        help="in-flight requests on a weight update: re-prefill and continue, or end with 'abort'",
    )
    p.add_argument(
        "--no-native-kernels",
        dest="native_kernels",
        action="store_false",
        help="decode through torch alone, without the compiled float32 kernels (docs/engine.md)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--weight-version", type=int, default=0, help="version of the weights loaded at start")
    p.add_argument(
        "--max-request-bytes",
        type=int,
        default=limits.MAX_REQUEST_BYTES,
        help=f"larger request bodies are refused with 413 (default {limits.MAX_REQUEST_BYTES})",
    )
    p.add_argument(
        "--update-timeout",
        type=float,
        default=limits.UPDATE_TIMEOUT_S,
        help="seconds to load or receive one weight version (default %(default)s)",
    )
    p.add_argument(
        "--group-timeout",
        type=float,
        default=limits.GROUP_TIMEOUT_S,
        help="seconds to join a weight update group (default %(default)s)",
    )
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug", "trace"])
    agent = p.add_argument_group("agent proxy (docs/agents.md)")
    agent.add_argument(
        "--agent-proxy",
        action="store_true",
        help="also serve the recording OpenAI-compatible agent proxy under /agent/v1, with sessions "
        "opened and ended by the admin (POST /agent/rl/sessions, /agent/rl/sessions/KEY/end)",
    )
    agent.add_argument(
        "--admin-key",
        default=None,
        help="the key of the proxy's session routes (required for it); "
        "with it, the engine's routes need it too (Authorization: Bearer KEY), /health aside",
    )
    agent.add_argument("--tool-parser", default="hermes", help="hermes | llama3_json | none")
    agent.add_argument(
        "--agent-temperature",
        type=float,
        default=1.0,
        help="the proxy's sampling temperature (requests' own are ignored: the recorded log-probs "
        "must be those of the training distribution)",
    )
    agent.add_argument("--agent-max-tokens", type=int, default=512, help="most tokens per proxy call")


def run(args: argparse.Namespace) -> int:
    """Serve ``args`` until SIGTERM/SIGINT (exit status 0), or refuse to start in one line (2)."""
    missing = [m for m in EXTRA if importlib.util.find_spec(m) is None]
    if missing:
        return refuse("needs the 'serve' extra (fastapi, uvicorn): pip install 'asyncrl[serve]'")
    problem = _flag_problem(args)
    if problem:
        return refuse(problem)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        return refuse(f"cannot listen on {args.host}:{args.port} ({e.strerror or e}): choose another --port or --host")
    from asyncrl.server.state import StartupError, load_state

    try:
        state = load_state(
            args.model,
            max_slots=args.max_slots,
            max_len=args.max_len,
            dtype=args.dtype,
            threads=args.threads,
            interrupt_mode=args.interrupt_mode,
            seed=args.seed,
            name=args.served_model_name,
            version=args.weight_version,
            native_kernels=args.native_kernels,
            device=args.device,
            update_timeout_s=args.update_timeout,
            group_timeout_s=args.group_timeout,
            max_request_bytes=args.max_request_bytes,
        )
    except StartupError as e:
        sock.close()
        return refuse(str(e))
    try:
        return _serve(state, sock, args)
    except StartupError as e:  # the agent proxy could not be built on this model
        state.engine.stop()
        sock.close()
        return refuse(str(e))


def _flag_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the flag values, with the fix, or None."""
    checks = [
        (1 <= args.port <= 65535, f"--port must lie in 1..65535, got {args.port}"),
        (args.max_slots >= 1, f"--max-slots must be at least 1 (sequences decoded at once), got {args.max_slots}"),
        (
            args.max_len is None or args.max_len >= 2,
            f"--max-len must be at least 2 (one prompt token and one output token), got {args.max_len}",
        ),
        (args.threads >= 1, f"--threads must be at least 1, got {args.threads}"),
        (
            0 <= args.weight_version <= limits.MAX_VERSION,
            f"--weight-version must lie in [0, 2**63 - 1], got {args.weight_version}",
        ),
        (args.max_request_bytes >= 1024, f"--max-request-bytes must be at least 1024, got {args.max_request_bytes}"),
        (
            math.isfinite(args.update_timeout) and args.update_timeout > 0,
            f"--update-timeout must be a positive number of seconds, got {args.update_timeout}",
        ),
        (
            math.isfinite(args.group_timeout) and args.group_timeout > 0,
            f"--group-timeout must be a positive number of seconds, got {args.group_timeout}",
        ),
        (
            not args.agent_proxy or bool(args.admin_key),
            "--agent-proxy needs --admin-key: its session routes hand out keys to the engine",
        ),
        (
            args.tool_parser in ("hermes", "llama3_json", "none"),
            f"--tool-parser must be hermes, llama3_json or none, got '{args.tool_parser}'",
        ),
        (
            math.isfinite(args.agent_temperature) and args.agent_temperature >= 1e-4,
            f"--agent-temperature must be a finite number >= 1e-4, got {args.agent_temperature}",
        ),
        (args.agent_max_tokens >= 1, f"--agent-max-tokens must be at least 1, got {args.agent_max_tokens}"),
    ]
    return next((message for ok, message in checks if not ok), None)


def refuse(message: str) -> int:
    """Say why the server does not start, in one line on stderr; the exit status 2."""
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def _agent_proxy(state, args: argparse.Namespace):
    """The agent proxy over this server's engine, with a tokenizer of its own (it tokenises on a thread of its own
    while the server's routes tokenise on worker threads)."""
    import copy

    from asyncrl.agent.chat import ChatRenderer, TemplateError
    from asyncrl.agent.proxy import AgentProxy
    from asyncrl.server.agent import build_app as proxy_app
    from asyncrl.server.state import StartupError
    from asyncrl.types import SamplingParams

    if state.tokenizer is None or not state.engine.default_stop:
        raise StartupError(
            "--agent-proxy needs the model's tokenizer, with a chat template and an end-of-sequence "
            "token, in the model directory"
        )
    try:
        renderer = ChatRenderer(copy.deepcopy(state.tokenizer), state.engine.default_stop[0])
    except TemplateError as e:
        raise StartupError(f"--agent-proxy: {e}") from e
    params = SamplingParams(
        max_new_tokens=args.agent_max_tokens,
        temperature=args.agent_temperature,
        stop_token_ids=state.engine.default_stop,
    )
    proxy = AgentProxy(
        renderer,
        params,
        state.engine.max_len,
        tool_parser=args.tool_parser,
        model_name=state.model_name,
        engine=state.engine,
        max_chars=state.max_chars,  # what the context can hold: refused before it is tokenised
    )
    return proxy_app(proxy, args.admin_key, sessions=True)


def _serve(state, sock: socket.socket, args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT: the engine stops at once (running generations end with a 503), other requests
    get ``limits.SHUTDOWN_GRACE_S`` to finish (then a 503 too), and the exit status is 0."""
    from asyncrl.server.app import Server, build_app, uvicorn_config

    app = build_app(state)
    if args.agent_proxy:
        app.mount("/agent", _agent_proxy(state, args))
    if args.admin_key:  # the engine's routes need it too (the proxy's check their episode keys)
        from asyncrl.server.middleware import AdminOnly

        app = AdminOnly(app, args.admin_key)
    server = Server(uvicorn_config(app, args.log_level), state.engine)
    # uvicorn re-raises the signal it caught once it has shut down; with this handler (not the default action,
    # which would end the process by the signal) that only asks for the exit already done
    previous = {sig: signal.signal(sig, server.handle_exit) for sig in (signal.SIGTERM, signal.SIGINT)}
    log.info("serving %s on http://%s:%d", state.model_path, args.host, args.port)
    try:
        server.run(sockets=[sock])
    finally:
        state.engine.stop()
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
