"""One torchrun job of :mod:`tools.layout_peaks`: each layout's own peak memory per GPU.

Every rank builds one layout at a time (the stack of chapter 08: ``L`` te.TransformerLayers,
MSE loss, TE's FusedAdam with FP32 master weights), holds only its own part of the batch,
trains ``steps`` steps and records the most memory its tensors held above what was allocated
before the layout was built, over all steps and step by step (a one-time allocation shows in
the step that made it); then frees it. Rank 0 writes one row per layout and precision
with the fullest rank's peak. Arguments: the job as JSON, then the output path. Importing this
module runs nothing; torchrun runs it as a script.
"""

import datetime
import gc
import json
import os
import sys
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import fp8lab

PAIR = 2  # the TP group of TP2 x DP2


def start(sizes: dict) -> SimpleNamespace:
    """This rank's GPU, TE, the process group and every group the layouts use."""
    cuda = torch.cuda.is_available()
    local = int(os.environ["LOCAL_RANK"])
    if cuda:
        torch.cuda.set_device(local)
    te, recipe = fp8lab.import_te()  # TE on a GPU, the CPU reference elsewhere
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        device_id=device if cuda else None,
        timeout=datetime.timedelta(seconds=300),
    )
    world = dist.get_world_size()  # every process creates every group, in the same order
    pairs = [dist.new_group(list(range(r, r + PAIR))) for r in range(0, world - 1, PAIR)]
    across = [dist.new_group(list(range(t, world, PAIR))) for t in range(PAIR)]
    return SimpleNamespace(
        **sizes,
        cuda=cuda,
        te=te,
        recipe=recipe,
        device=device,
        rank=dist.get_rank(),
        world=world,
        pairs=pairs,
        across=across,
        everyone=dist.new_group(list(range(world))),
        dtype=torch.bfloat16 if cuda else torch.float32,
    )


def stack(job, **parallel):
    """The L layers of chapter 08, the same weights for every layout."""
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        *[
            job.te.TransformerLayer(
                job.H,
                job.F,
                job.A,
                layer_number=i + 1,
                hidden_dropout=0.0,
                attention_dropout=0.0,
                self_attn_mask_type="causal",
                fuse_qkv_params=True,
                params_dtype=job.dtype,
                device=job.device,
                **parallel,
            )
            for i in range(job.L)
        ]
    )


def fsdp2(job):
    """FSDP2 over every rank, each layer a unit, TE's parameter attributes kept."""
    model = stack(job)
    kept = {n: dict(vars(p)) for n, p in model.named_parameters()}
    mesh = init_device_mesh(job.device.type, (job.world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for name, param in model.named_parameters():
        for key, value in kept[name].items():
            setattr(param, key, value)
    return model


def build(job, layout: str):
    """``(model, this rank's input [S, b, H] shape as (seq, batch), its SP group or None)``."""
    ids = [job.device.index] if job.cuda else None
    S, B, N = job.S, job.B, job.world
    if layout == "DDP":
        ddp = DDP(stack(job), device_ids=ids, bucket_cap_mb=200, gradient_as_bucket_view=True)
        return ddp, (S, B), None
    if layout == "FSDP2":
        return fsdp2(job), (S, B), None
    if layout == "TP+SP":  # the group takes N*B sequences, each rank S/N of their tokens
        tp = stack(job, tp_group=job.everyone, set_parallel_mode=True, sequence_parallel=True)
        return tp, (S // N, N * B), job.everyone
    if layout == "TP2 x DP2 (SP)":
        pair = job.pairs[job.rank // PAIR]
        tp = stack(job, tp_group=pair, set_parallel_mode=True, sequence_parallel=True)
        return (
            DDP(tp, process_group=job.across[job.rank % PAIR], device_ids=ids),
            (S // PAIR, PAIR * B),
            pair,
        )
    raise ValueError(f"layout={layout!r}: unknown")


def release_stashed(job) -> None:
    """Have NCCL let go of what the last layout's collectives still hold, before a baseline.

    ProcessGroupNCCL keeps an asynchronous collective's tensors (DDP's bucket all-reduces) until
    the next collective on the same group after its watchdog, which polls every 100 ms, has seen
    the collective finish (ProcessGroupNCCL.cpp: ``collective()``, ``Watchdog::runLoop``,
    ``workEnqueue``). Without this a layout's baseline can count the previous layout's gradient
    buckets, which are then freed during its steps and lower its peak above the baseline by as
    much. A wait longer than the watchdog's poll, then a barrier on every group of this rank.
    """
    if job.cuda:
        torch.cuda.synchronize()
    time.sleep(0.3)
    mine = [None, job.everyone, job.across[job.rank % PAIR]]
    if job.rank // PAIR < len(job.pairs):
        mine.append(job.pairs[job.rank // PAIR])
    for group in mine:
        dist.barrier(group=group)


def peak_above(job, layout: str, precision: str):
    """The fullest rank's peak (MiB) above what it held before the layout, the same for each
    step (the first holds what happens once), and the shape."""
    gc.collect()
    release_stashed(job)
    if job.cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if job.cuda else 0
    model, (seq, batch), sp_group = build(job, layout)
    x = torch.randn(seq, batch, job.H, device=job.device, dtype=job.dtype)
    target = torch.randn(seq, batch, job.H, device=job.device)
    opt = job.te.optimizers.FusedAdam(
        model.parameters(), lr=1e-4, master_weights=True, master_weight_dtype=torch.float32
    )
    autocast = {
        "enabled": precision == "fp8",
        "recipe": job.recipe.DelayedScaling(),
        "amax_reduction_group": job.everyone,
    }
    steps = []
    for _ in range(job.steps):
        with job.te.autocast(**autocast):
            out = model(x)
        F.mse_loss(out.float(), target).backward()
        for param in model.parameters() if sp_group is not None else ():
            if getattr(param, "sequence_parallel", False) and param.grad is not None:
                dist.all_reduce(param.grad, group=sp_group)  # a norm saw this rank's tokens
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps.append(step_peak(job, before))
    del model, opt, x, target, out
    found = [None] * job.world
    dist.all_gather_object(found, steps)
    per_step = [max(rank[i] for rank in found) for i in range(job.steps)]
    return max(per_step), per_step, (seq, batch)


def step_peak(job, before: int) -> float:
    """This rank's peak (MiB) above ``before`` since the last call, then a fresh count: so
    that a one-time allocation shows in the step that made it (NaN on CPUs)."""
    if not job.cuda:
        return float("nan")
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - before) / 2**20
    torch.cuda.reset_peak_memory_stats()
    return peak


def main() -> None:
    spec, out = json.loads(sys.argv[1]), sys.argv[2]
    job = start({k: spec[k] for k in ("H", "F", "A", "L", "S", "B", "steps")})
    rows = []
    for layout in spec["layouts"]:
        for precision in spec["precisions"]:
            peak, per_step, (seq, batch) = peak_above(job, layout, precision)
            rows.append(
                {
                    "layout": layout,
                    "precision": precision,
                    "gpus": job.world,
                    "layers": job.L,
                    "seq": job.S,
                    "batch": job.B,
                    "seq_per_gpu": seq,
                    "batch_per_group": batch,
                    "peak_MiB": peak,
                    **{f"step{i + 1}_MiB": v for i, v in enumerate(per_step)},
                }
            )
    if job.rank == 0:
        with open(out, "w") as handle:
            json.dump({"rows": rows}, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
