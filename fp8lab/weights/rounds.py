"""Step times in alternating rounds, with the GPU's own time beside them.

A comparison timed configuration after configuration (all of A, then all of B) reads drift
-- clocks, temperature, the host's other work -- as a difference between A and B.
:func:`alternate_rounds` runs the configurations in rounds (A B A B ...), each round a few
timed calls of each, so that drift lands on both sides. :class:`RoundTimes` then gives per
configuration the median step and its spread (interquartile range over the median), and per
pair of configurations the ratio of their round medians with its range over the rounds: a
ratio whose range covers 1 is no verdict.

A step time alone does not say who set it. :meth:`RoundTimes.table` takes the profiles of the
same calls (:func:`fp8lab.profiling.profile`) and puts beside every median the kernel time (the
union of the kernels' intervals) and the share of the step in which the GPU ran nothing: a
large idle share means the host set the time, and a faster kernel would not show.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from fp8lab import checks

__all__ = ["RoundTimes", "alternate_rounds"]


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
        return statistics.median(t for rnd in self._check(label) for t in rnd)

    def spread(self, label: str) -> float:
        """Interquartile range over the median of every timed call (0 for one call)."""
        flat = [t for rnd in self._check(label) for t in rnd]
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

    def table(self, profiles: Mapping | None = None):
        """Per configuration: median step, spread, and, from ``profiles[label]`` (a
        :class:`fp8lab.profiling.Profile` of the same calls), kernel time and GPU idle share."""
        import pandas as pd

        rows = {}
        for label in self.times:
            row = {"step (ms)": self.median(label), "spread": self.spread(label)}
            prof = (profiles or {}).get(label)
            row["kernel time (ms)"] = prof.busy_ms if prof is not None else float("nan")
            row["GPU idle"] = prof.idle_fraction if prof is not None else float("nan")
            rows[label] = row
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
