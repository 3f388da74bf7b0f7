"""Does it fit? One policy (:func:`fits`), used for the GPUs with room for an estimate and for
the largest micro-batch that fits one.

The policy: the predicted peak (``max_memory_allocated``) plus the CUDA context must fit in
``headroom`` (by default :data:`HEADROOM`, 90%) of the GPU's memory. The 10% left is for the
allocator's reserve beyond what is allocated, which the measured steps show varies (see
chapter 07's reserved-against-allocated numbers).
"""

from __future__ import annotations

from fp8lab import checks
from fp8lab.config import TransformerConfig, require_config
from fp8lab.memory.constants import CUDA_CONTEXT
from fp8lab.memory.estimator import MemoryEstimate, estimate
from fp8lab.memory.spec import require_seq

__all__ = ["HEADROOM", "fits", "fitting_gpus", "largest_micro_batch"]

HEADROOM = 0.9  # share of a GPU's memory the calculator lets a step's peak and context use


def fits(
    peak_bytes: float,
    memory_bytes: float,
    headroom: float = HEADROOM,
    context_bytes: float = CUDA_CONTEXT,
) -> bool:
    """The policy: does a step of predicted peak ``peak_bytes`` fit a GPU of ``memory_bytes``,
    its CUDA context (``context_bytes``) included, in ``headroom`` of the memory?"""
    peak_bytes = checks.number("peak_bytes", peak_bytes, non_negative=True)
    memory_bytes = checks.number("memory_bytes", memory_bytes, positive=True)
    headroom = checks.number("headroom", headroom, positive=True, maximum=1.0)
    context_bytes = checks.number("context_bytes", context_bytes, non_negative=True)
    return peak_bytes + context_bytes <= headroom * memory_bytes


def fitting_gpus(
    est: MemoryEstimate, headroom: float = HEADROOM
) -> list[tuple[str, float, bool]]:
    """``(GPU, memory in GB, fits)`` for every GPU of :data:`fp8lab.datasheet.DATASHEET`, by
    :func:`fits`: does the predicted peak plus the CUDA context fit in ``headroom`` of its
    memory?"""
    from fp8lab.datasheet import DATASHEET

    if not isinstance(est, MemoryEstimate):
        raise TypeError(f"est must be a memory.MemoryEstimate, not {type(est).__name__}")
    headroom = checks.number("headroom", headroom, positive=True, maximum=1.0)
    return [
        (spec.name, spec.memory_gb, fits(est.peak_bytes, spec.memory_bytes, headroom))
        for spec in sorted(DATASHEET, key=lambda s: s.memory_gb)
    ]


def largest_micro_batch(
    cfg: TransformerConfig,
    seq: int,
    gpu: str = "H200",
    *,
    memory_bytes: float | None = None,
    headroom: float = HEADROOM,
    context_bytes: float = CUDA_CONTEXT,
    max_batch: int = 4096,
    **estimate_kwargs,
) -> int:
    """The largest micro-batch whose predicted peak :func:`fits` the GPU (``headroom`` of its
    memory, ``context_bytes`` included; 0 if none fits). ``memory_bytes`` overrides the
    datasheet's memory."""
    require_config(cfg)
    require_seq(cfg, seq)
    checks.integer("max_batch", max_batch)
    if memory_bytes is None:
        from fp8lab.datasheet import gpu_spec

        memory_bytes = gpu_spec(gpu).memory_bytes
    memory_bytes = checks.number("memory_bytes", memory_bytes, positive=True)
    headroom = checks.number("headroom", headroom, positive=True, maximum=1.0)
    context_bytes = checks.number("context_bytes", context_bytes, non_negative=True)

    def room(b: int) -> bool:
        peak = estimate(cfg, b, seq, **estimate_kwargs).peak_bytes
        return fits(peak, memory_bytes, headroom, context_bytes)

    if not room(1):
        return 0
    low, high = 1, 2
    while high <= max_batch and room(high):
        low, high = high, high * 2
    high = min(high, max_batch + 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if room(middle) else (low, middle)
    return low
