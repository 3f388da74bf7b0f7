"""Chapter 09's accuracy verdicts: paired differences over data-order seeds.

A setting and TE BF16 trained on the same seed saw the same batches in the same order from the
same weights, so their difference in validation loss holds the precision's effect and little
of the data order's. :func:`paired_difference` takes the differences seed by seed (setting minus
BF16) and judges them by the book's protocol (:func:`fp8lab.protocol.paired_summary`: the mean,
its Student-t interval, and the verdict against a margin declared before the runs, which needs
five seeds). :func:`seed_band` is BF16's own spread over seeds, the scale a reader has in mind
when judging a margin.
"""

from __future__ import annotations

import math

import numpy as np

from fp8lab import checks, protocol


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
    """``setting`` minus ``baseline`` over the seeds both have (each a ``{seed: loss}``; a run
    without a finite loss is left out): ``{"seeds", "differences", "mean", "low", "high",
    "margin", "confidence", "verdict"}``; ``mean`` is None without a pair, the interval None
    with fewer than two."""
    setting, baseline = _by_seed("setting", setting), _by_seed("baseline", baseline)
    margin = checks.number("margin", margin, positive=True)
    confidence = checks.number("confidence", confidence, positive=True, maximum=0.999)
    seeds = sorted(set(setting) & set(baseline))
    result = {"seeds": seeds, "differences": [setting[s] - baseline[s] for s in seeds]}
    result.update(margin=margin, confidence=confidence, mean=None, low=None, high=None)
    result["verdict"] = protocol.NOT_RESOLVED
    if seeds:
        found = protocol.paired_summary(
            setting, baseline, margin=margin, names=("setting", "baseline"), confidence=confidence
        )
        result.update({k: found[k] for k in ("mean", "verdict")})
        if len(seeds) > 1:
            result.update(low=found["low"], high=found["high"])
    return result


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
