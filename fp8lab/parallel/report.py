"""How chapter 08 reads the worker's results: efficiencies over alternating rounds with their
intervals, verdicts taken from whether an interval clears a threshold (all through
:mod:`fp8lab.protocol`), and what an older result file lacks (so that the page says so instead
of failing).
"""

from __future__ import annotations

import math

import pandas as pd

from fp8lab import checks, protocol

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


def round_efficiency(rows: list[dict], confidence: float = 0.95) -> pd.DataFrame:
    """Per precision and variant of the ``rounds`` task: the median step over rounds (ms), the
    scaling efficiency (one GPU's step over the variant's, round by round: both sides measured
    minutes apart at most) with its interval (:func:`fp8lab.protocol.ratio_interval`), and the
    memory held between steps."""
    good = [r for r in rows if "round_ms" in r and not r.get("error")]
    base = {r["precision"]: r["round_ms"] for r in good if r["variant"] == "1 GPU"}
    table = []
    for row in good:
        one = base.get(row["precision"])
        ratios = [a / b for a, b in zip(one, row["round_ms"], strict=True)] if one else []
        found = protocol.ratio_interval(ratios, confidence) if ratios else (math.nan,) * 3
        table.append(
            {
                "precision": row["precision"],
                "variant": row["variant"],
                "step (ms)": float(pd.Series(row["round_ms"]).median()),
                "efficiency": found[0],
                "low": found[1],
                "high": found[2],
                "rounds": len(row["round_ms"]),
                "state (MiB/GPU)": row.get("state_mib", math.nan),
            }
        )
    columns = ["precision", "variant", "step (ms)", "efficiency", "low", "high", "rounds"]
    return pd.DataFrame(table, columns=[*columns, "state (MiB/GPU)"])


def against(low: float, high: float, threshold: float) -> str:
    """Where an interval lies against a threshold, by the protocol's verdict on the ratio to it
    (:func:`fp8lab.protocol.speed_verdict`, against the session floor): ``"above"``,
    ``"below"`` or ``"not distinguishable from"`` (tied, not resolved, or no interval)."""
    threshold = checks.number("threshold", threshold, positive=True)
    if math.isnan(low) or math.isnan(high):
        return "not distinguishable from"
    low = checks.number("low", low, positive=True) / threshold
    high = checks.number("high", high, positive=True) / threshold
    # the geometric midpoint is the estimate of a ratio's interval (symmetric on a log scale)
    floor = protocol.floor_for("host").relative  # the widest: the regime is not known here
    word = protocol.speed_verdict(math.sqrt(low * high), low, high, floor)
    return {protocol.FASTER: "above", protocol.SLOWER: "below"}.get(
        word, "not distinguishable from"
    )


def ratio_interval(numerator, denominator, confidence: float = 0.95) -> tuple[float, float]:
    """``(low, high)`` of the ratio of two samples of step times measured apart
    (:func:`fp8lab.protocol.unpaired_ratio_interval`); NaN with fewer than two on a side."""
    a = [float(v) for v in numerator or []]
    b = [float(v) for v in denominator or []]
    if len(a) < 2 or len(b) < 2:
        return math.nan, math.nan
    return protocol.unpaired_ratio_interval(a, b, confidence)[1:]
