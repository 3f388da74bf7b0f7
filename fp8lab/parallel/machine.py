"""Where a job ran: the GPU, its count, the software versions (cuDNN included) and the backend.

Rank 0 writes this record as ``machine.json``; :func:`fp8lab.distributed.save` stamps a result
file with it, so committed results say which GPU, TE, NCCL and cuDNN made them.
"""

from __future__ import annotations

import contextlib

import torch

from fp8lab import environment
from fp8lab.parallel.process import Context


def te_version(ctx: Context) -> str | None:
    """TE's version where TE itself runs; None for the CPU reference."""
    if not ctx.cuda:
        return None
    import transformer_engine

    return transformer_engine.__version__


def machine_record(ctx: Context) -> dict:
    """The machine, as ``machine.json`` holds it (GPU fields are None on CPU processes)."""
    cudnn = environment.detect().cudnn if ctx.cuda else None
    record = {
        "gpu_name": torch.cuda.get_device_name() if ctx.cuda else None,
        "gpu_count": ctx.world if ctx.cuda else 0,
        "processes": ctx.world,
        "compute_capability": ".".join(map(str, torch.cuda.get_device_capability()))
        if ctx.cuda
        else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda if ctx.cuda else None,
        "transformer_engine": te_version(ctx),
        "te": te_version(ctx) or getattr(ctx.te, "__version__", "CPU reference"),
        "cudnn": cudnn.te_loaded if cudnn else None,
        "cudnn_torch": cudnn.torch_built if cudnn else None,
        "backend": "nccl" if ctx.cuda else "gloo",
        "preset": environment.preset(),
    }
    if ctx.cuda:
        with contextlib.suppress(Exception):
            record["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return record
