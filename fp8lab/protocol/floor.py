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

A chapter's re-run in another session (``python -m tools.lane verdicts``) is a further test of
the floor. A comparison whose verdict *flipped* there moved by more than its regime's floor, so
from then on it is judged against its own readings (:data:`FLIPPED`, :func:`floor_of`): its
floor becomes the widest departure from 1 that an interval of either session reached. Both
readings then say "tied", with that floor shown, and nothing is re-rolled until it agrees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fp8lab import checks

__all__ = [
    "FLIPPED", "FLOORS", "HOST_BOUND_IDLE", "PANEL", "REGIMES", "Floor", "floor_for",
    "floor_of", "floors_from", "largest_move", "round_up",
]

REGIMES = ("device", "host", "kernel")
# The GPU idle share of a step above which the host, not the GPU, sets its time.
HOST_BOUND_IDLE = 0.25
SOURCE = "tests/gpu_results/session_floor/ (tools/session_floor.py)"
OWN_SOURCE = "its own readings in two GPU sessions (tests/gpu_results/verdicts/)"

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
    own: bool = False  # a comparison's own floor (its verdict flipped), not its regime's

    def __post_init__(self):
        checks.choice("regime", self.regime, REGIMES)
        if self.relative != math.inf:  # inf: no floor measured, so no verdict passes it
            checks.number("relative", self.relative, non_negative=True)

    def __str__(self) -> str:
        whose = "its own" if self.own else self.regime
        return f"{self.relative:.1%} ({whose}, {self.sessions} GPU sessions)"

    @property
    def label(self) -> str:
        """How a verdict's phrase names this floor."""
        return "own session floor" if self.own else "session floor"


def round_up(relative: float) -> float:
    """A relative move rounded up to the next half percent (how every floor is stated)."""
    return math.ceil(relative * 200 - 1e-9) / 200


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
        relative = round_up(max(largest_move(s.values()) for s in rows))
        sessions = len(set().union(*rows))
        found[regime] = Floor(regime, relative, sessions, len(rows))
    return found


FLOORS = floors_from(PANEL)

# glued comparison -> its own floor, because its verdict flipped between two GPU sessions;
# written by `python -m tools.verdicts floors --write` from the committed re-run reports.
FLIPPED: dict[str, float] = {
    'nn_vs_tn_smallest': 0.055,
}


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


def floor_of(name: str, regime: str) -> Floor:
    """The floor the comparison glued as ``name`` is judged against: its regime's
    (:func:`floor_for`), or, once its verdict has flipped between two GPU sessions, the larger of
    that and its own (:data:`FLIPPED`)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name={name!r}: must be a non-empty string")
    shared = floor_for(regime)
    own = FLIPPED.get(name)
    if own is None or own <= shared.relative:
        return shared
    return Floor(regime, own, 2, 1, OWN_SOURCE, own=True)
