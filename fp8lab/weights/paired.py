"""Paired differences over seeds, with a confidence interval, against a margin declared first.

Runs on a GPU with one seed are deterministic here: repeating a run gives the same losses bit
for bit, so "two runs without the option" is a noise floor of exactly zero and says nothing.
What varies is the seed. Each seed is run with and without the option (same initial weights,
same batches), the difference of their final losses is taken per seed, and the mean difference
with its Student-t interval is set against a margin written down before the runs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from fp8lab import checks

__all__ = ["paired_difference"]


def paired_difference(
    treated: Sequence[float], baseline: Sequence[float], margin: float, confidence: float = 0.95
) -> dict:
    """``mean``, ``low`` and ``high`` of ``treated - baseline`` over seeds (a Student-t
    interval), and ``verdict``: ``"within the margin"`` when the whole interval lies inside
    ``[-margin, margin]``, ``"outside the margin"`` when it lies wholly beyond it, else
    ``"inconclusive"``. ``"identical"`` when every difference is exactly 0."""
    from scipy import stats

    if not isinstance(treated, (list, tuple)) or not isinstance(baseline, (list, tuple)):
        raise TypeError("treated and baseline: must be lists of final losses, one per seed")
    if len(treated) != len(baseline) or len(treated) < 2:
        raise ValueError("treated and baseline: need the same number (>= 2) of seeds")
    diffs = [checks.number("treated[i]", a) - checks.number("baseline[i]", b)
             for a, b in zip(treated, baseline, strict=True)]
    margin = checks.number("margin", margin, non_negative=True)
    confidence = checks.number("confidence", confidence, positive=True, maximum=0.999)
    mean = statistics.fmean(diffs)
    half = stats.t.ppf(0.5 + confidence / 2, len(diffs) - 1) * statistics.stdev(diffs)
    half /= math.sqrt(len(diffs))
    low, high = mean - half, mean + half
    if all(d == 0 for d in diffs):
        verdict = "identical"
    elif -margin <= low and high <= margin:
        verdict = "within the margin"
    elif low > margin or high < -margin:
        verdict = "outside the margin"
    else:
        verdict = "inconclusive"
    return {"mean": mean, "low": low, "high": high, "verdict": verdict}
