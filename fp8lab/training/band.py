"""The seed-to-seed band every accuracy verdict stands on.

An FP8 run is judged against a **band**: the spread of the same BF16 run over several seeds
(:class:`SeedBand`). A gap to one BF16 run says nothing until it is compared with how much BF16
differs from itself. (Introduced in chapter 03.)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from fp8lab import checks
from fp8lab.training.loop import final_loss


@dataclass(frozen=True)
class SeedBand:
    """The final losses of one setting over several seeds: the noise floor of an accuracy
    verdict."""

    finals: tuple[float, ...]

    def __post_init__(self):
        if not isinstance(self.finals, tuple):
            raise TypeError(f"finals={self.finals!r}: must be a tuple of final losses")
        if len(self.finals) < 2:
            raise ValueError(f"finals: a band needs at least two seeds, got {len(self.finals)}")
        for value in self.finals:
            checks.number("finals[i]", value)

    @classmethod
    def from_runs(cls, runs: Sequence[Sequence[float]], tail: float = 0.1) -> SeedBand:
        return cls(tuple(final_loss(run, tail) for run in runs))

    @property
    def low(self) -> float:
        return min(self.finals)

    @property
    def high(self) -> float:
        return max(self.finals)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.finals)

    @property
    def width(self) -> float:
        return self.high - self.low

    def verdict(self, value: float) -> str:
        """``"inside"`` the band, or ``"above"`` / ``"below"`` it, with the distance in band
        widths."""
        value = checks.number("value", value)
        if self.low <= value <= self.high:
            return "inside"
        side, gap = (
            ("above", value - self.high) if value > self.high else ("below", self.low - value)
        )
        widths = gap / self.width if self.width > 0 else float("inf")
        return f"{side} by {gap:.4f} ({widths:.1f} band widths)"

    def __str__(self) -> str:
        return (
            f"{self.low:.4f}-{self.high:.4f} over {len(self.finals)} seeds (mean {self.mean:.4f})"
        )
