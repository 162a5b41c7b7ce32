"""Config section for rollout: the staleness gate, the inference engine and the weight transport."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RolloutConfig:
    max_head_offpolicyness: int | str = 2
    """η, the max staleness in versions: prompts are admitted while accepted + running < (η + v + 1)·B.
    0 is synchronous RL. 'auto': η starts at rollout.max_staleness_limit and is tuned online to the smallest
    value that keeps the trainer from waiting (asyncrl/loop/staleness.py; docs/report.md)."""
    max_staleness_limit: int = 8
    """With max_head_offpolicyness=auto: the largest η it may choose."""
    max_concurrent_rollouts: int = 0
    """Cap on groups generating at once (0 = no cap beyond the staleness gate)."""
    backend: str = "local"
    """Inference engine and its placement: local (= local:d1, the built-in engine in the trainer's process) |
    asyncrl:dN (N `asyncrl serve` processes) | vllm:dNtM, sglang:dNtM (N vLLM / SGLang servers of M devices
    each; rollout.server_python runs them) | remote (servers already running at rollout.server_addrs)."""
    interrupt_mode: str = "recompute"
    """What in-flight requests do on a weight update: 'recompute' (re-prefill under the new weights and
    continue), 'abort' (end them; the engine resubmits prompt + partial output, a group's samples together) or
    'drain'
    (backend local only: the update waits until running requests finish; non-interruptible generation, for
    ablations). vLLM and SGLang servers need 'abort'."""
    max_slots: int = 64
    """Sequences the built-in engine (or each local server) decodes at once (KV-cache slots)."""
    max_context: int = 0
    """Prompt + completion tokens per sequence, at most the model's max_position_embeddings. 0: the model's
    own for vLLM and SGLang servers; for the built-in engine (local, asyncrl:dN, and remote, which is often
    asyncrl serve) 1024, or twice gconfig.max_new_tokens when that is more (room for a prompt as long as the
    completion), at most the model's own."""
    threads: int = 1
    """Torch threads for generation where the cores are not shared (cluster.cpu_split; the trainer gets
    actor.threads; keep the sum <= cores)."""
    native_kernels: bool = True
    """In float32 the built-in engine runs its matrix products, and in decode steps attention, RMSNorm, the SiLU
    gate and sampling, in C kernels compiled on first use (about a second; needs a C compiler, else the engine
    logs a warning and uses torch alone). false: torch alone (docs/engine.md)."""
    request_timeout_s: float = 600.0
    """A rollout that takes longer fails (counted, never silent) and its prompt is dropped."""
    batch_timeout_s: float = 1800.0
    """The trainer stops the run when no batch is ready for this long (a rollout side that fails stops the
    run at once with its own error; this catches a stall)."""
    max_failures_in_a_row: int = 0
    """Stop the run when this many rollouts in a row fail (raise, time out or return something that is not a
    group), with the last error; 0 = every group that can be in flight plus one batch, (η + 2)·B, so that one
    engine failure that fails all groups in flight is survived but a second batch's worth is not. Failures in
    a row also slow admission down (exponential back-off up to 5 s)."""
    weight_sync_timeout_s: float = 60.0
    """A weight update not delivered within this time stops the run with the version it was delivering."""
    server_addrs: list[str] = field(default_factory=list)
    """host:port (or URL) of each inference server, for backend 'remote'."""
    server_key_env: str = ""
    """The environment variable holding the admin key of servers started with --admin-key (backend 'remote'; the
    key itself is never in the config)."""
    server_api: str = "sglang"
    """HTTP dialect of remote servers: 'sglang' (SGLang's native API, which asyncrl serve also speaks) or
    'vllm' (vLLM >= 0.32 started with the flags in docs/engine.md). Servers asyncrl starts use their own."""
    server_python: str = ""
    """The Python interpreter of the environment that has vLLM or SGLang (e.g. .venv-vllm/bin/python); empty =
    this one."""
    server_startup_timeout_s: float = 180.0
    """Servers that do not answer /health within this time stop the run at start-up."""
    weight_transport: str = "auto"
    """How new weights reach the engines: 'inprocess' (backend local only), 'disk' (safetensors in
    rollout.weight_dir, loaded by each engine), 'dist' (torch.distributed broadcast to the servers) or 'auto'
    (inprocess for backend local, disk otherwise)."""
    weight_dir: str = ""
    """Directory of the disk transport (one subdirectory per version, written atomically); empty = a temporary
    directory (in /dev/shm when it has room) removed at the end. Servers on other machines need it on a shared
    filesystem."""
    dist_backend: str = "gloo"
    """Process-group backend of the dist transport: 'gloo' (CPU servers) or 'nccl' (GPU servers)."""
    dist_bucket_mb: int = 64
    """The dist transport sends the weights in buckets of at most this many MiB."""
    dist_master_addr: str = "127.0.0.1"
    """Address of this (trainer) process that the servers connect to for the dist transport."""

    def validate(self) -> None:
        from asyncrl.configlib import ConfigError

        def one_of(key: str, allowed: tuple) -> None:
            if getattr(self, key) not in allowed:
                raise ConfigError(f"rollout.{key} must be one of {list(allowed)}, got '{getattr(self, key)}'")

        value = self.max_head_offpolicyness
        if value != "auto" and (isinstance(value, str) or value < 0):
            raise ConfigError(f"rollout.max_head_offpolicyness must be >= 0 (an integer) or 'auto', got {value!r}")
        if self.max_staleness_limit < 0:
            raise ConfigError(f"rollout.max_staleness_limit must be >= 0, got {self.max_staleness_limit}")
        if self.max_context < 0:
            raise ConfigError(f"rollout.max_context must be 0 (the default) or positive, got {self.max_context}")
        from asyncrl.cluster.placement import ROLLOUT_KINDS, PlacementError, parse

        try:
            parse(self.backend, "rollout.backend", ROLLOUT_KINDS)
        except PlacementError as e:
            raise ConfigError(str(e)) from None
        one_of("interrupt_mode", ("recompute", "abort", "drain"))
        one_of("server_api", ("sglang", "vllm"))
        one_of("weight_transport", WEIGHT_TRANSPORTS)
        one_of("dist_backend", ("gloo", "nccl"))
        kind = self.placement.kind
        if kind == "remote" and not self.server_addrs:
            raise ConfigError("rollout.server_addrs is empty: backend 'remote' needs the host:port of each server")
        if kind != "remote" and self.server_addrs:
            raise ConfigError(
                f"rollout.server_addrs is for backend 'remote'; backend '{self.backend}' starts its own servers"
            )
        transport = self.resolved_transport
        if transport == "inprocess" and kind != "local":
            raise ConfigError(
                f"rollout.weight_transport 'inprocess' reaches only backend 'local'; backend "
                f"'{self.backend}' needs 'disk' or 'dist'"
            )
        if transport == "dist" and kind == "local":
            raise ConfigError(
                "rollout.weight_transport 'dist' broadcasts to servers; backend 'local' uses 'inprocess' or 'disk'"
            )
        if transport == "dist" and self.resolved_api == "vllm":
            raise ConfigError(
                "rollout.weight_transport 'dist' speaks SGLang's weight-update API; for "
                "rollout.server_api 'vllm' use 'disk'"
            )
        if self.resolved_api == "vllm" and kind != "local" and self.interrupt_mode != "abort":
            raise ConfigError(
                "rollout.interrupt_mode must be 'abort' with rollout.server_api 'vllm' (vLLM cannot "
                "re-prefill running requests in place)"
            )
        if kind == "sglang" and self.interrupt_mode != "abort":
            raise ConfigError(
                "rollout.interrupt_mode must be 'abort' with rollout.backend sglang (asyncrl does not "
                "drive SGLang's in-place pause; aborted samples are continued under the new weights)"
            )
        if self.interrupt_mode == "drain" and kind != "local":
            raise ConfigError(
                "rollout.interrupt_mode 'drain' is implemented by the built-in engine only (rollout.backend 'local')"
            )
        for key in ("request_timeout_s", "batch_timeout_s", "weight_sync_timeout_s", "server_startup_timeout_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"rollout.{key} must be > 0, got {getattr(self, key)!r}")
        if self.max_failures_in_a_row < 0:
            raise ConfigError(f"rollout.max_failures_in_a_row must be >= 0, got {self.max_failures_in_a_row}")
        if self.dist_bucket_mb < 1:
            raise ConfigError(f"rollout.dist_bucket_mb must be >= 1, got {self.dist_bucket_mb}")

    @property
    def placement(self):
        from asyncrl.cluster.placement import ROLLOUT_KINDS, parse

        return parse(self.backend, "rollout.backend", ROLLOUT_KINDS)

    @property
    def resolved_api(self) -> str:
        """The servers' HTTP dialect: asyncrl serve and SGLang speak SGLang's, vLLM its own; remote: server_api."""
        kind = self.placement.kind
        return self.server_api if kind == "remote" else "vllm" if kind == "vllm" else "sglang"

    @property
    def max_staleness(self) -> int:
        """The largest η the run may admit under: the fixed η, or the limit of 'auto'."""
        value = self.max_head_offpolicyness
        return self.max_staleness_limit if value == "auto" else value

    @property
    def resolved_transport(self) -> str:
        from asyncrl.cluster.placement import resolve_transport

        return resolve_transport(self.weight_transport, self.placement.kind)


MAX_CONTEXT = 1024  # KV-cache positions per sequence in the built-in engines (the model's own limit if lower)


def builtin_context(max_positions: int, max_new_tokens: int = 0) -> int:
    """Prompt + completion tokens per sequence in the built-in engine: ``MAX_CONTEXT``, or for longer completions
    room for a prompt as long as the completion, at most the model's own ``max_positions``."""
    return min(max_positions, max(MAX_CONTEXT, 2 * max_new_tokens))


WEIGHT_TRANSPORTS = ("auto", "inprocess", "disk", "dist")
