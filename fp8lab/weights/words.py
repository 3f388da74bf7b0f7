"""Sentences picked from a measured sign, so that a glued sentence cannot contradict its number.

A sentence written before the run ("FP8 weights are faster: {ratio} times") reads wrong when
the run disagrees ("faster ... 0.94 times"), and a rounded difference can read "0.00 GiB less".
:func:`change` words a signed difference from the value as it will be printed; :func:`ratio_words`
words a speed ratio against its round-to-round spread, and says "within the noise" when the
spread covers 1.
"""

from __future__ import annotations

import math

from fp8lab import checks

__all__ = ["change", "ratio_words"]


def change(value: float, unit: str = "ms", digits: int = 2, *, more: str = "more",
           less: str = "less") -> str:
    """``"0.42 ms less"`` for a positive saving, ``"0.10 ms more"`` for a negative one,
    ``"no change at this precision (< 0.01 ms)"`` when it rounds to zero, ``"not measured"``
    for NaN. ``value`` is a saving: positive means less."""
    checks.integer("digits", digits, minimum=0)
    for name, text in (("unit", unit), ("more", more), ("less", less)):
        if not isinstance(text, str):
            raise TypeError(f"{name}={text!r}: must be a string")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"value={value!r}: must be a number")
    if math.isnan(value):
        return "not measured"
    if math.isinf(value):
        raise ValueError(f"value={value}: must be finite or NaN")
    shown = f"{abs(value):,.{digits}f}"
    if float(shown.replace(",", "")) == 0.0:
        return f"no change at this precision (< {10.0 ** -digits:g} {unit})".replace("  ", " ")
    return f"{shown} {unit} {less if value > 0 else more}".replace("  ", " ")


def ratio_words(ratio: float, low: float, high: float, *, faster: str = "faster",
                slower: str = "slower") -> str:
    """Words for a speed ratio (baseline time / new time) whose round-to-round range is
    ``[low, high]``: ``"1.12x faster"``, ``"0.91x the speed (slower)"``, or
    ``"within the noise (0.97x-1.04x)"`` when the range covers 1; ``"not measured"`` for NaN."""
    for name, text in (("faster", faster), ("slower", slower)):
        if not isinstance(text, str):
            raise TypeError(f"{name}={text!r}: must be a string")
    values = []
    for name, value in (("ratio", ratio), ("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name}={value!r}: must be a number")
        values.append(float(value))
    if any(math.isnan(v) for v in values):
        return "not measured"
    for name, value in zip(("ratio", "low", "high"), values, strict=True):
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name}={value}: must be a finite number > 0 (or NaN)")
    ratio, low, high = values
    if low > high:
        raise ValueError(f"low={low}, high={high}: low must be <= high")
    if low <= 1.0 <= high or f"{ratio:.2f}" == "1.00":
        return f"within the noise ({low:.2f}x-{high:.2f}x)"
    if ratio > 1.0:
        return f"{ratio:.2f}x as fast ({faster})"
    return f"{ratio:.2f}x the speed ({slower})"
