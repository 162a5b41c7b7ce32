"""What the verdict's rules produce and share: a ``Finding`` (its name, kind, evidence and the one change it
suggests), the window of steps they read, and the small readers of records they use."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

WINDOW = 20
"""Training steps the rules read (the last ones)."""


@dataclass(frozen=True)
class Finding:
    name: str
    kind: str  # "bottleneck" or "health"
    evidence: str  # the numbers the rule read
    change: str  # the one change with the largest expected gain
    gain: float = 0.0  # bottlenecks: the share of step time the change is expected to save (an estimate)

    def line(self) -> str:
        return f"{self.name}: {self.evidence} -> {self.change}"

    def to_dict(self) -> dict:
        return asdict(self)


def mean(records: list[dict], key: str) -> float | None:
    values = [v for r in records if (v := finite(r.get(key))) is not None]
    return sum(values) / len(values) if values else None


def finite(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def now(settings: dict, name: str, eq: str = ", now ") -> str:
    value = settings.get(name)
    return "" if value is None else f"{eq}{value}"
