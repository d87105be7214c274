"""95 % bootstrap intervals over seeds: for a median, and for a ratio of two medians.

The report's numbers come from few seeds (3 to 5): an interval says which differences the seeds
cannot tell apart. Percentile bootstrap (Efron and Tibshirani, "An Introduction to the Bootstrap",
1993, ch. 13) through ``scipy.stats.bootstrap``, with a fixed seed so that a report is reproducible.
With one value, or values all equal, the interval is that value: every resample has it.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 9999


def _interval(samples: tuple[np.ndarray, ...], statistic, seed: int) -> tuple[float, float]:
    result = stats.bootstrap(
        samples, statistic, confidence_level=CONFIDENCE, n_resamples=RESAMPLES, method="percentile",
        rng=np.random.default_rng(seed),
    )  # fmt: skip
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def median_interval(values, seed: int = 0) -> tuple[float, float]:
    """The interval of the median of ``values`` (resampled with replacement)."""
    x = np.asarray(values, dtype=float)
    if len(x) == 0:
        return float("nan"), float("nan")
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    return _interval((x,), lambda v, axis: np.median(v, axis=axis), seed)


def ratio_interval(numerator, denominator, seed: int = 0) -> tuple[float, float]:
    """The interval of ``median(numerator) / median(denominator)``, two independent samples (runs of
    two algorithms, each resampled over its own seeds)."""
    a, b = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    if len(a) == 0 or len(b) == 0:
        return float("nan"), float("nan")
    fixed_a, fixed_b = bool(np.all(a == a[0])), bool(np.all(b == b[0]))
    if fixed_a and fixed_b:
        return float(a[0] / b[0]), float(a[0] / b[0])
    if fixed_a:  # one run, or equal runs: only the other side varies (the bootstrap needs 2 values a side)
        low, high = median_interval(b, seed)
        return float(a[0] / high), float(a[0] / low)
    if fixed_b:
        low, high = median_interval(a, seed)
        return float(low / b[0]), float(high / b[0])
    return _interval((a, b), lambda x, y, axis: np.median(x, axis=axis) / np.median(y, axis=axis), seed)


def overlap(low_a: float, high_a: float, low_b: float, high_b: float) -> bool:
    """Whether two intervals share a point: the seeds cannot tell the two apart."""
    return bool(low_a <= high_b and low_b <= high_a)
