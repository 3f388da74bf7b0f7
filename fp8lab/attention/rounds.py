"""Backends timed in alternated rounds, by the GPU's kernel time and by the host's wall time.

At short sequences one attention step is a few small kernels, and the host's Python and launch
work can take longer than the kernels themselves: a wall-clock time then measures the host, not
the GPU. :func:`interleaved_rounds` runs every backend's step in each round, in an order that
alternates from round to round (so a drift of clocks or temperature touches every backend
alike), and records per step both the kernel time the profiler saw
(:func:`fp8lab.profiling.profile`, the sum of the kernels' own times) and the wall time of the
same steps. :func:`round_summary` gives each backend's median over the rounds and the
round-to-round spread; :func:`faster` calls a difference only where it exceeds that spread,
and :func:`beyond_spread` is the same rule for any two medians with their spreads (the chapter
uses one rule for every "faster").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import pandas as pd
import torch

from fp8lab import checks, profiling
from fp8lab.attention import backends
from fp8lab.attention.functional import AttentionShape
from fp8lab.attention.run import _builder, _Options, _Workload
from fp8lab.devices import resolve_device

__all__ = ["backend_step", "beyond_spread", "faster", "interleaved_rounds", "round_summary"]


def backend_step(
    backend: str, shape: AttentionShape, te=None, *, device=None, context=None, env=None
):
    """One forward + backward of ``backend`` on fresh ``shape`` inputs, as a zero-argument
    callable for :func:`interleaved_rounds`. SDPA backends run every call under their
    ``sdpa_kernel`` pin; a TE backend selects once, inside its switches, and later calls reuse
    TE's cached selection (the switches are not re-read per call, so no reselection cost is
    timed). ``context`` wraps each forward (``lambda: te.autocast(recipe=...)``); ``env``
    (``{"NVTE_FP8_DPA_BWD": "0"}``, say) is set around every call, which makes TE select again
    each call: use it for kernel times, not for host times."""
    checks.choice("backend", backend, backends.BACKENDS)
    if not isinstance(shape, AttentionShape):
        raise TypeError(f"shape must be an AttentionShape, not {type(shape).__name__}")
    if backend.startswith("te_"):
        backends._check_te(te)
    device = resolve_device(device, default=True)
    env = backends._check_env(env)
    options = _Options("forward_backward", context, 0, 2, False)
    with backends.backend_context(backend, env):
        workload = _Workload(
            _builder(backend, shape, te), lambda: shape.make_inputs(device=device), options
        )
        workload()
    if backend.startswith("te_") and not env:
        return workload

    def step() -> None:
        with backends.backend_context(backend, env):
            workload()

    return step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _warm(steps: Mapping[str, Callable[[], None]], seconds: float, device) -> None:
    """Every step at least once, then all of them in turn until ``seconds`` have passed."""
    started = time.perf_counter()
    while True:
        for step in steps.values():
            step()
        _sync(device)
        if time.perf_counter() - started >= seconds:
            return


def _wall_ms(step: Callable[[], None], iters: int, device) -> float:
    """Host clock per call over ``iters`` calls, synchronised before and after."""
    _sync(device)
    started = time.perf_counter()
    for _ in range(iters):
        step()
    _sync(device)
    return (time.perf_counter() - started) * 1e3 / iters


def _check_steps(steps) -> dict[str, Callable[[], None]]:
    if not isinstance(steps, Mapping) or not steps:
        raise TypeError("steps must be a non-empty dict of names to zero-argument callables")
    for name, step in steps.items():
        if not isinstance(name, str) or not callable(step):
            raise TypeError(f"steps[{name!r}] must be a callable under a string name")
    return dict(steps)


def interleaved_rounds(
    steps: Mapping[str, Callable[[], None]],
    *,
    rounds: int = 5,
    iters: int = 4,
    warmup_s: float = 1.0,
    device=None,
) -> pd.DataFrame:
    """Time each step of ``steps`` (name -> one forward + backward, say) in ``rounds`` rounds of
    ``iters`` calls, after ``warmup_s`` seconds of all of them in turn; the order within a round
    is reversed every other round. Returns one row per (backend, round): ``kernel ms`` (per
    call, the kernels' own times; on a CPU, the operators' self times) and ``wall ms`` (per
    call, host clock around ``iters`` unprofiled calls just before, synchronised)."""
    steps = _check_steps(steps)
    checks.integer("rounds", rounds, minimum=2)
    checks.integer("iters", iters)
    warmup_s = checks.number("warmup_s", warmup_s, non_negative=True)
    device = resolve_device(device, default=True)
    _warm(steps, warmup_s, device)
    names, rows = list(steps), []
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            wall_ms = _wall_ms(steps[name], iters, device)
            seen = profiling.profile(steps[name], warmup=0, iters=iters, device=device)
            rows.append(
                {"backend": name, "round": index, "kernel ms": seen.kernel_ms, "wall ms": wall_ms}
            )
    return pd.DataFrame(rows)


def round_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per backend: the median over rounds of ``kernel ms`` and its spread (max - min over the
    median), and ``host ms`` (median wall ms minus median kernel ms: time the GPU did not set)."""
    if not isinstance(frame, pd.DataFrame) or not {"backend", "kernel ms"} <= set(frame):
        raise TypeError("frame must be the table interleaved_rounds returned")
    grouped = frame.groupby("backend", sort=False)
    kernel = grouped["kernel ms"]
    out = pd.DataFrame(
        {
            "kernel ms": kernel.median(),
            "spread": (kernel.max() - kernel.min()) / kernel.median(),
            "wall ms": grouped["wall ms"].median(),
        }
    )
    out["host ms"] = (out["wall ms"] - out["kernel ms"]).clip(lower=0.0)
    return out


def faster(summary: pd.DataFrame, first: str, second: str) -> str:
    """``"<first> faster"``, ``"<second> faster"`` or ``"tied (within the spread)"``: a
    difference of median kernel times counts only beyond the larger round-to-round spread of
    the two."""
    if not isinstance(summary, pd.DataFrame) or "kernel ms" not in summary:
        raise TypeError("summary must be the table round_summary returned")
    for argument, name in (("first", first), ("second", second)):
        if not isinstance(name, str) or name not in summary.index:
            raise ValueError(
                f"{argument}={name!r}: not a backend of this summary ({list(summary.index)})"
            )
    a, b = summary.loc[first], summary.loc[second]
    if not beyond_spread(a["kernel ms"], b["kernel ms"], a["spread"], b["spread"]):
        return "tied (within the spread)"
    return f"{first if a['kernel ms'] < b['kernel ms'] else second} faster"


def beyond_spread(first_ms: float, second_ms: float, *spreads: float) -> bool:
    """Whether two median times differ by more than the larger of their relative spreads:
    ``|first / second - 1| > max(spreads)``. Inside it, which is faster is not a result."""
    first_ms = checks.number("first_ms", first_ms, positive=True)
    second_ms = checks.number("second_ms", second_ms, positive=True)
    if not spreads:
        raise ValueError("spreads: give at least one relative spread (e.g. 0.05 for 5%)")
    limit = max(checks.number("spreads", s, non_negative=True) for s in spreads)
    return abs(first_ms / second_ms - 1) > limit
