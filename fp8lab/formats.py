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
from functools import cache

import torch

from fp8lab import checks

__all__ = [
    "DTYPES",
    "Encoding",
    "FormatInfo",
    "RangeFit",
    "all_values",
    "amax_scale",
    "divide",
    "dtype_of",
    "encode",
    "fp8_max",
    "info",
    "name_of",
    "positive_values",
    "range_fit",
    "relative_error",
    "relative_rounding_error",
    "round_to",
    "scale_from_amax",
    "limits_table",
]

FP32_MAX = torch.finfo(torch.float32).max

DTYPES = {
    "FP32": torch.float32,
    "FP16": torch.float16,
    "BF16": torch.bfloat16,
    "E4M3": torch.float8_e4m3fn,
    "E5M2": torch.float8_e5m2,
}
_INT_VIEW = {8: torch.uint8, 16: torch.int16, 32: torch.int32}


def dtype_of(name: str | torch.dtype) -> torch.dtype:
    """The torch dtype of a format name (``"E4M3"``) or of one of the formats' dtypes."""
    if isinstance(name, torch.dtype):
        if name not in DTYPES.values():
            raise TypeError(f"dtype {name} is not one of the formats here: {', '.join(DTYPES)}")
        return name
    if not isinstance(name, str):
        raise TypeError(
            f"format={name!r}: must be a format name ({', '.join(DTYPES)}) or a torch dtype"
        )
    try:
        return DTYPES[name.upper()]
    except KeyError:
        raise ValueError(f"format={name!r}: must be one of {', '.join(DTYPES)}") from None


def name_of(dtype: torch.dtype) -> str:
    """The format name of a dtype (``torch.float8_e4m3fn`` -> ``"E4M3"``)."""
    dtype = dtype_of(dtype)
    return next(name for name, d in DTYPES.items() if d == dtype)


def fp8_max(fmt: str | torch.dtype) -> float:
    """The largest finite value of a format: 448 for E4M3, 57344 for E5M2 (from ``torch.finfo``)."""
    return float(torch.finfo(dtype_of(fmt)).max)


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


def all_values(fmt: str | torch.dtype) -> torch.Tensor:
    """Every bit pattern of an 8- or 16-bit format, decoded to float64 (NaN where it is NaN)."""
    return _all_values(dtype_of(fmt))


@cache
def _all_values(dtype: torch.dtype) -> torch.Tensor:
    bits = torch.finfo(dtype).bits
    if bits > 16:
        raise ValueError(
            f"format={name_of(dtype)!r} has 2**{bits} patterns; "
            "enumerate 8- and 16-bit formats only"
        )
    patterns = torch.arange(2**bits, dtype=torch.int32)
    if bits == 16:
        patterns = torch.where(patterns >= 2**15, patterns - 2**16, patterns)
    return patterns.to(_INT_VIEW[bits]).view(dtype).double()


def info(fmt: str | torch.dtype) -> FormatInfo:
    """The format's fields and limits, from ``torch.finfo`` and, for 8/16-bit formats, every bit
    pattern."""
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
    return FormatInfo(
        name_of(dtype),
        fi.bits,
        exponent,
        mantissa,
        float(fi.max),
        float(fi.tiny),
        float(fi.tiny) * 2.0**-mantissa,
        float(fi.eps),
        finite_count,
        has_inf,
        nans,
    )


def limits_table():
    """All formats side by side, as a pandas DataFrame."""
    import pandas as pd

    return pd.DataFrame([vars(info(name)) for name in DTYPES]).set_index("name")


def round_to(
    x: torch.Tensor | float, fmt: str | torch.dtype, saturate: bool = True
) -> torch.Tensor:
    """Round to the nearest representable value (ties to even), returned in float64.

    ``saturate`` clamps to the largest finite value first, as FP8 training casts do;
    without it, the result is whatever torch's cast does (E5M2 overflows to infinity).
    """
    dtype = dtype_of(fmt)
    checks.flag("saturate", saturate)
    if not isinstance(x, torch.Tensor):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise TypeError(f"x={x!r}: must be a number or a tensor, not {type(x).__name__}")
        if math.isnan(x):
            raise ValueError(
                "x=nan: NaN has no rounding (in a tensor, NaN stays NaN as in TE's casts)"
            )
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
    if not math.isfinite(value):
        raise ValueError(
            f"value={value}: must be finite (the bit pattern of NaN and infinity differs by format)"
        )
    meta = info(dtype)
    stored = torch.tensor(value, dtype=torch.float64).clamp(-meta.max, meta.max).to(dtype)
    raw = stored.view(_INT_VIEW[meta.bits]).item() & (2**meta.bits - 1)
    text = format(raw, f"0{meta.bits}b")
    return Encoding(
        meta.name,
        float(value),
        float(stored.double()),
        text[0],
        text[1 : 1 + meta.exponent_bits],
        text[1 + meta.exponent_bits :],
    )


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
    underflow: float  # share of nonzero values that become zero
    saturated: float  # share of values beyond the format's max (clamped)
    subnormal: float  # share of nonzero values that land among the subnormals
    relative_error: float  # ||q(x) - x|| / ||x||


