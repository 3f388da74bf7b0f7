"""Does it fit? The GPUs with room for an estimate, and the largest micro-batch that fits one."""

from __future__ import annotations

from fp8lab import checks
from fp8lab.config import TransformerConfig, require_config
from fp8lab.memory.constants import CUDA_CONTEXT
from fp8lab.memory.estimator import MemoryEstimate, estimate
from fp8lab.memory.spec import require_seq

__all__ = ["fitting_gpus", "largest_micro_batch"]


def fitting_gpus(est: MemoryEstimate, headroom: float = 0.9) -> list[tuple[str, float, bool]]:
    """``(GPU, memory in GB, fits)`` for every GPU of :data:`fp8lab.datasheet.DATASHEET`: does the
    predicted peak plus the CUDA context fit in ``headroom`` of its memory?"""
    from fp8lab.datasheet import DATASHEET

    if not isinstance(est, MemoryEstimate):
        raise TypeError(f"est must be a memory.MemoryEstimate, not {type(est).__name__}")
    headroom = checks.number("headroom", headroom, positive=True, maximum=1.0)
    need = est.peak_bytes + CUDA_CONTEXT
    return [
        (spec.name, spec.memory_gb, need <= headroom * spec.memory_bytes)
        for spec in sorted(DATASHEET, key=lambda s: s.memory_gb)
    ]


def largest_micro_batch(
    cfg: TransformerConfig,
    seq: int,
    gpu: str = "H200",
    *,
    memory_bytes: float | None = None,
    headroom: float = 0.9,
    context_bytes: float = CUDA_CONTEXT,
    max_batch: int = 4096,
    **estimate_kwargs,
) -> int:
    """The largest micro-batch whose predicted peak fits ``headroom`` of the GPU's memory, less
    ``context_bytes`` (0 if none fits). ``memory_bytes`` overrides the datasheet's memory."""
    require_config(cfg)
    require_seq(cfg, seq)
    checks.integer("max_batch", max_batch)
    if memory_bytes is None:
        from fp8lab.datasheet import gpu_spec

        memory_bytes = gpu_spec(gpu).memory_bytes
    memory_bytes = checks.number("memory_bytes", memory_bytes, positive=True)
    headroom = checks.number("headroom", headroom, positive=True, maximum=1.0)
    context_bytes = checks.number("context_bytes", context_bytes, non_negative=True)
    budget = memory_bytes * headroom - context_bytes

    def fits(b: int) -> bool:
        return estimate(cfg, b, seq, **estimate_kwargs).peak_bytes <= budget

    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= max_batch and fits(high):
        low, high = high, high * 2
    high = min(high, max_batch + 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
