"""Alternatives timed in rounds: the only way the book times a comparison.

:func:`rounds` warms every alternative up, then times ``calls`` back-to-back calls of each in
every round with the book's one clock (:func:`fp8lab.speedometer.time_calls`), the order of the
alternatives reversed (or shuffled) from one round to the next. Each round gives each
alternative one number, the median of its calls; a comparison (:meth:`Rounds.compare`) pairs
two alternatives round by round, so that what drifts between rounds cancels in the ratio.

Beside that wall time (CUDA events: what a training loop sees), :func:`rounds` measures the
kernels' own time with :func:`fp8lab.profiling.profile` -- once per alternative after the
rounds, or in every round (``kernel_time="rounds"``) when a verdict is to be taken on it. The
profile's idle share (the part of its span in which no kernel ran, both ends read off the same
profiler clock) says whether the host sets the step, which picks the session floor a wall-time
verdict must clear (:mod:`fp8lab.protocol.floor`).

:meth:`Rounds.from_times` wraps times measured elsewhere (worker processes) in the same rules.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fp8lab import checks
from fp8lab.protocol.floor import HOST_BOUND_IDLE, floor_for
from fp8lab.protocol.verdicts import Comparison

__all__ = ["ORDERS", "Rounds", "rounds"]

ORDERS = ("reverse", "shuffle")
KERNEL_TIMES = (None, "once", "rounds")


def _times(name: str, value) -> tuple[tuple[float, ...], ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise TypeError(f"times[{name!r}]: must be a non-empty list of rounds of call times")
    rounds_ = []
    for index, calls in enumerate(value):
        if not isinstance(calls, (list, tuple)) or not calls:
            raise TypeError(f"times[{name!r}][{index}]: must be a non-empty list of ms")
        rounds_.append(tuple(checks.number("call time", t, non_negative=True) for t in calls))
    return tuple(rounds_)


@dataclass(frozen=True)
class Rounds:
    """``times[name][r]``: the call times (ms) of alternative ``name`` in round ``r``;
    ``kernel[name]``: its kernels' busy time per call (ms) and ``idle[name]`` the profile's idle
    share, one value per profiled round (one in all with ``kernel_time="once"``; absent where
    not measured); ``cuda``: timed on a GPU; ``host[name][r]``: the host's time per call to
    issue round ``r``'s calls, before it waited (:class:`fp8lab.speedometer.CallTimes`)."""

    times: Mapping[str, tuple[tuple[float, ...], ...]]
    kernel: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    idle: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    cuda: bool = True
    orders: tuple[tuple[str, ...], ...] = ()
    host: Mapping[str, tuple[float, ...]] = field(default_factory=dict)

    @classmethod
    def from_times(cls, times: Mapping, cuda: bool = True):
        """Times measured elsewhere (``{name: [[ms, ...] per round]}``), with the same rules."""
        if not isinstance(times, Mapping) or not times:
            raise TypeError("times: must be a non-empty dict of name -> rounds of call times")
        checked = {str(name): _times(name, value) for name, value in times.items()}
        if len({len(v) for v in checked.values()}) != 1:
            raise ValueError("times: every alternative needs the same number of rounds")
        return cls(checked, cuda=checks.flag("cuda", cuda))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.times)

    def _check(self, name: str) -> str:
        if name not in self.times:
            raise ValueError(f"name={name!r}: must be one of {list(self.times)}")
        return name

    def round_ms(self, name: str) -> tuple[float, ...]:
        """One number per round: the median of that round's calls."""
        return tuple(statistics.median(calls) for calls in self.times[self._check(name)])

    def median_ms(self, name: str) -> float:
        """The median over the rounds of :meth:`round_ms`."""
        return statistics.median(self.round_ms(name))

    def round_range(self, name: str) -> float:
        """(largest - smallest) round median over the median: how far rounds moved."""
        values = self.round_ms(name)
        return (max(values) - min(values)) / statistics.median(values)

    def kernel_ms(self, name: str) -> float:
        """The kernels' own time per call (median of the profiled rounds); NaN if unmeasured."""
        values = self.kernel.get(self._check(name), ())
        return statistics.median(values) if values else math.nan

    def idle_share(self, name: str) -> float:
        """The share of the profiled span in which the GPU ran no kernel (the median over the
        profiled rounds); NaN if unmeasured."""
        values = self.idle.get(self._check(name), ())
        return statistics.median(values) if values else math.nan

    def regime(self, *names: str) -> str:
        """``"device"`` when the GPU sets every named alternative's step, else ``"host"``
        (also on a CPU, and where kernel time was not measured: the wider floor)."""
        shares = [self.idle_share(n) for n in names or self.names]
        if not self.cuda or any(math.isnan(s) for s in shares):
            return "host"
        return "host" if max(shares) > HOST_BOUND_IDLE else "device"

    def compare(self, first: str, second: str, basis: str = "wall") -> Comparison:
        """``first`` against ``second``, round by round: the ratio of second's time to first's
        (above 1: first is faster), on the wall time or (``basis="kernel"``, which needs
        ``kernel_time="rounds"``) on the kernels' own time."""
        self._check(first), self._check(second)
        checks.choice("basis", basis, ("wall", "kernel"))
        if basis == "kernel":
            a, b = self.kernel.get(first, ()), self.kernel.get(second, ())
            if len(a) < 2 or len(a) != len(b):
                raise ValueError("basis='kernel' needs kernel time in every round "
                                 "(rounds(..., kernel_time='rounds'))")
            regime = "kernel"
        else:
            a, b = self.round_ms(first), self.round_ms(second)
            regime = self.regime(first, second)
        if min(*a, *b) <= 0:
            raise ValueError(f"times of {first!r} and {second!r}: a ratio needs times above 0 ms")
        ratios = tuple(y / x for x, y in zip(a, b, strict=True))
        return Comparison(first, second, ratios, basis, regime, floor_for(regime))

    def table(self):
        """Per alternative: median ms over the rounds, their range, kernel ms and GPU idle."""
        import pandas as pd

        rows = {
            name: {
                "ms": self.median_ms(name),
                "round range": self.round_range(name),
                "kernel ms": self.kernel_ms(name),
                "GPU idle": self.idle_share(name),
            }
            for name in self.names
        }
        return pd.DataFrame(rows).T


