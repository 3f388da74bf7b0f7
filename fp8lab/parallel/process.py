"""One worker process: its ranks, device and process groups, and how a sub-run's result (or
error) from every rank becomes one row.

:func:`setup` reads torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, picks this process's GPU
before anything starts a CUDA context, imports TE (or the CPU reference) before anything else
loads cuDNN, then starts NCCL (or gloo on CPUs). Every task gets the resulting :class:`Context`.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from fp8lab.environment import import_te


@dataclasses.dataclass
class Context:
    """What every task gets: ranks, device, TE (or the CPU reference) and helper groups."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    cuda: bool
    te: object
    recipes: object
    cpu_group: object
    out: Path
    groups: dict = dataclasses.field(default_factory=dict)

    def barrier(self) -> None:
        dist.barrier(group=self.cpu_group)

    def gather(self, value) -> list:
        """Every rank's ``value`` (any picklable object), on every rank."""
        values = [None] * self.world
        dist.all_gather_object(values, value, group=self.cpu_group)
        return values

    def group(self, ranks) -> object:
        """The process group of ``ranks``. Creating one is collective: every rank must ask for
        a new group, in the same order (the groups of the first n ranks exist from the start,
        so code that runs on some ranks only may ask for those)."""
        ranks = tuple(ranks)
        if ranks == tuple(range(self.world)):
            return dist.group.WORLD
        if ranks not in self.groups:
            self.groups[ranks] = dist.new_group(list(ranks))
        return self.groups[ranks]

    def sizes(self) -> list[int]:
        """1, 2, 4, ... up to the world size, and the world size itself."""
        sizes = [1]
        while sizes[-1] * 2 <= self.world:
            sizes.append(sizes[-1] * 2)
        return sorted(set(sizes) | {self.world})


def setup(out: Path) -> Context:
    """Start this process's share of the job (see the module's docstring)."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        if name not in os.environ:
            raise ValueError(
                f"main: {name} is not set; run this module under torchrun "
                "(python -m torch.distributed.run ... -m fp8lab.parallel.worker)"
            )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available() and os.environ.get("FP8LAB_DIST_BACKEND", "") != "gloo"
    if cuda:  # this process's GPU first, so that nothing starts a context on GPU 0
        torch.cuda.set_device(local_rank)
    te, recipes = import_te()  # TE next: it must load cuDNN before anything else does
    if cuda:
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device, timeout=timedelta(minutes=20))
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(minutes=20))
    cpu_group = dist.new_group(backend="gloo", timeout=timedelta(minutes=30)) if cuda else None
    (out / f"pid.{rank}").write_text(str(os.getpid()))
    ctx = Context(rank, world, local_rank, device, cuda, te, recipes, cpu_group, out)
    for n in ctx.sizes():  # the groups of the first n ranks, created by every rank alike
        ctx.group(range(n))
    return ctx


def teardown(ctx: Context) -> None:
    """Wait for every rank, drop this process's id file, end the process groups."""
    ctx.barrier()
    (ctx.out / f"pid.{ctx.rank}").unlink(missing_ok=True)
    dist.destroy_process_group()


def write_json(path: Path, payload: dict) -> None:
    """Write ``payload`` at ``path`` in one step (a reader never sees half a file)."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(payload, default=_jsonable))
    temporary.replace(path)


def _jsonable(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def clean(ctx: Context) -> None:
    """Free what a sub-run left: Python objects, cached GPU memory, FP8 global state."""
    gc.collect()
    if ctx.cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        quantization = getattr(ctx.te, "quantization", None)
        manager = getattr(quantization, "FP8GlobalStateManager", None)
        if manager is not None:
            manager.reset()
    else:
        state = getattr(getattr(ctx.te, "quantization", None), "STATE", None)
        if state is not None:
            state.__init__()


def error_text(error: BaseException) -> str:
    """The exception's type and the first line of its message, for a result row."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0][:400] if lines else ''}"


def sub_run(ctx: Context, row: dict, function: Callable[[], dict | None]) -> dict:
    """Run ``function`` on every rank and merge what each rank returns into ``row``.

    Numbers that differ by rank keep the largest (the slowest rank sets the step time, the
    fullest GPU the memory) and, for memory, every rank's value; an exception on any rank
    becomes the row's ``error``.
    """
    error = None
    result: dict = {}
    try:
        result = function() or {}
    except Exception as caught:  # a failed sub-run is a row, not a failed chapter
        error = error_text(caught)
        if ctx.rank == 0:
            traceback.print_exc()
    finally:
        clean(ctx)
    everything = ctx.gather((error, result))
    errors = [e for e, _ in everything if e]
    merged = dict(row)
    if errors:
        merged["error"] = errors[0]
        return merged
    merged.update(everything[0][1])
    for key in ("step_ms", "peak_mib"):
        values = [r.get(key) for _, r in everything if r.get(key) is not None]
        if values:
            merged[key] = max(values)
            if key == "peak_mib":
                merged["peak_mib_per_rank"] = values
    return merged


def only(ctx: Context, ranks, function: Callable[[], dict | None]) -> Callable[[], dict | None]:
    """Run ``function`` on ``ranks`` only; the other ranks wait (for one-GPU baselines)."""

    def run():
        return function() if ctx.rank in ranks else None

    return run
