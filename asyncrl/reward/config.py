"""Config section for the reward service."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RewardConfig:
    fn: str = ""
    """Reward function as ``package.module:function`` (empty = the dataset's own verifier)."""
    default: float = 0.0
    """Reward given when the function raises or times out (counted in reward_errors / reward_timeouts)."""
