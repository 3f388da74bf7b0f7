"""How chapter 08 reads the worker's results: efficiencies over alternating rounds with their
intervals, verdicts taken from whether an interval clears a threshold, and what an older result
file lacks (so that the page says so instead of failing).
"""

from __future__ import annotations

import math

import pandas as pd
from scipy import stats

# what each task's rows carry since the worker measured them (absent from older result files)
NEW_FIELDS = {
    "links": ("calls", "collective latency from back-to-back calls"),
    "rounds": (None, "data-parallel layouts in alternating rounds (ZeRO-1, FSDP2)"),
    "tp_check": ("TP from FP32: output", "TP against an FP32 reference, negative control"),
    "cp_check": ("CP from FP32: output", "CP against an FP32 reference"),
    "timeline": ("window_us", "the backward's hiding window"),
    "amax": ("calls", "amax reduction latency from back-to-back calls"),
}


def missing_fields(run) -> list[str]:
    """What a result file lacks of the current worker's measurements, one line each."""
    missing = []
    for task, (field, what) in NEW_FIELDS.items():
        if task not in run:
            missing.append(f"{task}: {what}")
            continue
        result = run[task]
        rows = [r for r in [*result.rows, result.data.get("reduction") or {}] if r]
        measured = [r for r in rows if not r.get("error")]
        if field is not None and measured and not any(field in r for r in measured):
            missing.append(f"{task}: {what}")
    return missing


def mean_interval(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``values`` and its Student-t interval (NaN bounds with fewer than two values)."""
    values = [float(v) for v in values if not math.isnan(float(v))]
    if not values:
        return math.nan, math.nan, math.nan
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    error = stats.sem(values)
    if error == 0:
        return mean, mean, mean
    low, high = stats.t.interval(confidence, len(values) - 1, loc=mean, scale=error)
    return mean, float(low), float(high)


def round_efficiency(rows: list[dict], confidence: float = 0.95) -> pd.DataFrame:
    """Per precision and variant of the ``rounds`` task: the median step over rounds (ms), the
    scaling efficiency (one GPU's step over the variant's, round by round: both sides measured
    minutes apart at most) as a mean with its interval, and the memory held between steps."""
    good = [r for r in rows if "round_ms" in r and not r.get("error")]
    base = {r["precision"]: r["round_ms"] for r in good if r["variant"] == "1 GPU"}
    table = []
    for row in good:
        one = base.get(row["precision"])
        ratios = [a / b for a, b in zip(one, row["round_ms"], strict=True)] if one else []
        mean, low, high = mean_interval(ratios, confidence)
        table.append(
            {
                "precision": row["precision"],
                "variant": row["variant"],
                "step (ms)": float(pd.Series(row["round_ms"]).median()),
                "efficiency": mean,
                "low": low,
                "high": high,
                "rounds": len(row["round_ms"]),
                "state (MiB/GPU)": row.get("state_mib", math.nan),
            }
        )
    columns = ["precision", "variant", "step (ms)", "efficiency", "low", "high", "rounds"]
    return pd.DataFrame(table, columns=[*columns, "state (MiB/GPU)"])


def against(low: float, high: float, threshold: float) -> str:
    """Where an interval lies against a threshold: ``"above"``, ``"below"`` or ``"not
    distinguishable from"`` (the interval holds it, or there is no interval)."""
    if math.isnan(low) or math.isnan(high):
        return "not distinguishable from"
    if low > threshold:
        return "above"
    if high < threshold:
        return "below"
    return "not distinguishable from"


def ratio_interval(numerator, denominator, confidence: float = 0.95) -> tuple[float, float]:
    """A bootstrap interval (percentile, 2000 resamples, fixed seed) of the ratio of the median
    of ``numerator`` over that of ``denominator``: two independent samples of step times."""
    a = [float(v) for v in numerator or []]
    b = [float(v) for v in denominator or []]
    if len(a) < 2 or len(b) < 2:
        return math.nan, math.nan
    result = stats.bootstrap(
        (a, b),
        lambda x, y: float(pd.Series(x).median() / pd.Series(y).median()),
        vectorized=False,
        paired=False,
        n_resamples=2000,
        confidence_level=confidence,
        method="percentile",
        random_state=0,
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)