def range_fit(x: torch.Tensor, fmt: str | torch.dtype, scale: float = 1.0) -> RangeFit:
    """Quantize ``x * scale`` to ``fmt`` (saturating) and say what was lost."""
    checks.tensor("x", x, floating=True)
    scale = checks.number("scale", scale, positive=True)
    if x.numel() == 0 or not torch.isfinite(x).all():
        raise ValueError("x: must be a non-empty tensor of finite values")
    meta = info(fmt)
    scaled = x.detach().double().flatten() * scale
    nonzero = scaled != 0
    quantized = round_to(scaled, fmt)
    n_nonzero = max(int(nonzero.sum()), 1)
    error = (
        (quantized / scale - scaled / scale).norm() / (scaled / scale).norm().clamp_min(1e-300)
    ).item()
    return RangeFit(
        meta.name,
        float(scale),
        underflow=float(((quantized == 0) & nonzero).sum()) / n_nonzero,
        saturated=float((scaled.abs() > meta.max).sum()) / max(scaled.numel(), 1),
        subnormal=float(((scaled.abs() < meta.smallest_normal) & (quantized != 0)).sum())
        / n_nonzero,
        relative_error=error,
    )


def divide(numerator: float, denominator: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator`` correctly rounded in FP32, as TE's scale kernels compute it.

    PyTorch evaluates ``float / tensor`` as ``float * (1 / tensor)``: two roundings, which can
    be one FP32 ulp off. One ulp matters: a BF16 value times a scale of exactly ``max / amax``
    can land on a tie between two FP8 values, and the ulp decides which way it rounds.
    """
    return torch.div(
        torch.full_like(denominator, numerator, dtype=torch.float32), denominator.float()
    )


def scale_from_amax(
    amax: torch.Tensor,
    max_value: float,
    power_of_2: bool = False,
    epsilon: float = 0.0,
    margin: int = 0,
) -> torch.Tensor:
    """TE's per-tensor scale ``(max_value / amax) / 2**margin`` in FP32, rounded once.

    A zero or non-finite amax gives 1 (TE's ``compute_scale_from_amax``), an infinite scale
    FP32's max; ``power_of_2`` keeps only the sign and exponent bits, as TE's power-of-two
    scales do. The one home of this rule: the CPU reference and :func:`amax_scale` call it.
    """
    checks.tensor("amax", amax)
    max_value = checks.number("max_value", max_value, positive=True)
    checks.flag("power_of_2", power_of_2)
    epsilon = checks.number("epsilon", epsilon, non_negative=True)
    margin = checks.integer("margin", margin, minimum=0)
    amax = torch.clamp(amax.float(), min=epsilon) if epsilon > 0 else amax.float()
    bad = ~torch.isfinite(amax) | (amax == 0)
    safe = torch.where(bad, torch.ones_like(amax), amax)
    scale = torch.where(bad, torch.ones_like(amax), divide(max_value * 2.0**-margin, safe))
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, FP32_MAX), scale)
    if power_of_2:
        scale = torch.ldexp(torch.ones_like(scale), torch.frexp(scale).exponent - 1)
    return scale


def amax_scale(x: torch.Tensor, fmt: str | torch.dtype, margin: int = 0) -> float:
    """The per-tensor scale TE's recipes aim at for ``x``: ``(fmt_max / amax(x)) / 2**margin``,
    FP32.

    1.0 for an all-zero tensor. Computed by :func:`scale_from_amax`, so it equals TE's scale
    bit for bit (current scaling).
    """
    checks.tensor("x", x, floating=True)
    if x.numel() == 0 or not torch.isfinite(x).all():
        raise ValueError("x: must be a non-empty tensor of finite values")
    amax = x.detach().abs().amax().float()
    return float(scale_from_amax(amax, fp8_max(fmt), margin=margin))


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` over the whole tensor, in FP32 (FP64 for FP64
    inputs).

    The book's one measure of how far a result is from its reference (an FP8 layer from a BF16
    one, a TE module from the CPU reference). Shapes must match; an all-zero reference is refused.
    """
    checks.tensor("actual", actual)
    checks.tensor("expected", expected)
    if actual.shape != expected.shape:
        raise ValueError(
            f"actual {tuple(actual.shape)} and expected {tuple(expected.shape)}: shapes differ"
        )
    dtype = torch.float64 if torch.float64 in (actual.dtype, expected.dtype) else torch.float32
    a = actual.detach().to("cpu", dtype)
    e = expected.detach().to("cpu", dtype)
    reference = e.norm()
    if reference == 0 or not torch.isfinite(reference):
        raise ValueError(
            "expected: its norm is zero or not finite, so a relative error is undefined"
        )
    return ((a - e).norm() / reference).item()
