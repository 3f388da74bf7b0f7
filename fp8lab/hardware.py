"""Datasheet peaks of common training GPUs, and the ceilings measured on the GPU at hand.

Datasheet figures are *dense* (no 2:4 sparsity) tensor-core peaks in TFLOP/s,
memory in GB (10^9 bytes) and bandwidth in GB/s, copied from NVIDIA's product
datasheets and architecture whitepapers (see ``source`` of each entry and the
book's references). They are upper bounds that real kernels do not reach: the
chapters always set them next to measured ceilings.

:func:`gpu_spec` looks a GPU up by the name ``torch.cuda.get_device_name()``
reports. An unknown GPU raises ``KeyError`` with the known names, and
:func:`measure_ceilings` still works there, so a notebook can fall back to
measured numbers.

Known limits: datasheet peaks assume boost clocks; power and thermal limits
lower them under sustained load, and the FP8 figures assume FP32 accumulation
where the datasheet distinguishes (GeForce cards halve it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from fp8lab.speedometer import Timing, time_callable


@dataclass(frozen=True)
class GPUSpec:
    """Dense datasheet peaks of one GPU model."""

    name: str
    architecture: str
    compute_capability: tuple[int, int]
    fp32_tflops: float
    tf32_tflops: float
    bf16_tflops: float
    fp8_tflops: float | None
    memory_gb: float
    bandwidth_gbs: float
    source: str
    aliases: tuple[str, ...] = ()

    def peak_tflops(self, dtype: str | torch.dtype) -> float:
        """Peak for ``"fp32"``, ``"tf32"``, ``"bf16"``/``"fp16"`` or ``"fp8"`` (or the torch dtype)."""
        key = _dtype_key(dtype)
        value = {"fp32": self.fp32_tflops, "tf32": self.tf32_tflops, "bf16": self.bf16_tflops,
                 "fp16": self.bf16_tflops, "fp8": self.fp8_tflops}[key]
        if value is None:
            raise ValueError(f"dtype={dtype!r}: {self.name} has no FP8 tensor cores (needs sm_89 or newer)")
        return value

    @property
    def ridge_point_bf16(self) -> float:
        """FLOP per byte above which a BF16 kernel is compute-bound on paper."""
        return self.bf16_tflops * 1e12 / (self.bandwidth_gbs * 1e9)


_DTYPE_KEYS = {
    "fp32": "fp32", "float32": "fp32", "tf32": "tf32", "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "fp8": "fp8", "e4m3": "fp8", "e5m2": "fp8",
}


def _dtype_key(dtype: str | torch.dtype) -> str:
    if isinstance(dtype, torch.dtype):
        dtype = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
                 torch.float8_e4m3fn: "fp8", torch.float8_e5m2: "fp8"}.get(dtype, str(dtype))
    key = _DTYPE_KEYS.get(str(dtype).lower())
    if key is None:
        raise ValueError(f"dtype={dtype!r}: must be one of fp32, tf32, bf16, fp16, fp8")
    return key


_HOPPER = "NVIDIA H100 Tensor Core GPU datasheet"
DATASHEET: tuple[GPUSpec, ...] = (
    GPUSpec("A100 SXM4 40GB", "Ampere", (8, 0), 19.5, 156, 312, None, 40, 1555,
            "NVIDIA A100 Tensor Core GPU datasheet", ("NVIDIA A100-SXM4-40GB",)),
    GPUSpec("A100 SXM4 80GB", "Ampere", (8, 0), 19.5, 156, 312, None, 80, 2039,
            "NVIDIA A100 Tensor Core GPU datasheet", ("NVIDIA A100-SXM4-80GB",)),
    GPUSpec("A100 PCIe 40GB", "Ampere", (8, 0), 19.5, 156, 312, None, 40, 1555,
            "NVIDIA A100 Tensor Core GPU datasheet", ("NVIDIA A100-PCIE-40GB",)),
    GPUSpec("A100 PCIe 80GB", "Ampere", (8, 0), 19.5, 156, 312, None, 80, 1935,
            "NVIDIA A100 Tensor Core GPU datasheet", ("NVIDIA A100 80GB PCIe",)),
    GPUSpec("H100 SXM", "Hopper", (9, 0), 67, 494.7, 989.4, 1978.9, 80, 3350, _HOPPER,
            ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB")),
    GPUSpec("H100 PCIe", "Hopper", (9, 0), 51, 378, 756, 1513, 80, 2000, _HOPPER,
            ("NVIDIA H100 PCIe",)),
    GPUSpec("H100 NVL", "Hopper", (9, 0), 60, 417.5, 835.5, 1670.5, 94, 3900, _HOPPER,
            ("NVIDIA H100 NVL",)),
    GPUSpec("H200", "Hopper", (9, 0), 67, 494.7, 989.4, 1978.9, 141, 4800,
            "NVIDIA H200 Tensor Core GPU datasheet (SXM)", ("NVIDIA H200",)),
    GPUSpec("H200 NVL", "Hopper", (9, 0), 60, 417.5, 835.5, 1670.5, 141, 4800,
            "NVIDIA H200 Tensor Core GPU datasheet (NVL)", ("NVIDIA H200 NVL",)),
    GPUSpec("L4", "Ada", (8, 9), 30.3, 60, 121, 242.5, 24, 300,
            "NVIDIA L4 Tensor Core GPU datasheet", ("NVIDIA L4",)),
    GPUSpec("L40S", "Ada", (8, 9), 91.6, 183, 362, 733, 48, 864,
            "NVIDIA L40S GPU datasheet", ("NVIDIA L40S",)),
    GPUSpec("RTX 4090", "Ada", (8, 9), 82.6, 82.6, 165.2, 330.3, 24, 1008,
            "NVIDIA Ada Lovelace architecture whitepaper (FP32 accumulate)", ("NVIDIA GeForce RTX 4090",)),
    GPUSpec("B200", "Blackwell", (10, 0), 75, 1100, 2250, 4500, 180, 8000,
            "NVIDIA HGX B200 datasheet (platform figures / 8)", ("NVIDIA B200",)),
)


def _normalise(name: str) -> str:
    return " ".join(name.lower().replace("nvidia", "").replace("-", " ").split())


def gpu_spec(name: str | None = None) -> GPUSpec:
    """The datasheet entry for ``name`` (default: the current CUDA GPU)."""
    if name is None:
        if not torch.cuda.is_available():
            raise KeyError("no CUDA GPU here, so there is no datasheet entry; pass a name such as 'H200'")
        name = torch.cuda.get_device_name()
    if not isinstance(name, str):
        raise TypeError(f"name must be a GPU name string, got {type(name).__name__}")
    wanted = _normalise(name)
    for spec in DATASHEET:
        if wanted in {_normalise(spec.name), *map(_normalise, spec.aliases)}:
            return spec
    known = ", ".join(spec.name for spec in DATASHEET)
    raise KeyError(f"unknown GPU {name!r}: no datasheet entry (known: {known}); use measure_ceilings() instead")


def datasheet_table():
    """All datasheet entries as a pandas DataFrame (one row per GPU)."""
    import pandas as pd

    rows = [{k: v for k, v in asdict(spec).items() if k not in ("aliases",)} for spec in DATASHEET]
    frame = pd.DataFrame(rows).set_index("name")
    frame["compute_capability"] = frame["compute_capability"].map(lambda cc: f"{cc[0]}.{cc[1]}")
    return frame


# --- measured ceilings -------------------------------------------------------------------------

@dataclass(frozen=True)
class MatmulResult:
    """One timed matrix product ``(M, K) @ (K, N)``."""

    m: int
    n: int
    k: int
    dtype: str
    timing: Timing

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def tflops(self) -> float:
        return self.flops / (self.timing.median_ms * 1e-3) / 1e12

    @property
    def bytes_moved(self) -> int:
        """Fewest bytes a product must move: each input read once, the BF16/FP32 output written once."""
        in_size = 1 if self.dtype == "fp8" else (4 if self.dtype == "fp32" else 2)
        out_size = 4 if self.dtype == "fp32" else 2
        return in_size * (self.m * self.k + self.k * self.n) + out_size * self.m * self.n

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes_moved


def _input_sets(m: int, n: int, k: int, dtype: str, device: torch.device, count: int):
    """Several independent operand sets, so repeated products do not run from the L2 cache."""
    generator = torch.Generator(device=device).manual_seed(0)
    sets = []
    for _ in range(count):
        a = torch.randn(m, k, device=device, generator=generator)
        b = torch.randn(n, k, device=device, generator=generator)
        if dtype == "fp8":
            sets.append((a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)))
        else:
            torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
            sets.append((a.to(torch_dtype), b.to(torch_dtype)))
    return sets


def measure_matmul(m: int, n: int, k: int, dtype: str = "bf16", *, warmup: int = 10, iters: int = 50,
                   layout: str = "tn", device: torch.device | str | None = None) -> MatmulResult:
    """Time ``A @ B`` for ``A: (M, K)``, ``B: (K, N)`` on random data.

    ``layout="tn"`` stores ``B`` as ``(N, K)`` row-major and passes it transposed, as
    ``nn.Linear`` does (``x @ W.T``) and as cuBLAS requires for FP8; ``"nn"`` stores ``B``
    as ``(K, N)`` row-major (BF16/FP32 only). FP8 uses ``torch._scaled_mm`` (E4M3
    operands, per-tensor FP32 scales, BF16 output, FP32 accumulation), the cuBLASLt path
    TE's GEMMs use.
    """
    if layout not in ("tn", "nn"):
        raise ValueError(f"layout={layout!r}: must be 'tn' or 'nn'")
    for label, value in (("m", m), ("n", n), ("k", k), ("iters", iters)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{label}={value!r}: must be a positive integer")
    key = _dtype_key(dtype)
    if key == "tf32":
        raise ValueError("dtype='tf32': time an fp32 product with torch.backends.cuda.matmul.allow_tf32=True")
    if key == "fp8" and (k % 16 or n % 16):
        raise ValueError(f"FP8 products need K and N divisible by 16 (got K={k}, N={n})")
    if key == "fp8" and layout != "tn":
        raise ValueError("FP8 products need layout='tn' (cuBLAS takes FP8 B only transposed)")
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    operand_bytes = (m * k + n * k) * (1 if key == "fp8" else 2)
    count = max(1, min(8, math.ceil(256e6 / operand_bytes))) if device.type == "cuda" else 1
    sets = _input_sets(m, n, k, key, device, count)
    if layout == "nn":
        sets = [(a, b.t().contiguous()) for a, b in sets]
    one = torch.ones((), device=device, dtype=torch.float32)
    step = iter(range(10**12))

    def product():
        a, b = sets[next(step) % count]
        if key == "fp8":
            return torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return a @ b if layout == "nn" else a @ b.t()

    timing = time_callable(product, warmup=warmup, iters=iters, device=device, label=f"{key} {layout} {m}x{n}x{k}")
    return MatmulResult(m, n, k, key, timing)


@dataclass(frozen=True)
class CopyResult:
    """One timed device-to-device copy."""

    nbytes: int
    timing: Timing

    @property
    def gbs(self) -> float:
        """Bandwidth counting bytes read plus bytes written, in GB/s."""
        return 2 * self.nbytes / (self.timing.median_ms * 1e-3) / 1e9


def measure_copy_bandwidth(nbytes: int, *, warmup: int = 5, iters: int = 30,
                           device: torch.device | str | None = None) -> CopyResult:
    """Time ``dst.copy_(src)`` for a buffer of ``nbytes`` bytes (read + write counted)."""
    if not isinstance(nbytes, int) or nbytes <= 0:
        raise ValueError(f"nbytes={nbytes!r}: must be a positive integer")
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    source = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    timing = time_callable(lambda: target.copy_(source), warmup=warmup, iters=iters, device=device,
                           label=f"copy {nbytes / 2**20:.0f} MiB")
    return CopyResult(nbytes, timing)


def measure_ceilings(sizes: tuple[int, ...] | None = None, *, copy_bytes: int | None = None, iters: int = 30,
                     device: torch.device | str | None = None) -> dict[str, float]:
    """The best BF16 and FP8 matrix-product rates (TFLOP/s) over square ``sizes``, and copy bandwidth (GB/s).

    A quick re-measurement of chapter 00's ceilings for a chapter that reports MFU against them.
    Defaults: sizes 4096 and 8192 and a 1 GiB copy on a GPU; 256 and 512 and 64 MiB on a CPU.
    FP8 is measured only where the device has FP8 tensor cores or is a CPU (emulated there).
    """
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    sizes = sizes or ((4096, 8192) if cuda else (256, 512))
    copy_bytes = copy_bytes or (2**30 if cuda else 2**26)
    dtypes = ["bf16"]
    if not cuda or torch.cuda.get_device_capability(device) >= (8, 9):
        dtypes.append("fp8")
    ceilings = {dtype: max(measure_matmul(n, n, n, dtype, iters=iters, device=device).tflops for n in sizes)
                for dtype in dtypes}
    ceilings["bandwidth_gbs"] = measure_copy_bandwidth(copy_bytes, iters=iters, device=device).gbs
    return ceilings
