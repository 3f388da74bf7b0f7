"""Where the time of a step goes: kernel time from ``torch.profiler``, grouped by kind of work.

On a GPU the profiler records every CUDA kernel with its device time; on a CPU it records
every operator with its own CPU time. :func:`time_breakdown` runs a callable a few times
under the profiler and sums that time into categories read off the kernel or operator
name (matrix multiplies, attention, FP8 casts and amaxes, norms, element-wise work such as
dropout and residual adds, and the rest), so a notebook can say where a step's time goes.

The categories are a reading of names, not a measurement of anything else: a kernel with
an unfamiliar name lands in "other", and the table lists the biggest kernels of each
category so a reader can check the grouping.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from fp8lab import checks

__all__ = ["CATEGORIES", "categorize", "time_breakdown"]

# first match wins: attention before GEMM (fused attention kernels contain "gemm"-like names)
CATEGORIES: tuple[tuple[str, re.Pattern], ...] = (
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
        re.compile(r"(?<!no)cast|quantiz|amax|transpose|fp8|scale_update|scale_inv", re.I),
    ),
    ("norm", re.compile(r"norm", re.I)),
    (
        "element-wise (dropout, adds, copies)",
        re.compile(
            r"elementwise|dropout|add|mul|copy|gelu|silu|triton|unary|binary|reduce|sum|fill|memset|memcpy|"
            r"cat|bernoulli|where|aten::",
            re.I,
        ),
    ),
)
OTHER = "other"


def categorize(name: str) -> str:
    """The category of a kernel or operator name (see :data:`CATEGORIES`)."""
    if not isinstance(name, str):
        raise TypeError(f"name={name!r}: must be a kernel or operator name string")
    for category, pattern in CATEGORIES:
        if pattern.search(name):
            return category
    return OTHER


def time_breakdown(
    fn: Callable[[], Any],
    *,
    warmup: int = 5,
    iters: int = 5,
    device: torch.device | str | None = None,
):
    """Profile ``iters`` calls of ``fn`` after ``warmup``; return ``(by_category, by_kernel)``
    pandas tables.

    Times are per call, in milliseconds: device time of CUDA kernels on a GPU, self CPU time of
    operators on a CPU. ``by_kernel`` lists every kernel (or operator) with its category.
    """
    import pandas as pd
    from torch.profiler import ProfilerActivity, profile

    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    checks.integer("warmup", warmup, minimum=0)
    checks.integer("iters", iters)
    from fp8lab.layers import resolve_device

    device = resolve_device(device) or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize(device)
    # acc_events: one profiling cycle here; without it torch warns that it clears events per cycle
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities, acc_events=True) as prof:
        for _ in range(iters):
            fn()
        if cuda:
            torch.cuda.synchronize(device)
    rows = []
    for event in prof.key_averages():
        total_us = event.self_device_time_total if cuda else event.self_cpu_time_total
        if total_us <= 0 or (not cuda and event.key.startswith("ProfilerStep")):
            continue
        rows.append(
            {
                "kernel": event.key,
                "category": categorize(event.key),
                "calls per step": event.count / iters,
                "ms per step": total_us / 1e3 / iters,
            }
        )
    by_kernel = pd.DataFrame(rows, columns=["kernel", "category", "calls per step", "ms per step"])
    by_kernel = by_kernel.sort_values("ms per step", ascending=False, ignore_index=True)
    by_category = (
        by_kernel.groupby("category")["ms per step"].sum().sort_values(ascending=False).to_frame()
    )
    by_category["share"] = by_category["ms per step"] / by_category["ms per step"].sum()
    return by_category, by_kernel
