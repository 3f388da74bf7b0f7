"""Intervals and power: the arithmetic under every verdict (Student t, from :mod:`scipy.stats`).

* :func:`mean_interval` -- the mean of a few values and its t-interval;
* :func:`ratio_interval` -- a ratio measured once per round: the geometric mean of the rounds'
  ratios and the t-interval of their logarithms, mapped back (a ratio of times is symmetric on
  a log scale: 2x faster and 2x slower are equally far from 1);
* :func:`unpaired_ratio_interval` -- the ratio of two samples measured apart, not in rounds
  (Welch's t-interval of the difference of their mean logs, mapped back);
* :func:`detectable_difference` -- the smallest true mean difference a paired design of ``n``
  pairs detects with the given power (two-sided test at ``1 - confidence``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from scipy import stats

from fp8lab import checks

__all__ = ["detectable_difference", "mean_interval", "ratio_interval", "unpaired_ratio_interval"]


def _confidence(confidence) -> float:
    confidence = checks.number("confidence", confidence, positive=True)
    if confidence >= 1:
        raise ValueError(f"confidence={confidence}: must be below 1")
    return confidence


def _values(name: str, values) -> list[float]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name}={checks.show(values)}: must be a list or tuple of numbers")
    return [checks.number(f"{name}[{i}]", v) for i, v in enumerate(values)]


def mean_interval(values: Sequence[float], confidence: float = 0.95):
    """``(mean, low, high)``: the mean of ``values`` and its Student-t interval; NaN bounds with
    fewer than two values, both bounds at the mean when the values are all equal."""
    values, confidence = _values("values", values), _confidence(confidence)
    if not values:
        raise ValueError("values: give at least one value")
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = stats.t.ppf(0.5 + confidence / 2, len(values) - 1) * sd / math.sqrt(len(values))
    return mean, mean - float(half), mean + float(half)


def _logs(name: str, values) -> list[float]:
    values = _values(name, values)
    if any(v <= 0 for v in values):
        raise ValueError(f"{name}={checks.show(values)}: must all be > 0")
    return [math.log(v) for v in values]


def ratio_interval(ratios: Sequence[float], confidence: float = 0.95):
    """``(estimate, low, high)`` of ratios measured once per round: the geometric mean and the
    t-interval of the logs, exponentiated (NaN bounds with one round)."""
    mean, low, high = mean_interval(_logs("ratios", ratios), confidence)
    return math.exp(mean), math.exp(low), math.exp(high)


def unpaired_ratio_interval(
    numerator: Sequence[float], denominator: Sequence[float], confidence: float = 0.95
):
    """``(estimate, low, high)`` of the ratio of two samples' geometric means, measured apart:
    Welch's t-interval of their mean logs' difference, exponentiated (NaN bounds with fewer
    than two values a side). Steps of one run are not independent: the interval is too narrow;
    prefer rounds."""
    a, b = _logs("numerator", numerator), _logs("denominator", denominator)
    confidence = _confidence(confidence)
    if not a or not b:
        raise ValueError("numerator and denominator: give at least one value each")
    difference = math.fsum(a) / len(a) - math.fsum(b) / len(b)
    if len(a) < 2 or len(b) < 2:
        return math.exp(difference), math.nan, math.nan
    va, vb = (statistics.variance(x) / len(x) for x in (a, b))
    if va + vb == 0:
        return (math.exp(difference),) * 3
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * math.sqrt(va + vb)
    return math.exp(difference), math.exp(difference - half), math.exp(difference + half)


def detectable_difference(
    sd: float, n: int, confidence: float = 0.95, power: float = 0.8
) -> float:
    """The smallest true mean difference that a paired t-test over ``n`` pairs whose
    differences have standard deviation ``sd`` detects with probability ``power``:
    ``(t[1 - alpha/2] + t[power]) * sd / sqrt(n)``, both quantiles with ``n - 1`` degrees of
    freedom (the usual approximation)."""
    sd = checks.number("sd", sd, non_negative=True)
    n = checks.integer("n", n, minimum=2)
    confidence = _confidence(confidence)
    power = checks.number("power", power, positive=True)
    if power >= 1:
        raise ValueError(f"power={power}: must be below 1")
    quantiles = stats.t.ppf(0.5 + confidence / 2, n - 1) + stats.t.ppf(power, n - 1)
    return float(quantiles) * sd / math.sqrt(n)
