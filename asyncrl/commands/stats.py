"""The statistics of a comparison of few seeds, without SciPy: Student's t distribution (its CDF through the
regularized incomplete beta function, its quantiles by bisection), a mean's confidence interval, and Welch's
test of two means with unequal variances."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = ``p`` (bisection; p in (0, 1))."""
    lo, hi = -1e4, 1e4
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class Summary:
    """A sample's mean, standard deviation (n - 1) and the half-width of its 95% confidence interval."""

    n: int
    mean: float
    sd: float
    ci95: float  # mean ± ci95 (0 with one value: no interval)

    def text(self, digits: int = 3) -> str:
        return f"{self.mean:.{digits}f} ± {self.sd:.{digits}f}" if self.n > 1 else f"{self.mean:.{digits}f}"


def summarize(values: list[float]) -> Summary:
    n = len(values)
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if n > 1 else 0.0
    return Summary(n, mean, sd, t_quantile(0.975, n - 1) * sd / math.sqrt(n) if n > 1 else 0.0)


def welch(a: list[float], b: list[float]) -> tuple[float, float]:
    """(the difference of the means, a - b; the two-sided p-value of Welch's t-test that they are equal). With
    no variance in either sample, p is 1 for equal means and 0 otherwise; with one value in a sample, 1 (nothing
    can be told apart)."""
    diff = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return diff, 1.0
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return diff, 1.0 if diff == 0 else 0.0
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return diff, 2.0 * (1.0 - t_cdf(abs(diff) / se, df))
