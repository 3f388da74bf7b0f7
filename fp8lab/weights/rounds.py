"""Step times in alternating rounds, with the GPU's own time beside them.

A comparison timed configuration after configuration (all of A, then all of B) reads drift
-- clocks, temperature, the host's other work -- as a difference between A and B.
:func:`alternate_rounds` runs the configurations in rounds (A B A B ...), each round a few
timed calls of each, so that drift lands on both sides. :class:`RoundTimes` then gives per
configuration the median step and its spread (interquartile range over the median), and per
pair of configurations the ratio of their round medians with its range over the rounds: a
ratio whose range covers 1 is no verdict.

A step time alone does not say who set it. :func:`profiled_calls` runs a callable under
:func:`fp8lab.profiling.profile` and times each of those same calls with CUDA events, so that
the kernel time (the union of the kernels' intervals) and the call's time come from one
measurement: the kernels of a call run between its two events, so the kernel time cannot
exceed the time of the calls that contain it, and the idle share (the part of the timed calls
in which the GPU ran nothing) cannot go below zero. :meth:`RoundTimes.table` puts that profiled
call's time, kernel time and idle share beside every median of the rounds: a large idle share
means the host set the time, and a faster kernel would not show.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from fp8lab import checks
from fp8lab.profiling import Profile, profile

__all__ = ["ProfiledCalls", "RoundTimes", "alternate_rounds", "profiled_calls"]


def _timed(fn: Callable[[], object], cuda: bool) -> float:
    """Milliseconds of one call: CUDA events on a GPU, the wall clock on a CPU."""
    if not cuda:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end)


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
        """Interquartile range over the median (0 for one call)."""
        if len(self.times_ms) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.times_ms, n=4)
        return (q3 - q1) / self.median_ms

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
    (CUDA events on a GPU, the wall clock on a CPU)."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    checks.integer("warmup", warmup, minimum=0)
    checks.integer("iters", iters)
    device = torch.device(device)
    cuda = device.type == "cuda"
    for _ in range(warmup):
        fn()
    times: list[float] = []
    prof = profile(lambda: times.append(_timed(fn, cuda)), warmup=0, iters=iters,
                   device=device)
    return ProfiledCalls(tuple(times), prof)


@dataclass(frozen=True)
class RoundTimes:
    """``times[label][r]``: the step times (ms) of configuration ``label`` in round ``r``."""

    times: dict

    def __post_init__(self):
        if not isinstance(self.times, dict) or not self.times:
            raise TypeError("times: must be a non-empty dict of label -> rounds of step times")

    def _check(self, label: str) -> list:
        if label not in self.times:
            raise ValueError(f"label={label!r}: must be one of {sorted(self.times)}")
        return self.times[label]

    def median(self, label: str) -> float:
        """Median over every timed call of ``label``."""
        return statistics.median(self.flat(label))

    def spread(self, label: str) -> float:
        """Interquartile range over the median of every timed call (0 for one call)."""
        flat = self.flat(label)
        if len(flat) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(flat, n=4)
        return (q3 - q1) / statistics.median(flat)

    def ratio(self, base: str, other: str) -> tuple[float, float, float]:
        """``(median, low, high)`` over the rounds of ``base``'s round median over ``other``'s:
        above 1, ``other`` is faster."""
        pairs = zip(self._check(base), self._check(other), strict=True)
        ratios = [statistics.median(a) / statistics.median(b) for a, b in pairs]
        return statistics.median(ratios), min(ratios), max(ratios)

    def flat(self, label: str) -> tuple[float, ...]:
        """Every timed call of ``label``, round after round."""
        return tuple(t for rnd in self._check(label) for t in rnd)

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
    """Time each callable of ``steps`` ``iters`` times per round, in ``rounds`` alternating
    rounds, after ``warmup`` untimed calls of each."""
    if not isinstance(steps, Mapping) or not steps:
        raise TypeError("steps: must be a non-empty mapping of label -> callable")
    for label, fn in steps.items():
        if not isinstance(label, str) or not callable(fn):
            raise TypeError(f"steps[{label!r}]: must map a string label to a callable")
    checks.integer("rounds", rounds)
    checks.integer("iters", iters)
    checks.integer("warmup", warmup, minimum=0)
    cuda = torch.device(device).type == "cuda"
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    times = {label: [] for label in steps}
    for _ in range(rounds):
        for label, fn in steps.items():
            times[label].append(tuple(_timed(fn, cuda) for _ in range(iters)))
    return RoundTimes(times)
