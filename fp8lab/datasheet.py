"""Datasheet peaks of common training GPUs: pure data and look-ups, no timing.

Figures are *dense* (no 2:4 sparsity) tensor-core peaks in TFLOP/s, memory in GB
(10^9 bytes) and bandwidth in GB/s, copied from NVIDIA's product datasheets and
architecture whitepapers (``source`` of each entry; the book's references). They are
upper bounds that real kernels do not reach: the chapters set them next to the ceilings
:mod:`fp8lab.ceilings` measures on the GPU at hand.

:func:`gpu_spec` looks a GPU up by the name ``torch.cuda.get_device_name()`` reports.
An unknown GPU raises ``ValueError`` naming the known ones; measured ceilings still work
there.

Known limits: datasheet peaks assume boost clocks; power and thermal limits lower them
under sustained load, and the FP8 figures assume FP32 accumulation where the datasheet
distinguishes (GeForce cards halve it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["DATASHEET", "DTYPES", "GPUSpec", "datasheet_table", "dtype_key", "gpu_spec"]

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
_DTYPE_KEYS = {
    "fp32": "fp32",
    "float32": "fp32",
    "torch.float32": "fp32",
    "tf32": "tf32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "torch.float16": "fp16",
    "fp8": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
    "torch.float8_e4m3fn": "fp8",
    "torch.float8_e5m2": "fp8",
}


def dtype_key(dtype) -> str:
    """``"fp32"``, ``"tf32"``, ``"bf16"``, ``"fp16"`` or ``"fp8"`` for a name or a torch dtype."""
    if isinstance(dtype, str):
        key = _DTYPE_KEYS.get(dtype.lower())
    elif type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype":
        key = _DTYPE_KEYS.get(str(dtype))
    else:
        raise TypeError(f"dtype={dtype!r}: must be a name such as 'bf16' or a torch dtype")
    if key is None:
        raise ValueError(
            f"dtype={dtype!r}: must be one of {', '.join(DTYPES)} (or the torch dtype)"
        )
    return key


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

    def peak_tflops(self, dtype) -> float:
        """Peak for ``"fp32"``, ``"tf32"``, ``"bf16"``/``"fp16"`` or ``"fp8"`` (or the torch
        dtype)."""
        key = dtype_key(dtype)
        value = {
            "fp32": self.fp32_tflops,
            "tf32": self.tf32_tflops,
            "bf16": self.bf16_tflops,
            "fp16": self.bf16_tflops,
            "fp8": self.fp8_tflops,
        }[key]
        if value is None:
            raise ValueError(
                f"dtype={dtype!r}: {self.name} has no FP8 tensor cores (needs sm_89 or newer)"
            )
        return value

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    def ridge_point(self, dtype="bf16") -> float:
        """FLOP per byte above which a kernel of ``dtype`` is compute-bound on paper."""
        return self.peak_tflops(dtype) * 1e12 / (self.bandwidth_gbs * 1e9)


_SOURCES = {
    "A100": "NVIDIA A100 Tensor Core GPU datasheet",
    "H100": "NVIDIA H100 Tensor Core GPU datasheet",
    "H200": "NVIDIA H200 Tensor Core GPU datasheet (SXM)",
    "H200 NVL": "NVIDIA H200 Tensor Core GPU datasheet (NVL)",
    "L4": "NVIDIA L4 Tensor Core GPU datasheet",
    "L40S": "NVIDIA L40S GPU datasheet",
    "Ada": "NVIDIA Ada Lovelace architecture whitepaper (FP32 accumulate)",
    "B200": "NVIDIA HGX B200 datasheet (platform figures / 8)",
}
# One row per GPU: dense TFLOP/s peaks, memory in GB, bandwidth in GB/s, a key of _SOURCES.
# fmt: off
_ROWS = (
    # name            architecture  cc       fp32  tf32   bf16    fp8     GB   GB/s  source
    ("A100 SXM4 40GB", "Ampere",    (8, 0),  19.5, 156,   312,    None,   40,  1555, "A100"),
    ("A100 SXM4 80GB", "Ampere",    (8, 0),  19.5, 156,   312,    None,   80,  2039, "A100"),
    ("A100 PCIe 40GB", "Ampere",    (8, 0),  19.5, 156,   312,    None,   40,  1555, "A100"),
    ("A100 PCIe 80GB", "Ampere",    (8, 0),  19.5, 156,   312,    None,   80,  1935, "A100"),
    ("H100 SXM",       "Hopper",    (9, 0),  67,   494.7, 989.4,  1978.9, 80,  3350, "H100"),
    ("H100 PCIe",      "Hopper",    (9, 0),  51,   378,   756,    1513,   80,  2000, "H100"),
    ("H100 NVL",       "Hopper",    (9, 0),  60,   417.5, 835.5,  1670.5, 94,  3900, "H100"),
    ("H200",           "Hopper",    (9, 0),  67,   494.7, 989.4,  1978.9, 141, 4800, "H200"),
    ("H200 NVL",       "Hopper",    (9, 0),  60,   417.5, 835.5,  1670.5, 141, 4800, "H200 NVL"),
    ("L4",             "Ada",       (8, 9),  30.3, 60,    121,    242.5,  24,  300,  "L4"),
    ("L40S",           "Ada",       (8, 9),  91.6, 183,   362,    733,    48,  864,  "L40S"),
    ("RTX 4090",       "Ada",       (8, 9),  82.6, 82.6,  165.2,  330.3,  24,  1008, "Ada"),
    ("B200",           "Blackwell", (10, 0), 75,   1100,  2250,   4500,   180, 8000, "B200"),
)
# fmt: on
# The names torch.cuda.get_device_name() reports for each GPU.
_ALIASES = {
    "A100 SXM4 40GB": ("NVIDIA A100-SXM4-40GB",),
    "A100 SXM4 80GB": ("NVIDIA A100-SXM4-80GB",),
    "A100 PCIe 40GB": ("NVIDIA A100-PCIE-40GB",),
    "A100 PCIe 80GB": ("NVIDIA A100 80GB PCIe",),
    "H100 SXM": ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"),
    "H100 PCIe": ("NVIDIA H100 PCIe",),
    "H100 NVL": ("NVIDIA H100 NVL",),
    "H200": ("NVIDIA H200",),
    "H200 NVL": ("NVIDIA H200 NVL",),
    "L4": ("NVIDIA L4",),
    "L40S": ("NVIDIA L40S",),
    "RTX 4090": ("NVIDIA GeForce RTX 4090",),
    "B200": ("NVIDIA B200",),
}
DATASHEET: tuple[GPUSpec, ...] = tuple(
    GPUSpec(*row[:-1], _SOURCES[row[-1]], _ALIASES[row[0]]) for row in _ROWS
)


def _normalise(name: str) -> str:
    return " ".join(name.lower().replace("nvidia", "").replace("-", " ").split())


def gpu_spec(name: str | None = None) -> GPUSpec:
    """The datasheet entry for ``name`` (default: the current CUDA GPU's name)."""
    if name is None:
        import torch

        if not torch.cuda.is_available():
            raise ValueError("name=None: no CUDA GPU here to look up; pass a name such as 'H200'")
        name = torch.cuda.get_device_name()
    if not isinstance(name, str):
        raise TypeError(f"name={name!r}: must be a GPU name string, not {type(name).__name__}")
    wanted = _normalise(name)
    for spec in DATASHEET:
        if wanted in {_normalise(spec.name), *map(_normalise, spec.aliases)}:
            return spec
    known = ", ".join(spec.name for spec in DATASHEET)
    raise ValueError(
        f"name={name!r}: no datasheet entry for this GPU (known: {known}); use measured ceilings"
    )


def datasheet_table(columns: tuple[str, ...] | None = None):
    """All datasheet entries as a pandas DataFrame (one row per GPU), optionally only
    ``columns``."""
    import pandas as pd

    rows = [{k: v for k, v in asdict(spec).items() if k != "aliases"} for spec in DATASHEET]
    frame = pd.DataFrame(rows).set_index("name")
    frame["compute_capability"] = frame["compute_capability"].map(lambda cc: f"{cc[0]}.{cc[1]}")
    if columns is not None:
        if not isinstance(columns, (tuple, list)) or not all(isinstance(c, str) for c in columns):
            raise TypeError(f"columns={columns!r}: must be a tuple of column names")
        unknown = [c for c in columns if c not in frame.columns]
        if unknown:
            raise ValueError(
                f"columns={columns!r}: unknown {unknown}; known: {list(frame.columns)}"
            )
        frame = frame[list(columns)]
    return frame
