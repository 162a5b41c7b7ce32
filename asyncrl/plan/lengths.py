"""Response lengths for the simulation: a fixed length, a long-tailed (log-normal) one capped at
``max_new_tokens``, or the empirical lengths a run or a profile measured."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

Z99 = 2.3263478740408408  # the standard normal's 99th percentile


@dataclass(frozen=True)
class Lengths:
    """``kind`` fixed | lognormal | empirical. lognormal: ``median`` and ``p99`` tokens; empirical: ``values``.
    Every draw is at least 1 and at most ``cap``."""

    kind: str = "fixed"
    median: float = 32.0
    p99: float = 32.0
    cap: int = 64
    values: tuple[int, ...] = field(default_factory=tuple)

    def sample(self, rng: random.Random) -> int:
        if self.kind == "empirical" and self.values:
            n = rng.choice(self.values)
        elif self.kind == "lognormal" and self.p99 > self.median > 0:
            sigma = math.log(self.p99 / self.median) / Z99
            n = rng.lognormvariate(math.log(self.median), sigma)
        else:
            n = self.median
        return max(1, min(self.cap, int(round(n))))

    def mean(self, rng: random.Random | None = None, draws: int = 4000) -> float:
        rng = rng or random.Random(0)
        return sum(self.sample(rng) for _ in range(draws)) / draws

    def describe(self) -> str:
        if self.kind == "empirical":
            mean = sum(self.values) / max(1, len(self.values))
            return f"empirical ({len(self.values)} measured lengths, mean {mean:.0f})"
        if self.kind == "lognormal":
            return f"log-normal: median {self.median:g}, p99 {self.p99:g} tokens, at most {self.cap}"
        return f"{min(self.cap, int(self.median))} tokens each"


def fixed(tokens: int) -> Lengths:
    return Lengths("fixed", tokens, tokens, tokens)


def long_tail(median: float, p99: float, cap: int) -> Lengths:
    return Lengths("lognormal", median, p99, cap)


def empirical(values: list[int], cap: int) -> Lengths:
    return Lengths("empirical", cap=cap, values=tuple(int(v) for v in values if v > 0))


def from_records(records: list[dict], cap: int) -> Lengths:
    """A log-normal fitted to a run's per-step ``response_len_mean`` and ``response_len_max`` (the largest of a
    batch of N samples sits near its 1 - 1/N quantile; the p99 is read as the median of those maxima)."""
    steps = [r for r in records if r.get("step", 0) > 0 and isinstance(r.get("response_len_mean"), (int, float))]
    if not steps:
        raise ValueError("the run's metrics have no response_len_mean")
    means = sorted(r["response_len_mean"] for r in steps)
    maxima = sorted(r.get("response_len_max", r["response_len_mean"]) for r in steps)
    mean, top = means[len(means) // 2], maxima[len(maxima) // 2]
    if top <= mean * 1.05:
        return fixed(int(round(mean)))
    # a log-normal's mean is median * exp(sigma^2 / 2): solve for the median given the mean and the p99
    sigma = 0.0
    for _ in range(50):
        median = mean / math.exp(sigma**2 / 2)
        sigma = max(1e-3, math.log(top / median) / Z99)
    return long_tail(mean / math.exp(sigma**2 / 2), top, cap)
