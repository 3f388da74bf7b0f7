"""Where the time of a step goes: the book's one profiler wrapper and its one kernel classifier.

:func:`profile` runs a callable a few times under ``torch.profiler`` and returns a
:class:`Profile`: every kernel (GPU) or operator (CPU) with its device time, stream, start and
duration. From it:

* :meth:`Profile.by_category` and :meth:`Profile.by_kernel` sum the time into categories read
  off the names (:func:`categorize`: the optimizer, communication, attention, matrix
  multiplies, FP8 casts and amaxes, norms, element-wise work, the rest);
* :attr:`Profile.busy_ms` is the time at least one kernel ran (the union of the kernels'
  intervals), :attr:`Profile.span_ms` the time from the first kernel's start to the last one's
  end, and :attr:`Profile.idle_fraction` the share of that span in which the GPU ran nothing.
  A large idle share means the host, not the GPU, sets the step time: launches arrive slower
  than the kernels finish, and a faster kernel would not make the step faster.

:func:`kernel_family` reads which attention implementation ran off the kernels' names.

The categories are a reading of names, not a measurement of anything else: a kernel with an
unfamiliar name lands in "other", and :meth:`Profile.by_kernel` lists every kernel with its
category so a reader can check the grouping. The optimizer is read first: TE's FP8 Adam kernel
has "fp8" in its name and would otherwise count as an FP8 cast.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fp8lab import checks
from fp8lab.devices import resolve_device

__all__ = [
    "CATEGORIES",
    "FAMILIES",
    "Kernel",
    "Profile",
    "categorize",
    "kernel_family",
    "profile",
    "time_breakdown",
    "union_length",
]

OPTIMIZER, COMMUNICATION, OTHER = "optimizer", "communication", "other"
# An optimizer's name as a word of a kernel name: lower case after a non-letter
# (multi_tensor_adam, _fused_sgd_), or capitalised anywhere (FusedAdamMathFunctor, SGDFunctor),
# and never followed by a lower-case letter, so that PyTorch's "{lambda(float)#1}" is not LAMB.
# Multi-tensor kernels (TE's and torch's foreach and fused updates) are the optimizer's too.
_OPTIMIZER_WORDS = (
    r"(?:(?<![A-Za-z])(?:adamw?|lamb|sgd|optimi[sz]er)|Adam|LAMB|Lamb|SGD|Sgd|Optimizer)W?(?![a-z])"
)
_OPTIMIZER = re.compile(rf"{_OPTIMIZER_WORDS}|multi_tensor_apply|aten::_foreach_")
# First match wins: the optimizer before FP8 casts (TE's FP8 Adam), communication before
# element-wise work (NCCL's reductions), attention before GEMM (fused attention kernels contain
# GEMM-like names).
CATEGORIES: tuple[tuple[str, re.Pattern], ...] = (
    (OPTIMIZER, _OPTIMIZER),
    (
        COMMUNICATION,
        re.compile(
            r"nccl|userbuffers|allgather|all_gather|reducescatter|reduce_scatter|allreduce|"
            r"all_reduce|sendrecv|c10d|gloo|broadcast",
            re.I,
        ),
    ),
    (
        "attention",
        re.compile(
            r"flash|fmha|sdpa|attention|softmax|dot_do_o|convert_dq|_efficient_attention", re.I
        ),
    ),
    (
        "GEMM",
        re.compile(
            r"gemm|nvjet|cutlass|sm90_xmma|ampere_|aten::(mm|addmm|bmm|matmul|linear|_scaled_mm)\b|"
            r"cublas",
            re.I,
        ),
    ),
    (
        "FP8 cast / amax / transpose",
        # "cast" as a word: TE's cast kernels, not PyTorch's LoadWithCast copies or nocast loops
        re.compile(r"(?<![A-Za-z])cast|quantiz|amax|transpose|fp8|scale_update|scale_inv", re.I),
    ),
    ("norm", re.compile(r"norm", re.I)),
    (
        "element-wise (dropout, adds, copies)",
        re.compile(
            r"elementwise|dropout|add|mul|copy|gelu|silu|triton|unary|binary|reduce|sum|fill|"
            r"memset|memcpy|cat|bernoulli|where|aten::",
            re.I,
        ),
    ),
)

# Attention implementations, short enough for a table column; the first family whose pattern
# any kernel name matches. cuDNN's generated attention kernels contain "flash" too, so cuDNN is
# tested first.
CUDNN, FLASH_TORCH, FLASH_PACKAGE = "cuDNN", "PyTorch flash", "flash-attn"
EFFICIENT, UNFUSED = "mem-efficient", "GEMM+softmax"
FAMILIES: tuple[tuple[str, re.Pattern], ...] = (
    (CUDNN, re.compile(r"cudnn|fort_native_sdpa", re.I)),
    (FLASH_TORCH, re.compile(r"pytorch_flash|_flash_attention_for_cpu", re.I)),
    (FLASH_PACKAGE, re.compile(r"flash_fwd|flash_bwd|flashattn|flash_attn", re.I)),
    (EFFICIENT, re.compile(r"fmha_cutlass|efficient_attention", re.I)),
)
_SOFTMAX = re.compile(r"softmax", re.I)
_GEMM = re.compile(r"gemm|nvjet|xmma|aten::(bmm|mm|matmul|baddbmm)\b", re.I)


def categorize(name: str) -> str:
    """The category of a kernel or operator name (see :data:`CATEGORIES`)."""
    if not isinstance(name, str):
        raise TypeError(f"name={name!r}: must be a kernel or operator name string")
    for category, pattern in CATEGORIES:
        if pattern.search(name):
            return category
    return OTHER


def kernel_family(names: Sequence[str]) -> str:
    """Which attention implementation ran, read off kernel or operator names: ``cuDNN`` (fused
    attention), ``PyTorch flash`` (PyTorch's FlashAttention-2, or its CPU flash kernel),
    ``flash-attn`` (the flash-attn packages), ``mem-efficient`` (xFormers' cutlass kernels),
    ``GEMM+softmax`` (unfused), or ``other``."""
    if isinstance(names, str) or not isinstance(names, (list, tuple)):
        raise TypeError(
            f"names must be a list or tuple of kernel names, not {type(names).__name__}"
        )
    if not all(isinstance(name, str) for name in names):
        raise TypeError("names: every kernel name must be a string")
    for family, pattern in FAMILIES:
        if any(pattern.search(name) for name in names):
            return family
    if any(_SOFTMAX.search(n) for n in names) and any(_GEMM.search(n) for n in names):
        return UNFUSED
    return OTHER


def union_length(intervals: Sequence[tuple[float, float]]) -> float:
    """The length covered by ``(start, end)`` intervals, overlaps counted once."""
    total, reached = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= reached:
            continue
        total += stop - max(start, reached)
        reached = stop
    return total


@dataclass(frozen=True)
class Kernel:
    """One kernel (GPU) or operator (CPU) the profiler saw; times in microseconds from the
    first one's start."""

    name: str
    category: str
    stream: str
    start_us: float
    dur_us: float


@dataclass(frozen=True)
class Profile:
    """What :func:`profile` recorded over ``iters`` calls; every ``*_ms`` is per call.

    ``kernels``: the timeline (GPU kernels, or CPU operators, nested ones included);
    ``self_ms`` and ``calls``: device (GPU) or self (CPU) time and calls per kernel name, over
    all ``iters`` calls, for the tables.
    """

    kernels: tuple[Kernel, ...]
    self_ms: dict
    calls: dict
    iters: int
    device: str

    @property
    def busy_ms(self) -> float:
        """Time in which at least one kernel ran."""
        return union_length([(k.start_us, k.start_us + k.dur_us) for k in self.kernels]) / (
            1e3 * self.iters
        )

    @property
    def kernel_ms(self) -> float:
        """Sum of the kernels' own times (more than ``busy_ms`` where streams overlap)."""
        return sum(self.self_ms.values()) / self.iters

    @property
    def span_ms(self) -> float:
        """From the first kernel's start to the last kernel's end."""
        if not self.kernels:
            return 0.0
        return max(k.start_us + k.dur_us for k in self.kernels) / (1e3 * self.iters)

    @property
    def idle_fraction(self) -> float:
        """Share of the span in which nothing ran: the GPU waiting for the host."""
        span = self.span_ms
        return max(0.0, 1.0 - self.busy_ms / span) if span > 0 else 0.0

    def by_kernel(self):
        """Every kernel name with its category, calls and time per call (a pandas table)."""
        import pandas as pd

        rows = [
            {
                "kernel": name,
                "category": categorize(name),
                "calls per step": self.calls.get(name, 0) / self.iters,
                "ms per step": total / self.iters,
            }
            for name, total in self.self_ms.items()
            if total > 0
        ]
        columns = ["kernel", "category", "calls per step", "ms per step"]
        table = pd.DataFrame(rows, columns=columns)
        return table.sort_values("ms per step", ascending=False, ignore_index=True)

    def by_category(self, idle: bool = False):
        """Time per call by category, with its share (a pandas table); ``idle=True`` adds a row
        for the span in which the GPU ran nothing."""
        checks.flag("idle", idle)
        kernels = self.by_kernel()
        table = kernels.groupby("category")["ms per step"].sum().sort_values(ascending=False)
        table = table.to_frame()
        if idle:
            table.loc["idle (the device waits for the host)"] = self.span_ms - self.busy_ms
        table["share"] = table["ms per step"] / table["ms per step"].sum()
        return table


@contextlib.contextmanager
def _quiet_stderr():
    """Send file descriptor 2 to /dev/null for the body: the profiler's C++ side (kineto) logs
    its start and stop there, and a notebook's kernel forwards fd 2 into the outputs. What it
    reports that matters (the kernels) comes back as data."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _timeline(prof, cuda: bool) -> tuple[Kernel, ...]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    wanted = {"kernel", "gpu_memcpy", "gpu_memset"} if cuda else {"cpu_op"}
    raw = []
    for event in trace.get("traceEvents", []):
        if event.get("ph") != "X" or "dur" not in event:
            continue
        if str(event.get("cat", "")).lower() not in wanted:
            continue
        name = str(event.get("name", ""))
        if not cuda and name.startswith("ProfilerStep"):
            continue
        stream = (event.get("args") or {}).get("stream", event.get("tid"))
        raw.append((float(event["ts"]), float(event["dur"]), name, str(stream)))
    origin = min((ts for ts, *_ in raw), default=0.0)
    return tuple(
        Kernel(name, categorize(name), stream, round(ts - origin, 2), round(dur, 2))
        for ts, dur, name, stream in sorted(raw)
    )


def profile(
    fn: Callable[[], Any],
    *,
    warmup: int = 5,
    iters: int = 5,
    device: torch.device | str | None = None,
) -> Profile:
    """Run ``fn`` ``warmup`` times, then profile ``iters`` calls (synchronised at the end)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    checks.integer("warmup", warmup, minimum=0)
    checks.integer("iters", iters)
    device = resolve_device(device, default=True)
    cuda = device.type == "cuda"
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize(device)
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    # acc_events: one profiling cycle here; without it torch warns that it clears events per cycle
    with _quiet_stderr(), torch_profile(activities=[activity], acc_events=True) as prof:
        for _ in range(iters):
            fn()
        if cuda:
            torch.cuda.synchronize(device)
    self_ms, calls = {}, {}
    for event in prof.key_averages():
        total_us = event.self_device_time_total if cuda else event.self_cpu_time_total
        if total_us > 0 and not event.key.startswith("ProfilerStep"):
            self_ms[event.key], calls[event.key] = total_us / 1e3, event.count
    return Profile(_timeline(prof, cuda), self_ms, calls, iters, device.type)


def time_breakdown(
    fn: Callable[[], Any],
    *,
    warmup: int = 5,
    iters: int = 5,
    device: torch.device | str | None = None,
):
    """``(by_category, by_kernel)`` tables of :func:`profile`: milliseconds per call of device
    time of CUDA kernels on a GPU, of self CPU time of operators on a CPU."""
    result = profile(fn, warmup=warmup, iters=iters, device=device)
    return result.by_category(), result.by_kernel()
