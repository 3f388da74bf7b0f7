"""The ceilings of the GPU at hand, measured: matrix-product rates and copy bandwidth (chapter 00).

Datasheet peaks (:mod:`fp8lab.datasheet`) are what a GPU could do; these are what it does,
timed with :mod:`fp8lab.speedometer` on random data (never zeros: they run faster), rotating
several operand sets so that repeats do not run from the L2 cache.

FP8 products use ``torch._scaled_mm`` (E4M3 operands, per-tensor FP32 scales, BF16 output),
the cuBLASLt path Transformer Engine's GEMMs take. ``fast_accumulation`` picks cuBLAS's
accumulation mode on Hopper: ``False`` accumulates in FP32 throughout (TE's backward GEMMs,
``use_split_accumulator=True``), ``True`` is the faster, less precise mode TE uses for its
forward GEMM by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fp8lab import checks
from fp8lab.datasheet import dtype_key
from fp8lab.devices import resolve_device
from fp8lab.speedometer import Timing, time_callable

__all__ = [
    "CopyResult",
    "MatmulResult",
    "measure_ceilings",
    "measure_copy_bandwidth",
    "matmul_step",
    "measure_matmul",
]

LAYOUTS = ("tn", "nn")
L2_AVOIDING_BYTES = 256e6  # operand sets rotate until their total passes this (H200 L2: 60 MB)


@dataclass(frozen=True)
class MatmulResult:
    """One timed matrix product ``(M, K) @ (K, N)``."""

    m: int
    n: int
    k: int
    dtype: str
    timing: Timing
    fast_accumulation: bool = False

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def tflops(self) -> float:
        return self.flops / (self.timing.median_ms * 1e-3) / 1e12

    @property
    def bytes_moved(self) -> int:
        """Fewest bytes a product must move: each input read once, the BF16/FP32 output written
        once."""
        in_size = 1 if self.dtype == "fp8" else (4 if self.dtype == "fp32" else 2)
        out_size = 4 if self.dtype == "fp32" else 2
        return in_size * (self.m * self.k + self.k * self.n) + out_size * self.m * self.n

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes_moved


def _input_sets(m: int, n: int, k: int, dtype: str, device: torch.device, count: int):
    generator = torch.Generator(device=device).manual_seed(0)
    torch_dtype = {
        "fp8": torch.float8_e4m3fn,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "fp32": torch.float32,
    }[dtype]
    sets = []
    for _ in range(count):
        a = torch.randn(m, k, device=device, generator=generator)
        b = torch.randn(n, k, device=device, generator=generator)
        sets.append((a.to(torch_dtype), b.to(torch_dtype)))
    return sets


def _check_matmul(m, n, k, dtype, warmup, iters, layout, fast_accumulation) -> str:
    """The dtype key of a product :func:`measure_matmul` can time; errors name the argument."""
    checks.integer("iters", iters)
    checks.integer("warmup", warmup, minimum=0)
    checks.choice("layout", layout, LAYOUTS)
    checks.flag("fast_accumulation", fast_accumulation)
    key = dtype_key(dtype)
    if key == "tf32":
        raise ValueError(
            "dtype='tf32': time an fp32 product with torch.backends.cuda.matmul.allow_tf32=True"
        )
    if key != "fp8" and fast_accumulation:
        raise ValueError(f"fast_accumulation=True applies to FP8 products only (dtype={dtype!r})")
    if key == "fp8" and (k % 16 or n % 16):
        raise ValueError(f"FP8 products need K and N divisible by 16 (got K={k}, N={n})")
    if key == "fp8" and layout != "tn":
        raise ValueError(
            "layout='nn': FP8 products need layout='tn' (cuBLAS takes FP8 B only transposed)"
        )
    return key


def matmul_step(
    m: int,
    n: int,
    k: int,
    dtype: str = "bf16",
    *,
    layout: str = "tn",
    fast_accumulation: bool = False,
    device: torch.device | str | None = None,
):
    """A zero-argument callable that computes one ``(M, K) @ (K, N)`` product on random data,
    rotating operand sets (on a GPU) so that repeats do not run from the L2 cache: the step
    :func:`measure_matmul` times, and the step a chapter hands to :func:`fp8lab.protocol.rounds`.
    Arguments as for :func:`measure_matmul`."""
    m, n, k = (checks.integer(name, value) for name, value in (("m", m), ("n", n), ("k", k)))
    key = _check_matmul(m, n, k, dtype, 0, 1, layout, fast_accumulation)
    device = resolve_device(device, default=True)
    operand_bytes = (m * k + n * k) * (1 if key == "fp8" else 2)
    count = (
        max(1, min(8, math.ceil(L2_AVOIDING_BYTES / operand_bytes))) if device.type == "cuda" else 1
    )
    sets = _input_sets(m, n, k, key, device, count)
    if layout == "nn":
        sets = [(a, b.t().contiguous()) for a, b in sets]
    one = torch.ones((), device=device, dtype=torch.float32)
    step = iter(range(10**12))

    def product():
        a, b = sets[next(step) % count]
        if key == "fp8":
            return torch._scaled_mm(
                a,
                b.t(),
                scale_a=one,
                scale_b=one,
                out_dtype=torch.bfloat16,
                use_fast_accum=fast_accumulation,
            )
        return a @ b if layout == "nn" else a @ b.t()

    return product


def measure_matmul(
    m: int,
    n: int,
    k: int,
    dtype: str = "bf16",
    *,
    warmup: int = 10,
    iters: int = 50,
    layout: str = "tn",
    fast_accumulation: bool = False,
    device: torch.device | str | None = None,
) -> MatmulResult:
    """Time ``A @ B`` for ``A: (M, K)``, ``B: (K, N)`` on random data.

    ``layout="tn"`` stores ``B`` as ``(N, K)`` row-major and passes it transposed, as
    ``nn.Linear`` does (``x @ W.T``) and as cuBLAS requires for FP8; ``"nn"`` stores ``B``
    as ``(K, N)`` (16- and 32-bit only). ``fast_accumulation`` applies to FP8 only.
    """
    m, n, k = (checks.integer(name, value) for name, value in (("m", m), ("n", n), ("k", k)))
    key = _check_matmul(m, n, k, dtype, warmup, iters, layout, fast_accumulation)
    device = resolve_device(device, default=True)
    product = matmul_step(
        m, n, k, key, layout=layout, fast_accumulation=fast_accumulation, device=device
    )
    label = f"{key} {layout} {m}x{n}x{k}" + (" fast-accum" if fast_accumulation else "")
    timing = time_callable(product, warmup=warmup, iters=iters, device=device, label=label)
    return MatmulResult(m, n, k, key, timing, fast_accumulation)


@dataclass(frozen=True)
class CopyResult:
    """One timed device-to-device copy."""

    nbytes: int
    timing: Timing

    @property
    def gbs(self) -> float:
        """Bandwidth counting bytes read plus bytes written, in GB/s."""
        return 2 * self.nbytes / (self.timing.median_ms * 1e-3) / 1e9


def measure_copy_bandwidth(
    nbytes: int, *, warmup: int = 5, iters: int = 30, device: torch.device | str | None = None
) -> CopyResult:
    """Time ``dst.copy_(src)`` for a buffer of ``nbytes`` bytes (read + write counted)."""
    checks.integer("nbytes", nbytes)
    checks.integer("iters", iters)
    checks.integer("warmup", warmup, minimum=0)
    device = resolve_device(device, default=True)
    source = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    timing = time_callable(
        lambda: target.copy_(source),
        warmup=warmup,
        iters=iters,
        device=device,
        label=f"copy {nbytes / 2**20:.0f} MiB",
    )
    return CopyResult(nbytes, timing)


def measure_ceilings(
    sizes: tuple[int, ...] | None = None,
    *,
    copy_bytes: int | None = None,
    iters: int = 30,
    device: torch.device | str | None = None,
) -> dict[str, float]:
    """The best BF16 and FP8 matrix-product rates (TFLOP/s) over square ``sizes``, and copy
    bandwidth (GB/s).

    A quick re-measurement of chapter 00's ceilings for a chapter that reports against them.
    Defaults: sizes 4096 and 8192 and a 1 GiB copy on a GPU; 256 and 512 and 64 MiB on a CPU.
    FP8 (FP32 accumulation) is measured where the device has FP8 tensor cores, and on a CPU
    (emulated, so a CPU figure only).
    """
    device = resolve_device(device, default=True)
    cuda = device.type == "cuda"
    if sizes is None:
        sizes = (4096, 8192) if cuda else (256, 512)
    if not isinstance(sizes, (tuple, list)) or not sizes:
        raise TypeError(f"sizes={sizes!r}: must be a non-empty tuple of positive integers")
    for size in sizes:
        checks.integer("sizes[i]", size)
    copy_bytes = (
        checks.integer("copy_bytes", copy_bytes)
        if copy_bytes is not None
        else (2**30 if cuda else 2**26)
    )
    checks.integer("iters", iters)
    dtypes = ["bf16"]
    if not cuda or torch.cuda.get_device_capability(device) >= (8, 9):
        dtypes.append("fp8")
        if any(size % 16 for size in sizes):
            raise ValueError(f"sizes={tuple(sizes)}: FP8 products need sizes divisible by 16")
    ceilings = {
        dtype: max(measure_matmul(n, n, n, dtype, iters=iters, device=device).tflops for n in sizes)
        for dtype in dtypes
    }
    ceilings["bandwidth_gbs"] = measure_copy_bandwidth(copy_bytes, iters=iters, device=device).gbs
    return ceilings
