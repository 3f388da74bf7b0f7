"""Verdict words, decided one way for the whole book.

* :class:`Comparison` -- a speed ratio measured once per round: its estimate, interval and the
  word :func:`speed_verdict` gives it against the session floor;
* :class:`Paired` (from :func:`paired`) -- an accuracy difference paired over seeds: its
  interval against a margin declared before the runs, and the smallest difference the design
  could detect; :func:`paired_summary`, the same as a table row, which a run of fewer seeds
  (a smoke run) still gives, without a verdict.

Both give a ``record()`` (a plain dict) that the glue of the prose keeps, so that a re-run in a
second GPU session can say which verdict flipped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from fp8lab import checks
from fp8lab.protocol.floor import Floor, floor_of
from fp8lab.protocol.intervals import detectable_difference, mean_interval, ratio_interval

__all__ = ["FASTER", "NOT_RESOLVED", "SLOWER", "TIED", "Comparison", "Paired", "judged",
           "paired", "paired_summary"]

FASTER, SLOWER, TIED, NOT_RESOLVED = "faster", "slower", "tied", "not resolved"
MIN_SEEDS = 5  # the protocol's least number of paired seeds for an accuracy verdict
WITHIN, WORSE, BETTER, IDENTICAL = (
    "within the margin",
    "worse beyond the margin",
    "better beyond the margin",
    "identical",
)


def _finite(record: dict) -> dict:
    """``record`` with NaN and infinite numbers as ``None`` (JSON has neither)."""
    return {
        key: None if isinstance(value, float) and not math.isfinite(value) else value
        for key, value in record.items()
    }


def speed_verdict(estimate: float, low: float, high: float, floor: float) -> str:
    """The word for a speed ratio (> 1: faster) with interval ``[low, high]`` against a relative
    ``floor``: ``faster``/``slower`` when the interval excludes 1 and the estimate lies beyond
    the floor; ``tied`` when the whole interval lies inside the floor; else ``not resolved``."""
    estimate = checks.number("estimate", estimate, positive=True)
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not floor >= 0:
        raise ValueError(f"floor={floor!r}: must be a relative floor >= 0 (inf: none measured)")
    if math.isnan(low) or math.isnan(high) or math.isinf(floor):  # inf: no floor measured
        return NOT_RESOLVED
    if low > 1 and estimate > 1 + floor:
        return FASTER
    if high < 1 and estimate < 1 / (1 + floor):
        return SLOWER
    if low >= 1 / (1 + floor) and high <= 1 + floor:
        return TIED
    return NOT_RESOLVED


@dataclass(frozen=True)
class Comparison:
    """``first`` against ``second``: ``ratios[r]`` is second's time over first's in round ``r``
    (above 1, ``first`` is faster), measured on ``basis`` (``"wall"`` or ``"kernel"``) in a
    ``regime`` whose session ``floor`` a verdict must exceed."""

    first: str
    second: str
    ratios: tuple[float, ...]
    basis: str
    regime: str
    floor: Floor
    confidence: float = 0.95

    def __post_init__(self):
        if not isinstance(self.ratios, tuple) or not self.ratios:
            raise TypeError("ratios: must be a non-empty tuple of per-round ratios")
        for value in self.ratios:
            checks.number("ratios[i]", value, positive=True)
        checks.choice("basis", self.basis, ("wall", "kernel"))
        if not isinstance(self.floor, Floor):
            raise TypeError(f"floor: must be a protocol.Floor, not {type(self.floor).__name__}")

    @property
    def interval(self) -> tuple[float, float, float]:
        return ratio_interval(list(self.ratios), self.confidence)

    @property
    def estimate(self) -> float:
        return self.interval[0]

    @property
    def low(self) -> float:
        return self.interval[1]

    @property
    def high(self) -> float:
        return self.interval[2]

    @property
    def verdict(self) -> str:
        return speed_verdict(self.estimate, self.low, self.high, self.floor.relative)

    def against(self, floor: Floor) -> Comparison:
        """The same rounds judged against another ``floor``."""
        if not isinstance(floor, Floor):
            raise TypeError(f"floor: must be a protocol.Floor, not {type(floor).__name__}")
        return replace(self, floor=floor)

    def phrase(self, digits: int = 2) -> str:
        """The verdict as the prose gives it, with its interval and the floor it stood against,
        e.g. ``1.46x faster (95% interval 1.45-1.47x over 7 rounds; session floor 2.0%)``; a
        slowdown is stated as one, interval included (``1.64x slower (95% interval
        1.62-1.66x ...)``), and an interval that rounds to one number gets a digit more."""
        checks.integer("digits", digits, minimum=0)
        word = {TIED: "tied at", NOT_RESOLVED: "not resolved at"}.get(self.verdict)
        head = f"{word} {self.estimate:.{digits}f}×" if word else (
            f"{self.estimate:.{digits}f}× {self.verdict}"
            if self.verdict == FASTER
            else f"{1 / self.estimate:.{digits}f}× slower"
        )
        if math.isnan(self.low):
            spread = f"{len(self.ratios)} round, no interval"
        else:  # a slowdown's interval in the slowdown's own terms
            low, high = (
                (1 / self.high, 1 / self.low) if self.verdict == SLOWER else (self.low, self.high)
            )
            shown = digits if f"{low:.{digits}f}" != f"{high:.{digits}f}" else digits + 1
            spread = (
                f"{self.confidence:.0%} interval {low:.{shown}f}–{high:.{shown}f}× "
                f"over {len(self.ratios)} rounds"
            )
        basis = ", kernel time" if self.basis == "kernel" else ""
        floor = self.floor.relative
        floor = f"{self.floor.label} {floor:.1%}" if math.isfinite(floor) else "no session floor"
        return f"{head} ({spread}{basis}; {floor})"

    def record(self) -> dict:
        """What a re-run compares: the verdict, the estimate, its interval and the floor
        (non-finite numbers as ``None``)."""
        return _finite({
            "kind": "speed",
            "first": self.first,
            "second": self.second,
            "verdict": self.verdict,
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "rounds": len(self.ratios),
            "basis": self.basis,
            "regime": self.regime,
            "floor": self.floor.relative,
        })


@dataclass(frozen=True)
class Paired:
    """``treated`` minus ``baseline`` per seed (for a loss: above 0, ``treated`` is worse),
    judged against ``margin``; ``detectable`` is the smallest true difference the design finds
    with probability ``power``."""

    treated: str
    baseline: str
    seeds: tuple[int, ...]
    differences: tuple[float, ...]
    margin: float
    confidence: float = 0.95
    power: float = 0.8

    def __post_init__(self):
        checks.number("margin", self.margin, positive=True)
        if len(self.differences) != len(self.seeds) or len(self.seeds) < 2:
            raise ValueError("differences: need one per seed, and at least two seeds")

    @property
    def interval(self) -> tuple[float, float, float]:
        return mean_interval(list(self.differences), self.confidence)

    @property
    def mean(self) -> float:
        return self.interval[0]

    @property
    def low(self) -> float:
        return self.interval[1]

    @property
    def high(self) -> float:
        return self.interval[2]

    @property
    def sd(self) -> float:
        values, mean = self.differences, self.mean
        return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))

    @property
    def detectable(self) -> float:
        return detectable_difference(self.sd, len(self.seeds), self.confidence, self.power)

    @property
    def verdict(self) -> str:
        if all(d == 0 for d in self.differences):
            return IDENTICAL
        if -self.margin < self.low and self.high < self.margin:
            return WITHIN
        if self.low > self.margin:
            return WORSE
        if self.high < -self.margin:
            return BETTER
        return NOT_RESOLVED

    def phrase(self, digits: int = 4) -> str:
        """E.g. ``within the margin: +0.0012 (95% interval -0.0008 to +0.0031) over 5 seeds,
        margin ±0.0100; detects 0.0030 with 80% power``."""
        checks.integer("digits", digits, minimum=0)
        d = digits
        return (
            f"{self.verdict}: {self.mean:+.{d}f} ({self.confidence:.0%} interval "
            f"{self.low:+.{d}f} to {self.high:+.{d}f}) over {len(self.seeds)} seeds, margin "
            f"±{self.margin:.{d}f}; detects {self.detectable:.{d}f} with {self.power:.0%} power"
        )

    def record(self) -> dict:
        return _finite({
            "kind": "accuracy",
            "treated": self.treated,
            "baseline": self.baseline,
            "verdict": self.verdict,
            "estimate": self.mean,
            "low": self.low,
            "high": self.high,
            "seeds": len(self.seeds),
            "margin": self.margin,
            "detectable": self.detectable,
        })


def _by_seed(name: str, values) -> dict[int, float]:
    if not isinstance(values, Mapping):
        raise TypeError(f"{name}={checks.show(values)}: must map seeds (int) to values")
    for seed in values:
        checks.integer(f"{name} seed", seed, minimum=0)
    return {int(s): checks.number(f"{name}[{s}]", v) for s, v in values.items()}


def paired(
    treated: Mapping[int, float],
    baseline: Mapping[int, float],
    *,
    margin: float,
    names: Sequence[str] = ("treated", "baseline"),
    confidence: float = 0.95,
    power: float = 0.8,
    min_seeds: int = MIN_SEEDS,
) -> Paired:
    """``treated[s] - baseline[s]`` over the seeds both have (each a ``{seed: value}``, same
    initial weights and batches for one seed on both sides), against ``margin`` (> 0, declared
    before the runs). Raises ``ValueError`` with fewer than ``min_seeds`` shared seeds (the
    protocol's floor is five) or a non-finite value (a run that diverged is a result to report,
    not a number to average)."""
    treated, baseline = _by_seed("treated", treated), _by_seed("baseline", baseline)
    margin = checks.number("margin", margin, positive=True)
    min_seeds = checks.integer("min_seeds", min_seeds, minimum=2)
    if isinstance(names, str) or len(names) != 2 or not all(isinstance(n, str) for n in names):
        raise TypeError(f"names={checks.show(names)}: must be two strings")
    seeds = tuple(sorted(set(treated) & set(baseline)))
    if len(seeds) < min_seeds:
        raise ValueError(
            f"treated and baseline share {len(seeds)} seeds: the protocol needs at least "
            f"{min_seeds}"
        )
    differences = tuple(treated[s] - baseline[s] for s in seeds)
    confidence = checks.number("confidence", confidence, positive=True, maximum=0.999)
    power = checks.number("power", power, positive=True, maximum=0.999)
    return Paired(names[0], names[1], seeds, differences, margin, confidence, power)


def paired_summary(treated, baseline, *, margin, names=("treated", "baseline"),
                   confidence: float = 0.95) -> dict:
    """:func:`paired` as a table row: ``seeds`` (how many pairs), ``mean``, ``low``, ``high``
    and ``verdict``; with fewer than :data:`MIN_SEEDS` shared seeds (a smoke run) the mean and
    its interval still (NaN bounds with one pair), and the verdict "not resolved"."""
    treated, baseline = _by_seed("treated", treated), _by_seed("baseline", baseline)
    seeds = sorted(set(treated) & set(baseline))
    if len(seeds) >= MIN_SEEDS:
        found = paired(treated, baseline, margin=margin, names=names, confidence=confidence)
        mean, low, high, verdict = found.mean, found.low, found.high, found.verdict
    else:
        checks.number("margin", margin, positive=True)
        if not seeds:
            raise ValueError("treated and baseline share no seed")
        mean, low, high = mean_interval([treated[s] - baseline[s] for s in seeds], confidence)
        verdict = NOT_RESOLVED
    return {"seeds": len(seeds), "mean": mean, "low": low, "high": high, "verdict": verdict}


def judged(name: str, verdict):
    """``verdict`` as the book states it under the name ``name``: a speed comparison whose
    verdict flipped between two GPU sessions is judged against its own floor
    (:func:`fp8lab.protocol.floor.floor_of`); anything else is returned as it is."""
    if not isinstance(verdict, Comparison):
        return verdict
    floor = floor_of(name, verdict.regime)
    return verdict if floor == verdict.floor or not floor.own else verdict.against(floor)
