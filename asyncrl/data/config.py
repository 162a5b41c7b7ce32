"""Config sections for where prompts come from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TaskConfig:
    name: str = "arith"
    """The built-in task: 'arith' (multi-step integer arithmetic with a chain of thought)."""
    min_terms: int = 3
    """Fewest numbers in a problem (terms - 1 operations)."""
    max_terms: int = 5
    """Most numbers in a problem."""
    max_operand: int = 99
    """Largest operand."""
    ops: str = "+-"
    """Operators drawn from: any of '+-*' ('*' multiplies by one digit)."""


@dataclass
class TrainDatasetConfig:
    batch_size: int = 16
    """B: prompt groups per training step (each group holds gconfig.n_samples samples)."""
    seed: int = 0
    """Seed of the training problem stream."""


@dataclass
class ValidDatasetConfig:
    size: int = 200
    """Held-out problems evaluated."""
    seed: int = 10_000
    """Seed of the held-out split (disjoint from the training stream)."""
