"""Sentences picked from a measured sign, so that a glued sentence cannot contradict its number.

A sentence written before the run ("FP8 weights are faster: {ratio} times") reads wrong when
the run disagrees ("faster ... 0.94 times"), and a rounded difference can read "0.00 GiB less".
:func:`change` words a signed difference from the value as it will be printed; :func:`ratio_words`
words a speed ratio by the protocol's verdict on its interval (and names the verdict when it is
not "faster" or "slower"). :func:`count_words` agrees a noun with its number ("1 micro-batch");
:func:`smallest_words` names the smallest of several measured values and the ones that tie with
it at the printed precision; :func:`spread_words` says which calls make a spread (one slow call
or a broad scatter), so that a reader sees where it comes from.

:func:`paired_difference` is the verdict on an option over seeds. Runs with one seed are
deterministic here (repeating a run gives the same losses bit for bit), so what varies is the
seed: each seed runs with and without the option (same weights, same batches), and the protocol
(:func:`fp8lab.protocol.paired_summary`) sets the per-seed differences against a margin written
down before the runs.
"""

from __future__ import annotations

import math

from fp8lab import checks, protocol

__all__ = [
    "change", "count_words", "paired_difference", "ratio_words", "smallest_words", "spread_words"
]


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
    """Words for a speed ratio (baseline time / new time) with interval ``[low, high]``, by
    the protocol's verdict (:func:`fp8lab.protocol.speed_verdict`, against the session floor;
    the widest, as the regime is not known here): ``"1.12x as fast (faster)"``, ``"0.91x the
    speed (slower)"``, else the verdict with the interval (``"not resolved (0.97x-1.04x)"``,
    ``"tied (0.99x-1.01x)"``); ``"not measured"`` for a NaN ratio."""
    for name, text in (("faster", faster), ("slower", slower)):
        if not isinstance(text, str):
            raise TypeError(f"{name}={text!r}: must be a string")
    values = []
    for name, value in (("ratio", ratio), ("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name}={value!r}: must be a number")
        if not math.isnan(value) and (not math.isfinite(value) or value <= 0):
            raise ValueError(f"{name}={value}: must be a finite number > 0 (or NaN)")
        values.append(float(value))
    ratio, low, high = values
    if math.isnan(ratio):
        return "not measured"
    if low > high:
        raise ValueError(f"low={low}, high={high}: low must be <= high")
    word = protocol.speed_verdict(ratio, low, high, protocol.floor_for("host").relative)
    if word == protocol.FASTER:
        return f"{ratio:.2f}x as fast ({faster})"
    if word == protocol.SLOWER:
        return f"{ratio:.2f}x the speed ({slower})"
    return f"{word} ({low:.2f}x-{high:.2f}x)"


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


def spread_words(times_ms, what: str = "call", slow: float = 0.1) -> str:
    """Where the spread of ``times_ms`` (in the order they ran) comes from: ``"1 of 4 calls
    ran slow (the 1st: 96.1 ms against a median of 58.2 ms)"`` when a few calls ran more than
    ``slow`` (a share) above the median, ``"the calls scatter evenly around the median"``
    otherwise; ``what`` names a call (``"step"``, ``"round"``)."""
    import statistics

    if not isinstance(times_ms, (list, tuple)) or not times_ms:
        raise TypeError("times_ms: must be a non-empty list of times in ms")
    for value in times_ms:
        checks.number("times_ms[i]", value, non_negative=True)
    if not isinstance(what, str) or not what:
        raise TypeError(f"what={what!r}: must be a non-empty string")
    slow = checks.number("slow", slow, positive=True)
    median = statistics.median(times_ms)
    late = [i for i, t in enumerate(times_ms) if t > median * (1 + slow)]
    if not late or len(late) * 2 > len(times_ms):
        return f"the {what}s scatter evenly around the median"
    worst = max(late, key=lambda i: times_ms[i])
    nth = worst + 1
    place = "th" if 10 <= nth % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(nth % 10, "th")
    return (f"{len(late)} of {count_words(len(times_ms), what)} ran slow (the "
            f"{nth}{place}: {times_ms[worst]:,.1f} ms against a median of "
            f"{median:,.1f} ms)")


def paired_difference(treated, baseline, margin: float, confidence: float = 0.95) -> dict:
    """``mean``, ``low`` and ``high`` of ``treated - baseline`` over seeds (lists, one value per
    seed in the same order) and the protocol's ``verdict`` against ``margin`` (``"not
    resolved"`` with fewer than five seeds)."""
    if not isinstance(treated, (list, tuple)) or not isinstance(baseline, (list, tuple)):
        raise TypeError("treated and baseline: must be lists of final losses, one per seed")
    if len(treated) != len(baseline):
        raise ValueError("treated and baseline: need one value per seed on both sides")
    found = protocol.paired_summary(dict(enumerate(treated)), dict(enumerate(baseline)),
                                    margin=margin, confidence=confidence)
    return {key: found[key] for key in ("mean", "low", "high", "verdict")}
