"""Recipes, as in ``transformer_engine.common.recipe`` (TE 2.20): the same classes, fields and
defaults.

A recipe says how tensors are scaled before they are cast to FP8 (or FP4):

* :class:`DelayedScaling` -- one FP32 scale per tensor, from the history of past amaxes
  (``amax_history_len`` steps; ``amax_compute_algo`` "max" or "most_recent"):
  ``scale = (fp8_max / amax) / 2**margin``;
* :class:`Float8CurrentScaling` -- one scale per tensor, from the tensor's own amax;
* :class:`Float8BlockScaling` -- one scale per 1x128 block of activations and gradients and
  per 128x128 block of weights (power-of-two scales unless ``use_f32_scales``);
* :class:`MXFP8BlockScaling` -- one E8M0 (power-of-two) scale per 32 consecutive values
  (Blackwell only on GPUs; emulated here);
* :class:`NVFP4BlockScaling` -- E2M1 values, one E4M3 scale per 16 values and one FP32 scale
  per tensor (Blackwell only; here for its numerics, see :mod:`fp8lab.reference.quantization`).

``Format.HYBRID`` uses E4M3 in the forward and E5M2 for gradients; ``Format.E4M3`` uses E4M3
for both. Environment-variable defaults of TE's classes are not read here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple


class _FormatHelper(NamedTuple):
    max_fwd: float
    max_bwd: float


class Format(Enum):
    """FP8 formats: E4M3 (max 448), E5M2 (max 57344), HYBRID (E4M3 forward, E5M2 backward), E2M1
    (FP4)."""

    E2M1 = _FormatHelper(max_fwd=6, max_bwd=6)
    E4M3 = _FormatHelper(max_fwd=448, max_bwd=448)
    E5M2 = _FormatHelper(max_fwd=57344, max_bwd=57344)
    HYBRID = _FormatHelper(max_fwd=448, max_bwd=57344)


@dataclass(frozen=True)
class MMParams:
    """GEMM options, accepted for API parity: the reference always accumulates in FP32, which in TE
    is ``use_split_accumulator=True``; ``False`` is cuBLAS's faster, less precise FP8 accumulation
    on Hopper (TE's default for the forward GEMM)."""

    use_split_accumulator: bool = True


class Recipe:
    """Base class of all recipes."""

    def delayed(self) -> bool:
        return isinstance(self, DelayedScaling)

    def float8_current_scaling(self) -> bool:
        return isinstance(self, Float8CurrentScaling)

    def float8_per_tensor_scaling(self) -> bool:
        return isinstance(self, (DelayedScaling, Float8CurrentScaling))

    def float8_block_scaling(self) -> bool:
        return isinstance(self, Float8BlockScaling)

    def mxfp8(self) -> bool:
        return isinstance(self, MXFP8BlockScaling)

    def nvfp4(self) -> bool:
        return isinstance(self, NVFP4BlockScaling)


def _no_pure_e5m2(fmt: Format) -> None:
    if fmt == Format.E5M2:
        raise AssertionError("Pure E5M2 training is not supported.")


@dataclass
class DelayedScaling(Recipe):
    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: str | Callable = "max"
    scaling_factor_compute_algo: Callable | None = None
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self):
        _no_pure_e5m2(self.fp8_format)
        if self.amax_history_len < 1:
            raise ValueError(f"amax_history_len={self.amax_history_len}: must be >= 1")
        if not callable(self.amax_compute_algo) and self.amax_compute_algo not in (
            "max",
            "most_recent",
        ):
            raise ValueError(
                f"amax_compute_algo={self.amax_compute_algo!r}: must be 'max', 'most_recent' "
                "or a callable"
            )


@dataclass
class Float8CurrentScaling(Recipe):
    use_power_2_scales: bool = False
    fp8_format: Format = Format.HYBRID
    fp8_gemm_fprop: MMParams = field(default_factory=lambda: MMParams(use_split_accumulator=False))
    fp8_gemm_dgrad: MMParams = field(default_factory=lambda: MMParams(use_split_accumulator=True))
    fp8_gemm_wgrad: MMParams = field(default_factory=lambda: MMParams(use_split_accumulator=True))
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self):
        _no_pure_e5m2(self.fp8_format)


@dataclass
class Float8BlockScaling(Recipe):
    use_f32_scales: bool = False
    fp8_format: Format = Format.E4M3
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1
    fp8_gemm_fprop: MMParams = field(default_factory=MMParams)
    fp8_gemm_dgrad: MMParams = field(default_factory=MMParams)
    fp8_gemm_wgrad: MMParams = field(default_factory=MMParams)
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self):
        _no_pure_e5m2(self.fp8_format)
        for name in ("x_block_scaling_dim", "w_block_scaling_dim", "grad_block_scaling_dim"):
            if getattr(self, name) not in (1, 2):
                raise ValueError(f"{name}={getattr(self, name)}: must be 1 or 2")


@dataclass
class MXFP8BlockScaling(Recipe):
    margin: int = 0
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self):
        _no_pure_e5m2(self.fp8_format)


@dataclass
class NVFP4BlockScaling(Recipe):
    disable_rht: bool = False
    disable_stochastic_rounding: bool = False
    disable_2d_quantization: bool = False
    fp4_format: Format = Format.E2M1
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self):
        if self.fp4_format != Format.E2M1:
            raise AssertionError("Only E2M1 is supported for NVFP4 scaling")
        if self.fp8_format != Format.E4M3:
            raise AssertionError("Only E4M3 is supported for NVFP4 scaling")
