"""Config section for rollout: the staleness gate and the inference engine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RolloutConfig:
    max_head_offpolicyness: int = 2
    """η, the max staleness in versions: prompts are admitted while accepted + running < (η + v + 1)·B.
    0 is synchronous RL."""
    max_concurrent_rollouts: int = 0
    """Cap on groups generating at once (0 = no cap beyond the staleness gate)."""
    backend: str = "local"
    """Inference engine: 'local' (the built-in in-process engine)."""
    interrupt_mode: str = "recompute"
    """What in-flight requests do on a weight update: 'recompute' (re-prefill under the new weights and
    continue) or 'abort' (end them; the workflow resubmits prompt + partial output)."""
    max_slots: int = 64
    """Sequences the built-in engine decodes at once (KV-cache slots)."""
    threads: int = 1
    """Torch threads for generation (the trainer gets actor.threads; keep the sum <= cores)."""
    request_timeout_s: float = 600.0
    """A rollout that takes longer fails (counted, never silent) and its prompt is dropped."""
    weight_sync_timeout_s: float = 60.0
    """A weight update not delivered within this time stops the run with the version it was delivering."""

    def validate(self) -> None:
        from asyncrl.configlib import ConfigError

        if self.backend not in ENGINE_BACKENDS:
            raise ConfigError(f"rollout.backend must be one of {ENGINE_BACKENDS}, got '{self.backend}'")
        if self.interrupt_mode not in ("recompute", "abort"):
            raise ConfigError(f"rollout.interrupt_mode must be 'recompute' or 'abort', got '{self.interrupt_mode}'")


ENGINE_BACKENDS = ("local",)
