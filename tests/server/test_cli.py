"""Starting and stopping ``asyncrl serve`` (asyncrl.server.cli): bad flags, model paths and ports refused in one line,
the command without the serve extra, and SIGTERM stopping a busy server process within seconds."""

import argparse
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from asyncrl.engine.spawn import asyncrl_server, free_port
from asyncrl.server import cli

from timing_for_tests import loaded


# ---- shutting down -----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sigterm_stops_a_busy_server_process_within_seconds(tmp_path):
    """A server generating and stuck joining a weight group exits with status 0 a few seconds after SIGTERM;
    both requests are answered with a 503."""
    server = asyncrl_server(
        "builtin:tiny-sft",
        "--max-slots",
        "4",
        "--max-len",
        "2048",
        "--group-timeout",
        "60",
        log_path=str(tmp_path / "server.log"),
    )
    try:
        answers = {}

        def post(name, path, body):
            try:
                answers[name] = httpx.post(f"{server.url}{path}", json=body, timeout=60).status_code
            except httpx.HTTPError as e:
                answers[name] = type(e).__name__

        # a rendezvous that accepts the join's connection and never answers it: the join is then surely in flight
        rendezvous = socket.create_server(("127.0.0.1", 0))
        rendezvous.settimeout(30)
        stuck = {
            "master_address": "127.0.0.1",
            "master_port": rendezvous.getsockname()[1],
            "rank_offset": 1,
            "world_size": 2,
        }
        long = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2000, "n": 4, "ignore_eos": True}}
        calls = [
            threading.Thread(target=post, args=("join", "/init_weights_update_group", stuck)),
            threading.Thread(target=post, args=("generate", "/generate", long)),
        ]
        calls[0].start()
        joining, _ = rendezvous.accept()
        calls[1].start()
        deadline = time.monotonic() + 30
        while httpx.get(f"{server.url}/get_server_info").json()["generated_tokens"] == 0:
            assert time.monotonic() < deadline, "generation never started"
            time.sleep(0.05)
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(timeout=15)
        assert code == 0 and time.monotonic() - t0 < loaded(8.0)
        for t in calls:
            t.join(timeout=30)
        assert answers == {"generate": 503, "join": 503}  # failed by the stopped engine; cancelled at the grace end
        joining.close()
        rendezvous.close()
    finally:
        server.close()


# ---- start-up ----------------------------------------------------------------------------------------------
def _run(capsys, *flags: str) -> tuple[int, list[str]]:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    code = cli.run(parser.parse_args(["--port", str(free_port()), *flags]))
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--max-slots", "0"], "--max-slots"),
        (["--max-len", "0"], "--max-len"),
        (["--max-len", "1"], "--max-len"),
        (["--port", "70000"], "--port"),
        (["--threads", "0"], "--threads"),
        (["--weight-version", "-1"], "--weight-version"),
        (["--max-request-bytes", "10"], "--max-request-bytes"),
        (["--group-timeout", "0"], "--group-timeout"),
        (["--update-timeout", "nan"], "--update-timeout"),
        (["--max-len", "100000"], "lower --max-len or --max-slots"),
    ],
)
def test_bad_flags_are_refused_in_one_line(capsys, monkeypatch, flags, needle):
    monkeypatch.setattr("asyncrl.server.state.physical_memory", lambda: 16 << 30)
    code, lines = _run(capsys, "--model", "builtin:tiny-sft", *flags)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("asyncrl serve: error: ") and needle in lines[0]


def test_bad_model_paths_are_refused_in_one_line(capsys, tmp_path):
    for model, needle in [
        (str(tmp_path / "missing"), "does not exist"),
        (str(tmp_path), "config.json"),
        ("builtin:nope", "no built-in model"),
    ]:
        code, lines = _run(capsys, "--model", model)
        assert code == 2 and len(lines) == 1 and needle in lines[0], lines


def test_a_port_in_use_is_refused_in_one_line(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        code, lines = _run(capsys, "--model", "builtin:tiny-sft", "--port", port)
    assert code == 2 and len(lines) == 1 and f"cannot listen on 127.0.0.1:{port}" in lines[0], lines


def test_the_cli_module_imports_and_explains_without_the_serve_extra():
    script = (
        "import argparse, sys\n"
        "sys.modules.update(fastapi=None, uvicorn=None, pydantic=None, starlette=None)\n"
        "from asyncrl.server.cli import add_arguments, run\n"
        "p = argparse.ArgumentParser()\n"
        "add_arguments(p)\n"
        "sys.exit(run(p.parse_args(['--model', 'builtin:tiny-sft'])))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "asyncrl serve: error: needs the 'serve' extra (fastapi, uvicorn): pip install 'asyncrl[serve]'\n"
    )