def _check_steps(steps) -> dict[str, Callable[[], object]]:
    if not isinstance(steps, Mapping) or len(steps) < 1:
        raise TypeError("steps: must be a non-empty dict of name -> zero-argument callable")
    for name, step in steps.items():
        if not isinstance(name, str) or not callable(step):
            raise TypeError(f"steps[{name!r}]: must map a string name to a callable")
    return dict(steps)


def _check_rounds(steps, rounds, calls, warmup, warmup_s, order, kernel_time, before_each, seed):
    """The checked ``steps`` of :func:`rounds`; every other argument checked by name."""
    steps = _check_steps(steps)
    checks.integer("rounds", rounds, minimum=2)
    checks.integer("calls", calls)
    checks.integer("warmup", warmup, minimum=0)
    checks.number("warmup_s", warmup_s, non_negative=True)
    checks.choice("order", order, ORDERS)
    checks.choice("kernel_time", kernel_time, KERNEL_TIMES)
    if before_each is not None and not callable(before_each):
        raise TypeError(f"before_each must be callable, not {type(before_each).__name__}")
    checks.integer("seed", seed, minimum=0)
    return steps


def _order(names: list[str], index: int, order: str, rng: random.Random) -> list[str]:
    if order == "shuffle":
        return rng.sample(names, len(names))
    return names if index % 2 == 0 else names[::-1]


def _warm(steps, warmup: int, warmup_s: float, sync: Callable[[], None]) -> None:
    """``warmup`` calls of each, then all of them in turn until ``warmup_s`` have passed."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    sync()
    started = time.perf_counter()
    while time.perf_counter() - started < warmup_s:
        for step in steps.values():
            step()
        sync()


def rounds(
    steps: Mapping[str, Callable[[], object]],
    *,
    rounds: int = 7,
    calls: int = 5,
    warmup: int = 3,
    warmup_s: float = 0.0,
    order: str = "reverse",
    kernel_time: str | None = "once",
    before_each: Callable[[], object] | None = None,
    device=None,
    seed: int = 0,
) -> Rounds:
    """Time every callable of ``steps`` (name -> one step) in ``rounds`` rounds of ``calls``
    calls each, after ``warmup`` calls of each and ``warmup_s`` seconds of all in turn; the
    order reversed every other round (``order="reverse"``) or shuffled (``"shuffle"``, seeded).
    ``kernel_time``: profile ``calls`` more calls of each alternative once after the rounds
    (``"once"``), in every round (``"rounds"``) or not at all (``None``); GPU only.
    ``before_each`` runs before each alternative's calls (a barrier, in a process group)."""
    import torch

    from fp8lab.devices import resolve_device

    steps = _check_rounds(steps, rounds, calls, warmup, warmup_s, order, kernel_time,
                          before_each, seed)
    device = resolve_device(device, default=True)
    cuda = device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    _warm(steps, warmup, warmup_s, sync)
    return _timed(steps, rounds, calls, order, kernel_time if cuda else None, before_each,
                  device, random.Random(seed))


def _timed(steps, rounds, calls, order, kernel_time, before_each, device, rng) -> Rounds:
    """The rounds themselves, after warm-up (arguments as :func:`rounds` checked them)."""
    from fp8lab.profiling import profile
    from fp8lab.speedometer import time_calls

    names = list(steps)
    times, host = {name: [] for name in names}, {name: [] for name in names}
    kernel, idle = {name: [] for name in names}, {name: [] for name in names}
    orders = []

    def profiled(name, iters):
        seen = profile(steps[name], warmup=0, iters=iters, device=device)
        kernel[name].append(seen.busy_ms)
        idle[name].append(seen.idle_fraction)

    for index in range(rounds):
        sequence = _order(names, index, order, rng)
        orders.append(tuple(sequence))
        for name in sequence:
            if before_each is not None:
                before_each()
            measured = time_calls(steps[name], calls, device)
            times[name].append(tuple(measured))
            host[name].append(measured.host_ms)
            if kernel_time == "rounds":
                profiled(name, calls)
    if kernel_time == "once":
        for name in names:
            profiled(name, calls)
    return Rounds(
        {n: tuple(v) for n, v in times.items()},
        {n: tuple(v) for n, v in kernel.items() if v},
        {n: tuple(v) for n, v in idle.items() if v},
        device.type == "cuda",
        tuple(orders),
        {n: tuple(v) for n, v in host.items()},
    )
