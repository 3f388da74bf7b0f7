"""What the tasks measure: step time and peak memory, one collective, the bytes of a shard,
and the kernels of one profiled step (which ran where, and how much communication ran alone).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from fp8lab.parallel.process import Context
from fp8lab.profiling import categorize, union_length
from fp8lab.speedometer import time_callable

COMMUNICATION = re.compile(
    r"nccl|userbuffers|kuserbuffers|allgather|all_gather|reducescatter|reduce_scatter|allreduce|"
    r"all_reduce|sendrecv|c10d|gloo|broadcast",
    re.I,
)
MiB = 2**20


def timed(ctx: Context, step: Callable, args: dict, base: int) -> dict:
    """Median step time (ms), its spread, every timed step (ms) and this rank's peak memory
    above ``base`` (MiB)."""
    timing = time_callable(
        step,
        warmup=int(args.get("warmup", 5)),
        iters=int(args.get("iters", 20)),
        device=ctx.device,
        measure_memory=ctx.cuda,
    )
    result = {"step_ms": timing.median_ms, "spread": timing.spread, "iters": timing.iters}
    result["times_ms"] = [round(float(t), 4) for t in timing.times_ms]
    if ctx.cuda:
        result["peak_mib"] = (timing.peak_memory_bytes - base) / MiB
    return result


def memory_base(ctx: Context) -> int:
    """Bytes allocated on this GPU now (0 on CPUs): what a sub-run's peak is counted above."""
    if not ctx.cuda:
        return 0
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor holds: its FP8 data (and transpose) for TE's quantized tensors."""
    parts = [getattr(tensor, name, None) for name in ("_data", "_transpose")]
    parts = [t for t in parts if isinstance(t, torch.Tensor)]
    if parts:
        return sum(t.numel() * t.element_size() for t in parts)
    return tensor.numel() * tensor.element_size()


def collective(op: str, nbytes: int, group, ctx: Context):
    """A callable that runs one collective of ``nbytes`` (nccl-tests' size convention)."""
    n = dist.get_world_size(group)
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    element = torch.tensor([], dtype=dtype).element_size()
    count = max(n, nbytes // element // n * n)
    if op == "all_reduce":
        buffer = torch.ones(count, dtype=dtype, device=ctx.device)
        return lambda: dist.all_reduce(buffer, group=group)
    if op == "all_gather":  # size = the gathered output
        out = torch.empty(count, dtype=dtype, device=ctx.device)
        chunk = torch.ones(count // n, dtype=dtype, device=ctx.device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(out, chunk, group=group)
    if op == "reduce_scatter":  # size = each rank's input
        inp = torch.ones(count, dtype=dtype, device=ctx.device)
        out = torch.empty(count // n, dtype=dtype, device=ctx.device)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(out, inp, group=group)
    raise ValueError(f"op={op!r}: must be all_reduce, all_gather or reduce_scatter")


def _kernel_events(trace: dict, cuda: bool) -> list[dict]:
    events = []
    for event in trace.get("traceEvents", []):
        if event.get("ph") != "X" or "dur" not in event:
            continue
        category = str(event.get("cat", "")).lower()
        if (cuda and category != "kernel") or (not cuda and category != "cpu_op"):
            continue
        name = str(event.get("name", ""))
        kind = "communication" if COMMUNICATION.search(name) else categorize(name)
        stream = (event.get("args") or {}).get("stream", event.get("tid"))
        events.append(
            {
                "kind": kind,
                "stream": str(stream),
                "start_us": round(float(event["ts"]), 1),
                "dur_us": round(float(event["dur"]), 2),
                "name": name[:80],
            }
        )
    return events


def _profiled_events(ctx: Context, step: Callable, warmup: int) -> list[dict]:
    """The kernels (CPU operators on CPUs) of one step after ``warmup`` steps, from time 0."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        step()
    if ctx.cuda:
        torch.cuda.synchronize()
    activity = ProfilerActivity.CUDA if ctx.cuda else ProfilerActivity.CPU
    with profile(activities=[activity], acc_events=True) as prof:
        step()
        if ctx.cuda:
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = _kernel_events(json.loads(path.read_text()), ctx.cuda)
    if not events:
        raise RuntimeError("the profiler recorded no kernels")
    origin = min(e["start_us"] for e in events)
    for event in events:
        event["start_us"] = round(event["start_us"] - origin, 1)
    return events


def profile_step(ctx: Context, step: Callable, warmup: int = 3) -> dict:
    """Kernels of one step (their kind, stream, start and duration) and how much of the
    communication time ran while nothing else did (exposed)."""
    events = _profiled_events(ctx, step, warmup)
    comm = [
        (e["start_us"], e["start_us"] + e["dur_us"]) for e in events if e["kind"] == "communication"
    ]
    compute = [
        (e["start_us"], e["start_us"] + e["dur_us"]) for e in events if e["kind"] != "communication"
    ]
    comm_us, compute_us = union_length(comm), union_length(compute)
    both = union_length(comm + compute)
    overlapped = comm_us + compute_us - both
    events.sort(key=lambda e: e["start_us"])
    return {
        "events": events[:3000],
        "span_us": max(e["start_us"] + e["dur_us"] for e in events),
        "communication_us": comm_us,
        "compute_us": compute_us,
        "exposed_communication_us": comm_us - overlapped,
        **hiding_window(comm, compute),
    }


def hiding_window(comm: list[tuple], compute: list[tuple]) -> dict:
    """The compute that large collectives can hide under: the union of compute kernels between
    the start of the first and the end of the last collective at least a tenth as long as the
    longest (gradient buckets, not the amax reductions of a few floats). For DDP this is the
    backward after the first bucket is ready; at a larger scale the all-reduce hides while it
    is shorter than this window."""
    if not comm:
        return {"window_us": 0.0, "large_communication_us": 0.0}
    longest = max(end - start for start, end in comm)
    large = [(start, end) for start, end in comm if end - start >= 0.1 * longest]
    first, last = min(s for s, _ in large), max(e for _, e in large)
    inside = [(max(s, first), min(e, last)) for s, e in compute if e > first and s < last]
    return {"window_us": union_length(inside), "large_communication_us": union_length(large)}
