"""Sentences picked from a measured sign, so that a glued sentence cannot contradict its number.

A sentence written before the run ("FP8 weights save {x} GiB") reads wrong when the run
disagrees, and a rounded difference can read "0.00 GiB less". :func:`change` words a signed
difference from the value as it will be printed; :func:`count_words` agrees a noun with its
number ("1 micro-batch"); :func:`smallest_words` names the smallest of several measured values
and the ones that tie with it at the printed precision. Verdict words ("faster", "within the
margin") never come from here: they come from :mod:`fp8lab.protocol`.
"""

from __future__ import annotations

import math

from fp8lab import checks

__all__ = ["change", "count_words", "smallest_words"]


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




def count_words(count: int, noun: str, plural: str | None = None) -> str:
    """``"1 micro-batch"``, ``"4 micro-batches"``: the noun agrees with ``count``
    (``plural`` defaults to ``noun + "es"`` after s, x, z, ch, sh, else ``noun + "s"``)."""
    checks.integer("count", count, minimum=0)
    if not isinstance(noun, str) or not noun:
        raise TypeError(f"noun={noun!r}: must be a non-empty string")
    if plural is None:
        plural = noun + ("es" if noun.endswith(("s", "x", "z", "ch", "sh")) else "s")
    elif not isinstance(plural, str):
        raise TypeError(f"plural={plural!r}: must be a string")
    return f"{count} {noun if count == 1 else plural}"


def smallest_words(values: dict, unit: str = "B/param", digits: int = 1) -> str:
    """``"“A”, at 6.0 B/param"`` for a sole smallest value, ``"“A” and “B” tie at 8.0 B/param"``
    when others print the same at ``digits``; NaN values are left out (``"not measured"``
    when all are NaN)."""
    checks.integer("digits", digits, minimum=0)
    if not isinstance(values, dict) or not values:
        raise TypeError("values: must be a non-empty dict of label -> number")
    shown = {}
    for label, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"values[{label!r}]={value!r}: must be a number")
        if not math.isnan(value):
            shown[str(label)] = f"{value:.{digits}f}"
    if not shown:
        return "not measured"
    low = min(shown.values(), key=float)
    names = [f"“{label}”" for label, text in shown.items() if text == low]
    if len(names) == 1:
        return f"{names[0]}, at {low} {unit}"
    listed = ", ".join(names[:-1]) + " and " + names[-1]
    return f"{listed} tie at {low} {unit}"




