"""Paired differences over seeds, judged against a margin declared first, by the protocol.

Runs on a GPU with one seed are deterministic here: repeating a run gives the same losses bit
for bit, so "two runs without the option" is a noise floor of exactly zero and says nothing.
What varies is the seed. Each seed is run with and without the option (same initial weights,
same batches), the difference of their final losses is taken per seed, and the protocol
(:func:`fp8lab.protocol.paired_summary`) sets their mean and its interval against a margin
written down before the runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from fp8lab import protocol

__all__ = ["paired_difference"]


def paired_difference(
    treated: Sequence[float], baseline: Sequence[float], margin: float, confidence: float = 0.95
) -> dict:
    """``mean``, ``low`` and ``high`` of ``treated - baseline`` over seeds (one value per seed,
    in the same order on both sides) and the protocol's ``verdict`` against ``margin``
    (``"not resolved"`` with fewer than five seeds)."""
    if not isinstance(treated, (list, tuple)) or not isinstance(baseline, (list, tuple)):
        raise TypeError("treated and baseline: must be lists of final losses, one per seed")
    if len(treated) != len(baseline):
        raise ValueError("treated and baseline: need one value per seed on both sides")
    found = protocol.paired_summary(
        dict(enumerate(treated)), dict(enumerate(baseline)), margin=margin,
        confidence=confidence,
    )
    return {key: found[key] for key in ("mean", "low", "high", "verdict")}
