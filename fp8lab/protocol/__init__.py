"""The book's one measurement protocol: every verdict of every chapter goes through it.

**Timing** (:func:`rounds`). The alternatives are timed in rounds, after warm-up, with the
book's one clock (:func:`fp8lab.speedometer.time_calls`: CUDA events on a GPU); the order is
reversed (or shuffled) from one round to the next, so that a drift of clocks or temperature
weighs on every alternative alike. A comparison of two alternatives (:meth:`Rounds.compare`)
is a list of paired per-round ratios, with an interval. The GPU's kernel time is measured beside
the wall time, so that a step the host sets is named as such.

**Verdict** (:class:`Comparison`). "faster" or "slower" only when the interval excludes 1 *and*
the effect exceeds the session-to-session floor (:mod:`fp8lab.protocol.floor`), which the book
measured by repeating a panel of comparisons in separate GPU sessions: the rounds of one session
see only that session's noise. Otherwise "tied" (the whole interval inside the floor) or "not
resolved".

**Accuracy** (:func:`paired`). Paired over at least five seeds (same initial weights and
batches on both sides), with a Student-t interval of the differences against a margin declared
before the runs, a power statement (the smallest difference the design detects) and, where the
check could otherwise not fail, a negative control that it must flag.

Every verdict carries :meth:`~Comparison.record`, which the glue of the prose keeps
(:func:`fp8lab.book.glue_verdict`), so that a re-run in another GPU session can list what
flipped.
"""

from fp8lab.protocol.floor import FLOORS, HOST_BOUND_IDLE, Floor, floor_for, floor_of
from fp8lab.protocol.intervals import (
    detectable_difference,
    mean_interval,
    ratio_interval,
    unpaired_ratio_interval,
)
from fp8lab.protocol.rounds import Rounds, rounds
from fp8lab.protocol.verdicts import (
    FASTER,
    NOT_RESOLVED,
    SLOWER,
    TIED,
    Comparison,
    Paired,
    judged,
    paired,
    paired_summary,
    speed_verdict,
)

__all__ = [
    "FASTER",
    "FLOORS",
    "HOST_BOUND_IDLE",
    "NOT_RESOLVED",
    "SLOWER",
    "TIED",
    "Comparison",
    "Floor",
    "Paired",
    "Rounds",
    "detectable_difference",
    "floor_for",
    "floor_of",
    "judged",
    "mean_interval",
    "paired",
    "paired_summary",
    "ratio_interval",
    "rounds",
    "speed_verdict",
    "unpaired_ratio_interval",
]
