"""Floating-point formats of FP8 training, computed from the dtypes themselves.

Every figure here comes from ``torch``'s own dtypes: the representable values are found
by reinterpreting every bit pattern (all 256 of an 8-bit format, all 65536 of a 16-bit
one), rounding uses torch's casts (round to nearest even), and the field widths follow
from ``torch.finfo``. Nothing is typed in by hand, so the tables cannot drift from what
the hardware formats really hold.

Formats: FP32, FP16, BF16, FP8 E4M3 (``float8_e4m3fn``: no infinities, one NaN pattern per
sign, max 448) and FP8 E5M2 (``float8_e5m2``: IEEE-like, infinities, max 57344)
(Micikevicius et al. 2022). Casting saturates here as Transformer Engine's casts do (see
:func:`round_to`): a plain ``tensor.to(torch.float8_e5m2)`` overflows to infinity, and what a
plain cast to E4M3 does beyond 448 has differed across torch versions and devices (NaN or
the max), so fp8lab clamps explicitly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

DTYPES = {
    "FP32": torch.float32,
    "FP16": torch.float16,
    "BF16": torch.bfloat16,
    "E4M3": torch.float8_e4m3fn,
    "E5M2": torch.float8_e5m2,
}
_INT_VIEW = {8: torch.uint8, 16: torch.int16, 32: torch.int32}


def dtype_of(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        if name not in DTYPES.values():
            raise TypeError(f"dtype {name} is not one of the formats here: {', '.join(DTYPES)}")
        return name
    try:
        return DTYPES[name.upper()]
    except (KeyError, AttributeError):
        raise ValueError(f"format={name!r}: must be one of {', '.join(DTYPES)}") from None


def name_of(dtype: torch.dtype) -> str:
    return next(name for name, d in DTYPES.items() if d == dtype)


@dataclass(frozen=True)
class FormatInfo:
    """Field widths and limits of one format."""

    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int
    max: float
    smallest_normal: float
    smallest_subnormal: float
    epsilon: float
    finite_values: int
    has_infinity: bool
    nan_patterns: int

    @property
    def dynamic_range_binades(self) -> float:
        """log2(max / smallest subnormal): how many powers of two the format spans."""
        return math.log2(self.max / self.smallest_subnormal)


@lru_cache(maxsize=None)
def all_values(fmt: str | torch.dtype) -> torch.Tensor:
    """Every bit pattern of an 8- or 16-bit format, decoded to float64 (NaN where it is NaN)."""
    dtype = dtype_of(fmt)
    bits = torch.finfo(dtype).bits
    if bits > 16:
        raise ValueError(f"{name_of(dtype)} has 2**{bits} patterns; enumerate 8- and 16-bit formats only")
    patterns = torch.arange(2**bits, dtype=torch.int32)
    if bits == 16:
        patterns = torch.where(patterns >= 2**15, patterns - 2**16, patterns)
    return patterns.to(_INT_VIEW[bits]).view(dtype).double()


def info(fmt: str | torch.dtype) -> FormatInfo:
    """The format's fields and limits, from ``torch.finfo`` and, for 8/16-bit formats, every bit pattern."""
    dtype = dtype_of(fmt)
    fi = torch.finfo(dtype)
    mantissa = round(-math.log2(fi.eps))
    exponent = fi.bits - 1 - mantissa
    if fi.bits <= 16:
        values = all_values(dtype)
        finite = values[torch.isfinite(values)]
        finite_count = int(torch.unique(finite).numel())
        has_inf = bool(torch.isinf(values).any())
        nans = int(torch.isnan(values).sum())
    else:  # IEEE binary32: an all-ones exponent holds infinities and NaNs; +0 and -0 are one value
        finite_count = 2**fi.bits - 2 * 2**mantissa - 1
        has_inf, nans = True, 2 * (2**mantissa - 1)
    return FormatInfo(name_of(dtype), fi.bits, exponent, mantissa, float(fi.max), float(fi.tiny),
                      float(fi.tiny) * 2.0**-mantissa, float(fi.eps), finite_count, has_inf, nans)


def table():
    """All formats side by side, as a pandas DataFrame."""
    import pandas as pd

    return pd.DataFrame([vars(info(name)) for name in DTYPES]).set_index("name")


