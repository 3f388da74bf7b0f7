"""Step times of a layout on more GPUs, anchored at a measured step (arithmetic, no torch).

A projection that starts from the one-GPU step and adds modelled communication predicts what
was never seen: at two GPUs it can miss the measured step by the contention of compute and
communication, the host's launch costs and everything else the model leaves out. These
projections start from the step *measured* at a small ``n`` (two GPUs) and add only the
*growth* of communication from there, so that whatever the measurement holds is carried along
and the model is asked for nothing but the difference.

* :func:`ring_all_reduce_s` -- a ring all-reduce over ``n`` ranks: ``2(n-1)`` latency steps
  (half of a two-rank all-reduce's fitted α each) and ``2(n-1)/n`` of the message on the wire
  per rank (Patarasuk and Yuan 2009).
* :func:`dp_step_ms` -- data parallelism with gradient buckets: the last bucket is produced at
  the end of the backward and is exposed at every ``n``; the other buckets hide under the
  backward window, and only what outgrows it is added.
* :func:`scaled_step_ms` -- a layout whose communication sits on the critical path (FSDP's
  gathers, tensor parallelism's per-layer collectives): the measured overhead over one GPU,
  scaled by the ratio of the modelled traffic times at ``n`` and at the anchor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fp8lab import checks

MAX_BUCKETS = 100_000

__all__ = ["Link", "buckets", "dp_step_ms", "efficiency", "ring_all_reduce_s", "scaled_step_ms"]


@dataclass(frozen=True)
class Link:
    """What one ring of GPUs delivers: ``alpha_s``, the fitted latency of a two-rank
    all-reduce (two ring steps), and ``bus_gbs``, its bus bandwidth."""

    alpha_s: float
    bus_gbs: float

    def __post_init__(self):
        checks.number("alpha_s", self.alpha_s, non_negative=True)
        checks.number("bus_gbs", self.bus_gbs, positive=True)


def ring_all_reduce_s(nbytes: float, n: int, link: Link) -> float:
    """Seconds of a ring all-reduce of ``nbytes`` over ``n`` ranks (0 on one rank)."""
    nbytes = checks.number("nbytes", nbytes, non_negative=True)
    n = checks.integer("n", n)
    if not isinstance(link, Link):
        raise TypeError(f"link: must be a projection.Link, not {type(link).__name__}")
    if n == 1:
        return 0.0
    steps = 2 * (n - 1)
    return steps * link.alpha_s / 2 + 2 * (n - 1) / n * nbytes / (link.bus_gbs * 1e9)


def buckets(grad_bytes: float, bucket_bytes: float) -> list[float]:
    """DDP's buckets in the order they are all-reduced: full buckets first, the remainder last
    (the first layers' gradients, produced at the very end of the backward)."""
    grad_bytes = checks.number("grad_bytes", grad_bytes, positive=True)
    bucket_bytes = checks.number("bucket_bytes", bucket_bytes, positive=True)
    full = math.ceil(grad_bytes / bucket_bytes) - 1
    if full >= MAX_BUCKETS:
        raise ValueError(
            f"bucket_bytes={bucket_bytes!r}: {full + 1:.3g} buckets of {grad_bytes!r} bytes; "
            f"at most {MAX_BUCKETS} (DDP's buckets are megabytes)"
        )
    return [bucket_bytes] * full + [grad_bytes - full * bucket_bytes]


def _exposed_s(n: int, grad_bytes: float, bucket_bytes: float, window_s: float, link) -> float:
    sizes = buckets(grad_bytes, bucket_bytes)
    last = ring_all_reduce_s(sizes[-1], n, link)
    rest = sum(ring_all_reduce_s(size, n, link) for size in sizes[:-1])
    return last + max(0.0, rest - window_s)


def dp_step_ms(
    n: int,
    *,
    anchor_n: int,
    anchor_ms: float,
    window_ms: float,
    grad_bytes: float,
    bucket_bytes: float,
    link: Link,
) -> float:
    """Data parallelism's step on ``n`` GPUs (weak scaling): the step measured at ``anchor_n``
    plus the growth of the exposed all-reduce time (the last bucket, and what the other
    buckets need beyond the backward window ``window_ms``) from ``anchor_n`` to ``n``."""
    n = checks.integer("n", n)
    anchor_n = checks.integer("anchor_n", anchor_n, minimum=2)
    anchor_ms = checks.number("anchor_ms", anchor_ms, positive=True)
    window_s = checks.number("window_ms", window_ms, non_negative=True) * 1e-3
    growth = _exposed_s(n, grad_bytes, bucket_bytes, window_s, link) - _exposed_s(
        anchor_n, grad_bytes, bucket_bytes, window_s, link
    )
    return anchor_ms + 1e3 * growth


def scaled_step_ms(
    one_ms: float, anchor_ms: float, traffic_s: float, anchor_traffic_s: float
) -> float:
    """A step whose communication is exposed in proportion to its traffic: the overhead
    measured at the anchor (``anchor_ms - one_ms``) times ``traffic_s / anchor_traffic_s``,
    on top of the one-GPU step ``one_ms``."""
    one_ms = checks.number("one_ms", one_ms, positive=True)
    anchor_ms = checks.number("anchor_ms", anchor_ms, positive=True)
    traffic_s = checks.number("traffic_s", traffic_s, non_negative=True)
    anchor_traffic_s = checks.number("anchor_traffic_s", anchor_traffic_s, positive=True)
    return one_ms + (anchor_ms - one_ms) * traffic_s / anchor_traffic_s


def efficiency(one_ms: float, step_ms: float) -> float:
    """Weak-scaling efficiency: the one-GPU step over the ``n``-GPU step (1 is perfect)."""
    one_ms = checks.number("one_ms", one_ms, positive=True)
    return one_ms / checks.number("step_ms", step_ms, positive=True)
