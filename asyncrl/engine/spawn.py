"""Starting servers as child processes: ``asyncrl serve`` (rollout.backend asyncrl:dN, tests, benches)
or any command that serves ``/health``, on a free 127.0.0.1 port, always ended by ``close``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time


def die_with_parent(sig: int = signal.SIGTERM):
    """A ``preexec_fn`` that has the child sent ``sig`` when the thread that started it ends (its process
    killed, even by SIGKILL): what a run starts does not outlive it. Linux only; elsewhere nothing."""

    def tie() -> None:
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    return tie


class ServerProcess:
    """A server in a child process; ``close`` always ends it (terminate, then kill), and so does the end of
    the thread that made it (start servers from a thread that lives as long as they should: the main one)."""

    def __init__(
        self,
        cmd: list[str],
        url: str,
        startup_timeout_s: float = 120.0,
        env: dict | None = None,
        log_path: str | None = None,
        wait: bool = True,
    ):
        self.url, self.startup_timeout_s = url, startup_timeout_s
        self._log = open(log_path, "ab") if log_path else subprocess.DEVNULL
        # a session of its own, so that close/kill reach the server's own children too (vLLM's engine core)
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            preexec_fn=die_with_parent(),
        )
        if wait:
            self.wait_healthy()

    def wait_healthy(self) -> "ServerProcess":
        """Block until the server answers ``/health`` (ending it if it does not in time)."""
        try:
            wait_healthy(self.url, self.startup_timeout_s, self.proc)
        except BaseException:
            self.close()
            raise
        return self

    def kill(self) -> None:
        """End the server and its children at once (SIGKILL), as a crash would."""
        self._signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self) -> None:
        """Ask the server to exit (SIGTERM); kill it if it has not within 15 s."""
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._signal(signal.SIGKILL)  # whatever of its session is left
        if self._log is not subprocess.DEVNULL:
            self._log.close()
            self._log = subprocess.DEVNULL

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Poll ``url/health`` until it answers 200; raise naming the URL if it does not within ``timeout_s``."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server for {url} exited with code {proc.returncode} during start-up")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"server {url} not healthy within {timeout_s}s")


def asyncrl_server(
    model: str,
    *args: str,
    port: int | None = None,
    startup_timeout_s: float = 120.0,
    log_path: str | None = None,
    wait: bool = True,
    env: dict | None = None,
    host: str = "127.0.0.1",
) -> ServerProcess:
    """``asyncrl serve --model MODEL ARGS`` on ``host`` (healthy when this returns, if ``wait``)."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "asyncrl.server", "--model", model, "--host", host, "--port", str(port), *args]
    return ServerProcess(cmd, f"http://{host}:{port}", startup_timeout_s, env=env, log_path=log_path, wait=wait)


VLLM_FLAGS = ("--logprobs-mode", "processed_logprobs", "--enable-scale-out")
"""What the remote client needs from a vLLM (>= 0.32) server besides ``VLLM_SERVER_DEV_MODE=1``: the
token-in/token-out ``/inference/v1/generate`` (``--enable-scale-out``) and log-probs of the distribution tokens
are sampled from (``processed_logprobs``: after temperature/top-k/top-p). On the CPU also ``--enforce-eager``
and float32."""

VLLM_ENV = {
    "VLLM_SERVER_DEV_MODE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
"""Environment of a vLLM-CPU server: the dev-mode routes (``/pause``, ``/resume``, ``/collective_rpc``,
``/update_weight_version``) and a 1 GiB KV cache."""


def vllm_server(
    python: str,
    model: str,
    *args: str,
    port: int | None = None,
    threads: int = 1,
    max_model_len: int = 512,
    startup_timeout_s: float = 300.0,
    log_path: str | None = None,
    wait: bool = True,
    env: dict | None = None,
    dtype: str = "float32",
    host: str = "127.0.0.1",
    on_gpu: bool | None = None,
) -> ServerProcess:
    """A vLLM OpenAI server (``python`` is the interpreter of its environment) with ``VLLM_FLAGS`` on ``host``;
    on the CPU (``on_gpu`` False; None: whether ``env`` names GPUs) eager, with ``threads`` threads."""
    port = port or free_port()
    on_gpu = bool((env or {}).get("CUDA_VISIBLE_DEVICES")) if on_gpu is None else on_gpu
    cmd = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--host",
        host,
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--dtype",
        dtype,
        *VLLM_FLAGS,
        *([] if on_gpu else ["--enforce-eager"]),
        *args,
    ]
    env = {**VLLM_ENV, "OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": "nobind", **(env or {})}
    return ServerProcess(cmd, f"http://{host}:{port}", startup_timeout_s, env=env, log_path=log_path, wait=wait)


def sglang_server(
    python: str,
    model: str,
    *args: str,
    port: int | None = None,
    startup_timeout_s: float = 600.0,
    log_path: str | None = None,
    wait: bool = True,
    env: dict | None = None,
    host: str = "127.0.0.1",
) -> ServerProcess:
    """An SGLang server (``python`` is the interpreter of its environment) on ``host`` (GPU only)."""
    port = port or free_port()
    cmd = [python, "-m", "sglang.launch_server", "--model-path", model, "--host", host, "--port", str(port), *args]
    return ServerProcess(
        cmd,
        f"http://{host}:{port}",
        startup_timeout_s,
        env={"HF_HUB_OFFLINE": "1", **(env or {})},
        log_path=log_path,
        wait=wait,
    )
