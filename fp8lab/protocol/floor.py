"""The session-to-session floor: how far a speed ratio moves between GPU sessions.

Rounds in one session see that session's noise only. The same comparison measured again a day
later, on another machine of the same kind, moves by more: another physical GPU, its clocks and
temperature, another host. The book measured that by running one panel of comparisons
(``tools/session_floor.py``) in separate GPU sessions; :data:`PANEL` holds each comparison's
estimate per session, and the files they came from are committed beside the GPU results
(``tests/gpu_results/session_floor/``; a test checks that the two agree).

A comparison's **move** is the range of its estimates over the sessions, as a relative change. A
regime's floor is the largest move of the panel's comparisons in that regime (each measured in
at least two sessions, one of them in three or more), rounded up to half a percent:

* ``device`` -- the GPU sets the step (its idle share under :data:`HOST_BOUND_IDLE`), wall time;
* ``host`` -- the host sets it (launch-bound steps), wall time; unmeasured regimes use this one;
* ``kernel`` -- comparisons of the kernels' own time (the host left out), any step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fp8lab import checks

__all__ = [
    "FLOORS", "HOST_BOUND_IDLE", "PANEL", "REGIMES", "Floor", "floor_for", "floors_from",
    "largest_move",
]

REGIMES = ("device", "host", "kernel")
# The GPU idle share of a step above which the host, not the GPU, sets its time.
HOST_BOUND_IDLE = 0.25
SOURCE = "tests/gpu_results/session_floor/ (tools/session_floor.py)"

# comparison -> (regime, {session: estimate of the speed ratio}); written by
# `python -m tools.session_floor summary` from the committed panel files.
PANEL: dict[str, tuple[str, dict[str, float]]] = {
    'GEMM 8192, FP8 fast accum. vs BF16': ('device', {
        '20261127-0429_nvidia-h200': 1.9441,
        '20261127-0458_nvidia-h200': 1.9558,
        '20261127-0504_nvidia-h100-80gb-hbm3': 1.9312,
        '20261127-0536_nvidia-h100-80gb-hbm3': 1.946,
    }),
    'GEMM 8192 BF16, NN vs TN': ('device', {
        '20261127-0429_nvidia-h200': 1.0044,
        '20261127-0458_nvidia-h200': 1.0038,
        '20261127-0504_nvidia-h100-80gb-hbm3': 0.982,
        '20261127-0536_nvidia-h100-80gb-hbm3': 1.0079,
    }),
    'layer H=4096, FP8 delayed vs BF16': ('device', {
        '20261127-0429_nvidia-h200': 1.5236,
        '20261127-0458_nvidia-h200': 1.5212,
        '20261127-0504_nvidia-h100-80gb-hbm3': 1.5152,
        '20261127-0536_nvidia-h100-80gb-hbm3': 1.48,
    }),
    'layer H=4096 BF16, A/A': ('device', {
        '20261127-0429_nvidia-h200': 1.0166,
        '20261127-0458_nvidia-h200': 0.993,
        '20261127-0504_nvidia-h100-80gb-hbm3': 1.0165,
        '20261127-0536_nvidia-h100-80gb-hbm3': 1.013,
    }),
    'layer H=512 eager, FP8 delayed vs BF16': ('host', {
        '20261127-0429_nvidia-h200': 0.8233,
        '20261127-0458_nvidia-h200': 0.8348,
        '20261127-0504_nvidia-h100-80gb-hbm3': 0.8373,
        '20261127-0536_nvidia-h100-80gb-hbm3': 0.8196,
    }),
    'layer H=512, FP8 delayed vs BF16 (kernels)': ('kernel', {
        '20261127-0429_nvidia-h200': 0.9817,
        '20261127-0458_nvidia-h200': 0.9814,
        '20261127-0504_nvidia-h100-80gb-hbm3': 0.9841,
        '20261127-0536_nvidia-h100-80gb-hbm3': 0.9834,
    }),
    'GEMM 4096, fast vs FP32 accum. (kernels)': ('kernel', {
        '20261127-0504_nvidia-h100-80gb-hbm3': 1.0562,
        '20261127-0536_nvidia-h100-80gb-hbm3': 1.0582,
    }),
    'GEMM 1024, FP8 vs BF16 (kernels)': ('kernel', {
        '20261127-0504_nvidia-h100-80gb-hbm3': 1.264,
        '20261127-0536_nvidia-h100-80gb-hbm3': 1.2992,
    }),
}


@dataclass(frozen=True)
class Floor:
    """The floor of one regime: ``relative`` (0.03 = 3%) over ``sessions`` GPU sessions."""

    regime: str
    relative: float
    sessions: int
    comparisons: int
    source: str = SOURCE

    def __post_init__(self):
        checks.choice("regime", self.regime, REGIMES)
        if self.relative != math.inf:  # inf: no floor measured, so no verdict passes it
            checks.number("relative", self.relative, non_negative=True)

    def __str__(self) -> str:
        return f"{self.relative:.1%} ({self.regime}, {self.sessions} GPU sessions)"


def largest_move(estimates) -> float:
    """The largest relative move between two of a comparison's estimates."""
    logs = [math.log(v) for v in estimates]
    return math.exp(max(logs) - min(logs)) - 1.0


def floors_from(panel) -> dict[str, Floor]:
    """Each regime's :class:`Floor` from a panel shaped like :data:`PANEL`: the largest move of
    any of its comparisons measured in two sessions or more, once one of them has three (a
    regime measured in fewer than three sessions is absent)."""
    found: dict[str, Floor] = {}
    for regime in REGIMES:
        rows = [sessions for kind, sessions in panel.values() if kind == regime]
        rows = [s for s in rows if len(s) >= 2]
        if not any(len(s) >= 3 for s in rows):
            continue
        relative = math.ceil(max(largest_move(s.values()) for s in rows) * 200 - 1e-9) / 200
        sessions = len(set().union(*rows))
        found[regime] = Floor(regime, relative, sessions, len(rows))
    return found


FLOORS = floors_from(PANEL)


def floor_for(regime: str) -> Floor:
    """The floor of ``regime`` (``"device"``, ``"host"`` or ``"kernel"``); a regime the panel
    has not measured falls back to the largest floor measured, and with no panel at all (a
    checkout whose panel is still to be run) to an infinite one: no verdict without a floor."""
    checks.choice("regime", regime, REGIMES)
    if regime in FLOORS:
        return FLOORS[regime]
    if FLOORS:
        widest = max(FLOORS.values(), key=lambda f: f.relative)
        return Floor(regime, widest.relative, widest.sessions, widest.comparisons)
    return Floor(regime, math.inf, 0, 0, "no panel measured yet")
