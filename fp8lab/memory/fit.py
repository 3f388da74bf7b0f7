"""Does it fit? One policy (:func:`fits`), used for the GPUs with room for an estimate, for
the verdict on one GPU (:func:`fit_verdict`) and for the largest micro-batch that fits one.

The policy: the predicted peak (``max_memory_allocated``) plus the CUDA context must fit in
``headroom`` (by default :data:`HEADROOM`, 90%) of the GPU's memory. The 10% left is for the
allocator's reserve beyond what is allocated, which the measured steps show varies (see
chapter 07's reserved-against-allocated numbers). A step whose GEMMs run in FP8 also needs a
GPU that runs them (:data:`FP8_MIN_CAPABILITY`): an A100 has the memory but no FP8 tensor
cores, and TE refuses FP8 there, so no amount of memory makes it fit.
"""

from __future__ import annotations

from fp8lab import checks
from fp8lab.config import TransformerConfig, require_config
from fp8lab.memory.constants import CUDA_CONTEXT, PRECISIONS
from fp8lab.memory.estimator import MemoryEstimate, estimate
from fp8lab.memory.spec import require_seq

__all__ = [
    "FP8_MIN_CAPABILITY",
    "HEADROOM",
    "fit_verdict",
    "fits",
    "fitting_gpus",
    "largest_micro_batch",
]

HEADROOM = 0.9  # share of a GPU's memory the calculator lets a step's peak and context use
# The least compute capability on which TE 2.20 runs each FP8 compute: quantization.py's
# _compute_fp8_support (sm_89; Ada also needs CUDA and cuBLASLt >= 12.1) and
# _compute_fp8_block_scaling_support (sm_90 and CUDA >= 12.9). Software versions not modelled.
FP8_MIN_CAPABILITY = {
    "fp8-delayed": (8, 9),
    "fp8-current": (8, 9),
    "fp8-weights": (8, 9),
    "fp8-block": (9, 0),
}
FITS, TOO_SMALL = "fits", "too small"


def _capability(value) -> tuple[int, int] | None:
    if value is None:
        return None
    if not isinstance(value, tuple) or len(value) != 2:
        raise TypeError(
            f"compute_capability={checks.show(value)}: must be None or a (major, minor) tuple"
        )
    major, minor = value
    return (
        checks.integer("compute_capability", major, minimum=0),
        checks.integer("compute_capability", minor, minimum=0),
    )


def _fp8_refusal(compute: str, capability: tuple[int, int] | None) -> str | None:
    """Why a GPU of ``capability`` cannot run ``compute`` (``None``: it can, or unknown)."""
    least = FP8_MIN_CAPABILITY.get(compute)
    if capability is None or least is None or capability >= least:
        return None
    if capability >= FP8_MIN_CAPABILITY["fp8-delayed"]:
        return "no FP8 block scaling on this GPU"
    return "no FP8 on this GPU"


def fits(
    peak_bytes: float,
    memory_bytes: float,
    headroom: float = HEADROOM,
    context_bytes: float = CUDA_CONTEXT,
    *,
    compute: str = "bf16",
    compute_capability: tuple[int, int] | None = None,
) -> bool:
    """The policy: does a step of predicted peak ``peak_bytes`` fit a GPU of ``memory_bytes``,
    its CUDA context (``context_bytes``) included, in ``headroom`` of the memory? And, for an
    FP8 ``compute`` (a key of :data:`FP8_MIN_CAPABILITY`), does a GPU of
    ``compute_capability`` run its GEMMs (``None``: not known, not checked)?"""
    peak_bytes = checks.number("peak_bytes", peak_bytes, non_negative=True)
    memory_bytes = checks.number("memory_bytes", memory_bytes, positive=True)
    headroom = checks.number("headroom", headroom, positive=True, maximum=1.0)
    context_bytes = checks.number("context_bytes", context_bytes, non_negative=True)
    checks.choice("compute", compute, PRECISIONS)
    if _fp8_refusal(compute, _capability(compute_capability)):
        return False
    return peak_bytes + context_bytes <= headroom * memory_bytes


def _biased(est: MemoryEstimate, bias: float) -> float:
    """The predicted peak raised by ``bias``, the estimator's measured under-prediction (a
    share >= 0, e.g. the median error of a held-out matrix, sign flipped)."""
    if not isinstance(est, MemoryEstimate):
        raise TypeError(f"est must be a memory.MemoryEstimate, not {type(est).__name__}")
    return est.peak_bytes * (1 + checks.number("bias", bias, non_negative=True, maximum=1.0))


def fit_verdict(est: MemoryEstimate, gpu, headroom: float = HEADROOM, *, bias: float = 0.0) -> str:
    """:func:`fits` for one GPU (a datasheet name, ``None`` for this CUDA GPU, or a
    :class:`fp8lab.datasheet.GPUSpec`), with the reason when not: ``"fits"``, ``"too small"``,
    ``"no FP8 on this GPU"`` or ``"no FP8 block scaling on this GPU"``. ``bias`` raises the
    predicted peak by that share first (the estimator's measured under-prediction)."""
    from fp8lab.datasheet import GPUSpec, gpu_spec

    peak = _biased(est, bias)
    if not (gpu is None or isinstance(gpu, (str, GPUSpec))):
        raise TypeError(f"gpu={checks.show(gpu)}: must be a GPU name or a datasheet.GPUSpec")
    spec = gpu if isinstance(gpu, GPUSpec) else gpu_spec(gpu)
    room = fits(
        peak,
        spec.memory_bytes,
        headroom,
        compute=est.compute,
        compute_capability=spec.compute_capability,
    )
    if room:
        return FITS
    return _fp8_refusal(est.compute, spec.compute_capability) or TOO_SMALL


def fitting_gpus(
    est: MemoryEstimate, headroom: float = HEADROOM, *, bias: float = 0.0
) -> list[tuple[str, float, bool]]:
    """``(GPU, memory in GB, fits)`` for every GPU of :data:`fp8lab.datasheet.DATASHEET`, by
    :func:`fits`: does the predicted peak plus the CUDA context fit in ``headroom`` of its
    memory, and does the GPU run the estimate's FP8 compute? (:func:`fit_verdict` says why
    not; ``bias`` as there.)"""
    from fp8lab.datasheet import DATASHEET

    _biased(est, bias)
    headroom = checks.number("headroom", headroom, positive=True, maximum=1.0)
    return [
        (spec.name, spec.memory_gb, fit_verdict(est, spec, headroom, bias=bias) == FITS)
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
    memory, ``context_bytes`` included; 0 if none fits, or if ``gpu`` does not run the FP8
    compute asked for). ``memory_bytes`` overrides the datasheet's memory only."""
    from fp8lab.datasheet import gpu_spec

    require_config(cfg)
    require_seq(cfg, seq)
    checks.integer("max_batch", max_batch)
    spec = gpu_spec(gpu)
    if memory_bytes is None:
        memory_bytes = spec.memory_bytes
    memory_bytes = checks.number("memory_bytes", memory_bytes, positive=True)
    headroom = checks.number("headroom", headroom, positive=True, maximum=1.0)
    context_bytes = checks.number("context_bytes", context_bytes, non_negative=True)

    def room(b: int) -> bool:
        est = estimate(cfg, b, seq, **estimate_kwargs)
        return fits(
            est.peak_bytes,
            memory_bytes,
            headroom,
            context_bytes,
            compute=est.compute,
            compute_capability=spec.compute_capability,
        )

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
