"""Backends timed by the book's protocol, by the GPU's kernel time and by the wall time.

At short sequences one attention step is a few small kernels, and the host's Python and launch
work can take longer than the kernels themselves: a wall-clock time then measures the host, not
the GPU. :func:`interleaved_rounds` times every backend's step with
:func:`fp8lab.protocol.rounds` (the order reversed every other round, so that a drift of clocks
or temperature touches every backend alike; on a GPU the kernels profiled in every round) and
lays the rounds out as a table. :func:`round_summary` gives each backend's median over the
rounds and the round-to-round spread; :func:`faster` is the protocol's verdict on two backends
(by kernel time where it was measured), and :func:`beyond_spread` the same rule for two medians
with their spreads (the chapter uses one rule for every "faster").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping

import pandas as pd

from fp8lab import checks, protocol
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


def interleaved_rounds(
    steps: Mapping[str, Callable[[], None]],
    *,
    rounds: int = 5,
    iters: int = 4,
    warmup_s: float = 1.0,
    device=None,
) -> pd.DataFrame:
    """Time each step of ``steps`` (name -> one forward + backward, say) with
    :func:`fp8lab.protocol.rounds`: ``rounds`` rounds of ``iters`` calls, after one call of each
    and ``warmup_s`` seconds of all of them in turn. Returns one row per (backend, round):
    ``kernel ms`` (the kernels' busy time of one profiled call of that round; NaN on a CPU) and
    ``wall ms`` (the median of the round's calls); the :class:`fp8lab.protocol.Rounds` rides
    along in ``attrs["rounds"]`` for :func:`faster`."""
    checks.integer("iters", iters)
    timed = protocol.rounds(
        steps,
        rounds=rounds,
        calls=iters,
        warmup=1,
        warmup_s=warmup_s,
        kernel_time="rounds",
        device=resolve_device(device, default=True),
    )
    rows = []
    for index, order in enumerate(timed.orders):
        for name in order:
            kernel = timed.kernel.get(name, ())
            rows.append(
                {
                    "backend": name,
                    "round": index,
                    "kernel ms": kernel[index] if kernel else math.nan,
                    "wall ms": statistics.median(timed.times[name][index]),
                }
            )
    frame = pd.DataFrame(rows)
    frame.attrs["rounds"] = timed
    return frame


def _rounds_of(table, what: str, maker: str) -> protocol.Rounds:
    found = table.attrs.get("rounds") if isinstance(table, pd.DataFrame) else None
    if not isinstance(found, protocol.Rounds):
        raise TypeError(f"{what} must be the table {maker} returned")
    return found


def round_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per backend: the median over rounds of ``kernel ms`` and its spread (max - min over the
    median), ``wall ms`` (median over rounds) and ``host ms`` (median wall ms minus median
    kernel ms: time the GPU did not set)."""
    timed = _rounds_of(frame, "frame", "interleaved_rounds")
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
    out.attrs["rounds"] = timed
    return out


def faster(summary: pd.DataFrame, first: str, second: str) -> str:
    """The protocol's verdict on ``first`` against ``second``
    (:meth:`fp8lab.protocol.Rounds.compare`, by kernel time where every round measured it, else
    by wall time), as a phrase:
    ``"te_fused against sdpa_flash: 1.46x faster (95% interval ...; session floor 2.0%)"``."""
    timed = _rounds_of(summary, "summary", "round_summary")
    for argument, name in (("first", first), ("second", second)):
        if not isinstance(name, str) or name not in summary.index:
            raise ValueError(
                f"{argument}={name!r}: not a backend of this summary ({list(summary.index)})"
            )
    by_kernel = all(len(timed.kernel.get(n, ())) == len(timed.orders) for n in (first, second))
    found = timed.compare(first, second, basis="kernel" if by_kernel else "wall")
    return f"{first} against {second}: {found.phrase()}"


def beyond_spread(first_ms: float, second_ms: float, *spreads: float) -> bool:
    """Whether the protocol calls one of two median times faster
    (:func:`fp8lab.protocol.speed_verdict`), their ratio's range set by the larger of their
    relative spreads and the estimate held against the session floor (the widest, as the
    regime is not known here). Inside it, which is faster is not a result."""
    first_ms = checks.number("first_ms", first_ms, positive=True)
    second_ms = checks.number("second_ms", second_ms, positive=True)
    if not spreads:
        raise ValueError("spreads: give at least one relative spread (e.g. 0.05 for 5%)")
    limit = 1 + max(checks.number("spreads", s, non_negative=True) for s in spreads)
    ratio, floor = second_ms / first_ms, protocol.floor_for("host").relative
    word = protocol.speed_verdict(ratio, ratio / limit, ratio * limit, floor)
    return word in (protocol.FASTER, protocol.SLOWER)
