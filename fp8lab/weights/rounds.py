"""Step times in rounds by the book's protocol, with the GPU's own time beside them.

A comparison timed configuration after configuration (all of A, then all of B) reads drift
-- clocks, temperature, the host's other work -- as a difference between A and B.
:func:`alternate_rounds` times the configurations with :func:`fp8lab.protocol.rounds` (a few
calls of each per round, the order reversed every other round), so that drift lands on both
sides. :class:`RoundTimes` reads those rounds as the chapter does: per configuration the median
step and its spread, per pair the protocol's ratio with its interval over the rounds.

A step time alone does not say who set it. :func:`profiled_calls` runs a callable under
:func:`fp8lab.profiling.profile` and times each of those same calls on the book's one clock
(:func:`fp8lab.speedometer.time_calls`), so that the kernel time (the union of the kernels'
intervals) and the call's time come from one measurement: the kernels of a call run between its
two events, so the kernel time cannot exceed the time of the calls that contain it, and the idle
share (the part of the timed calls in which the GPU ran nothing) cannot go below zero.
:meth:`RoundTimes.table` puts that profiled call's time, kernel time and idle share beside every
median of the rounds: a large idle share means the host set the time, and a faster kernel would
not show.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from fp8lab import checks, protocol
from fp8lab.profiling import Profile, profile
from fp8lab.speedometer import Timing, time_calls

__all__ = ["ProfiledCalls", "RoundTimes", "alternate_rounds", "profiled_calls"]


@dataclass(frozen=True)
class ProfiledCalls:
    """Calls of one callable, each timed (``times_ms``) while ``profile`` recorded them."""

    times_ms: tuple
    profile: Profile

    def __post_init__(self):
        if not isinstance(self.times_ms, tuple) or not self.times_ms:
            raise TypeError("times_ms: must be a non-empty tuple of call times in ms")
        for value in self.times_ms:
            checks.number("times_ms[i]", value, non_negative=True)
        if not isinstance(self.profile, Profile):
            raise TypeError(f"profile: must be a Profile, not {type(self.profile).__name__}")

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.times_ms)

    @property
    def spread(self) -> float:
        """The book's spread (:attr:`fp8lab.speedometer.Timing.spread`) of the calls."""
        return Timing("calls", self.times_ms, self.profile.device).spread

    @property
    def kernel_ms(self) -> float:
        """Time per call in which at least one kernel ran (GPU); operators' time (CPU)."""
        return self.profile.busy_ms

    @property
    def idle_fraction(self) -> float:
        """Share of the timed calls in which no kernel ran; NaN on a CPU (no kernels). Not
        clipped: a negative share would say the two clocks disagree, and shows as such."""
        if self.profile.device != "cuda":
            return float("nan")
        return 1.0 - self.kernel_ms / self.mean_ms if self.mean_ms > 0 else float("nan")

    def category_ms(self, category: str) -> float:
        """Milliseconds per call of one :func:`fp8lab.profiling.categorize` category."""
        table = self.profile.by_category()["ms per step"]
        return float(table.get(category, 0.0))


def profiled_calls(
    fn: Callable[[], object],
    *,
    warmup: int = 0,
    iters: int = 1,
    device: torch.device | str = "cpu",
) -> ProfiledCalls:
    """Call ``fn`` ``warmup`` times, then ``iters`` times under the profiler, each call timed
    on the book's one clock."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    checks.integer("warmup", warmup, minimum=0)
    checks.integer("iters", iters)
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    times: list[float] = []
    prof = profile(lambda: times.extend(time_calls(fn, 1, device)), warmup=0, iters=iters,
                   device=device)
    return ProfiledCalls(tuple(times), prof)


@dataclass(frozen=True)
class RoundTimes(protocol.Rounds):
    """:class:`fp8lab.protocol.Rounds` as chapter 06 reads them (``times[label][r]``: the step
    times of configuration ``label`` in round ``r``)."""

    def median(self, label: str) -> float:
        """The median step of ``label`` (:meth:`~fp8lab.protocol.Rounds.median_ms`)."""
        return self.median_ms(label)

    def spread(self, label: str) -> float:
        """The book's spread (:attr:`fp8lab.speedometer.Timing.spread`) of every timed call."""
        return Timing(label, self.flat(label), "rounds").spread

    def ratio(self, base: str, other: str) -> tuple[float, float, float]:
        """``(estimate, low, high)``: ``base``'s time over ``other``'s round by round, with its
        95% interval (:meth:`~fp8lab.protocol.Rounds.compare`): above 1, ``other`` is faster."""
        found = self.compare(other, base)
        return found.estimate, found.low, found.high

    def flat(self, label: str) -> tuple[float, ...]:
        """Every timed call of ``label``, round after round."""
        return tuple(t for rnd in self.times[self._check(label)] for t in rnd)

    def table(self, profiles: Mapping | None = None):
        """Per configuration: median step and spread over the rounds and, from
        ``profiles[label]`` (:class:`ProfiledCalls` of the same callable, after the rounds),
        the profiled call's time with its kernel time and GPU idle share."""
        import pandas as pd

        nan = float("nan")
        rows = {}
        for label in self.times:
            calls = (profiles or {}).get(label)
            if calls is not None and not isinstance(calls, ProfiledCalls):
                raise TypeError(f"profiles[{label!r}]: must be ProfiledCalls")
            rows[label] = {
                "step (ms)": self.median(label), "spread": self.spread(label),
                "profiled step (ms)": calls.mean_ms if calls else nan,
                "kernel time (ms)": calls.kernel_ms if calls else nan,
                "GPU idle": calls.idle_fraction if calls else nan}
        return pd.DataFrame(rows).T


def alternate_rounds(
    steps: Mapping[str, Callable[[], object]],
    *,
    rounds: int = 5,
    iters: int = 3,
    warmup: int = 2,
    device: torch.device | str = "cpu",
) -> RoundTimes:
    """Time each callable of ``steps`` with :func:`fp8lab.protocol.rounds`: ``iters`` calls per
    round in ``rounds`` rounds (at least two: one round gives no interval), after ``warmup``
    untimed calls of each."""
    checks.integer("rounds", rounds)
    checks.integer("iters", iters)
    found = protocol.rounds(steps, rounds=max(rounds, 2), calls=iters, warmup=warmup,
                            kernel_time=None, device=device)
    return RoundTimes(*(getattr(found, f.name) for f in dataclasses.fields(found)))
