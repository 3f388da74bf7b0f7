"""Chapter 09's accuracy verdicts: paired differences over data-order seeds.

A setting and TE BF16 trained on the same seed saw the same batches in the same order from the
same weights, so their difference in validation loss holds the precision's effect and little
of the data order's. :func:`paired_difference` takes the differences seed by seed (setting minus
BF16), their mean and a Student-t confidence interval (``scipy.stats``), and judges the interval
against an equivalence margin declared before the runs: inside ``(-margin, margin)`` is
equivalent, wholly above ``margin`` worse, wholly below ``-margin`` better, anything else
undecided (more seeds would tell). :func:`seed_band` is BF16's own spread over seeds, the scale
a reader has in mind when judging a margin.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as scipy_stats

from fp8lab import checks


def validation_at(record: dict, step: int) -> float | None:
    """The validation loss a result record measured after ``step`` steps, or None."""
    validation = record.get("validation") or {}
    for at, value in zip(validation.get("step", []), validation.get("loss", []), strict=True):
        if at == step:
            return value
    return None


def _by_seed(name: str, values) -> dict[int, float]:
    if not isinstance(values, dict) or not all(isinstance(k, int) for k in values):
        raise TypeError(f"{name}={checks.show(values)}: must map seeds (int) to losses")
    return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(v)}


def paired_difference(setting, baseline, margin: float, confidence: float = 0.95) -> dict:
    """``setting`` minus ``baseline`` over the seeds both have (each a ``{seed: loss}``):
    ``{"seeds", "differences", "mean", "low", "high", "margin", "confidence", "verdict"}``;
    the interval is None with fewer than two seeds."""
    setting, baseline = _by_seed("setting", setting), _by_seed("baseline", baseline)
    margin = checks.number("margin", margin, positive=True)
    confidence = checks.number("confidence", confidence, positive=True, maximum=0.999)
    seeds = sorted(set(setting) & set(baseline))
    differences = np.array([setting[s] - baseline[s] for s in seeds])
    result = {"seeds": seeds, "differences": differences.tolist(), "margin": margin}
    result.update(confidence=confidence, mean=None, low=None, high=None, verdict="no pairs")
    if len(seeds) == 0:
        return result
    result["mean"] = float(differences.mean())
    if len(seeds) < 2:
        result["verdict"] = "undecided (one pair)"
        return result
    spread = scipy_stats.sem(differences)
    if spread == 0:
        low = high = result["mean"]
    else:
        low, high = scipy_stats.t.interval(
            confidence, len(seeds) - 1, loc=result["mean"], scale=spread
        )
    result.update(low=float(low), high=float(high), verdict=verdict(low, high, margin))
    return result


def verdict(low: float, high: float, margin: float) -> str:
    """The word for an interval ``[low, high]`` against ``(-margin, margin)``."""
    if -margin < low and high < margin:
        return "equivalent"
    if low > margin:
        return "worse"
    if high < -margin:
        return "better"
    return "undecided"


def seed_band(values) -> dict:
    """BF16's spread over seeds (``{seed: loss}``): ``{"seeds", "mean", "sd", "low",
    "high"}`` (``sd`` None with one seed)."""
    values = _by_seed("values", values)
    if not values:
        raise ValueError("values: no finite loss")
    array = np.array([values[s] for s in sorted(values)])
    return {
        "seeds": sorted(values),
        "mean": float(array.mean()),
        "sd": float(array.std(ddof=1)) if len(array) > 1 else None,
        "low": float(array.min()),
        "high": float(array.max()),
    }