def round_to(x: torch.Tensor | float, fmt: str | torch.dtype, saturate: bool = True) -> torch.Tensor:
    """Round to the nearest representable value (ties to even), returned in float64.

    ``saturate`` clamps to the largest finite value first, as FP8 training casts do;
    without it, the result is whatever torch's cast does (E5M2 overflows to infinity).
    """
    dtype = dtype_of(fmt)
    x = torch.as_tensor(x, dtype=torch.float64)
    if saturate:
        limit = torch.finfo(dtype).max
        x = x.clamp(-limit, limit)
    return x.to(dtype).double()


@dataclass(frozen=True)
class Encoding:
    """A value as one format stores it."""

    format: str
    value: float
    stored: float
    sign: str
    exponent: str
    mantissa: str

    @property
    def bits(self) -> str:
        return f"{self.sign} {self.exponent} {self.mantissa}"

    @property
    def relative_error(self) -> float:
        return abs(self.stored - self.value) / abs(self.value) if self.value else 0.0


def encode(value: float, fmt: str | torch.dtype) -> Encoding:
    """The bits and the stored value of ``value`` in ``fmt`` (round to nearest even, saturating)."""
    dtype = dtype_of(fmt)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"value must be a number, got {type(value).__name__}")
    meta = info(dtype)
    stored = torch.tensor(value, dtype=torch.float64).clamp(-meta.max, meta.max).to(dtype)
    raw = stored.view(_INT_VIEW[meta.bits]).item() & (2**meta.bits - 1)
    text = format(raw, f"0{meta.bits}b")
    return Encoding(meta.name, float(value), float(stored.double()), text[0], text[1:1 + meta.exponent_bits],
                    text[1 + meta.exponent_bits:])


def positive_values(fmt: str | torch.dtype) -> torch.Tensor:
    """The distinct positive finite values of an 8- or 16-bit format, sorted."""
    values = all_values(fmt)
    return torch.unique(values[torch.isfinite(values) & (values > 0)])


def relative_rounding_error(x: torch.Tensor, fmt: str | torch.dtype) -> torch.Tensor:
    """``|round(x) - x| / |x|`` for positive magnitudes ``x`` (no saturation: 1 above the max)."""
    x = torch.as_tensor(x, dtype=torch.float64)
    rounded = round_to(x, fmt, saturate=True)
    error = (rounded - x).abs() / x.abs()
    return torch.where(x.abs() > info(fmt).max, torch.ones_like(error), error)


@dataclass(frozen=True)
class RangeFit:
    """How a tensor's magnitudes fit a format, with a given scale."""

    format: str
    scale: float
    underflow: float   # share of nonzero values that become zero
    saturated: float   # share of values beyond the format's max (clamped)
    subnormal: float   # share of nonzero values that land among the subnormals
    relative_error: float  # ||q(x) - x|| / ||x||


def range_fit(x: torch.Tensor, fmt: str | torch.dtype, scale: float = 1.0) -> RangeFit:
    """Quantize ``x * scale`` to ``fmt`` (saturating) and say what was lost."""
    if not (isinstance(scale, (int, float)) and scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale={scale!r}: must be a positive finite number")
    meta = info(fmt)
    scaled = x.detach().double().flatten() * scale
    nonzero = scaled != 0
    quantized = round_to(scaled, fmt)
    n_nonzero = max(int(nonzero.sum()), 1)
    error = ((quantized / scale - scaled / scale).norm() / (scaled / scale).norm().clamp_min(1e-300)).item()
    return RangeFit(meta.name, float(scale),
                    underflow=float(((quantized == 0) & nonzero).sum()) / n_nonzero,
                    saturated=float((scaled.abs() > meta.max).sum()) / max(scaled.numel(), 1),
                    subnormal=float(((scaled.abs() < meta.smallest_normal) & (quantized != 0)).sum()) / n_nonzero,
                    relative_error=error)


def amax_scale(x: torch.Tensor, fmt: str | torch.dtype, margin: int = 0) -> float:
    """The per-tensor scale TE's recipes aim at: ``(fmt_max / amax) / 2**margin``."""
    amax = x.detach().abs().max().item()
    if amax == 0 or not math.isfinite(amax):
        return 1.0
    return info(fmt).max / amax / 2**margin
