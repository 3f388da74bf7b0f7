"""One torchrun job of :mod:`tools.layout_peaks`: each layout's own peak memory per GPU.

Every rank builds one layout at a time (the stack of chapter 08: ``L`` te.TransformerLayers,
MSE loss, TE's FusedAdam with FP32 master weights), holds only its own part of the batch,
trains ``steps`` steps and records the most memory its tensors held above what was allocated
before the layout was built; then frees it. Rank 0 writes one row per layout and precision
with the fullest rank's peak. Arguments: the job as JSON, then the output path.
"""

import datetime
import gc
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import fp8lab


def main() -> None:
    """The job: run by torchrun as a script (importing this module runs nothing)."""
    JOB, OUT = json.loads(sys.argv[1]), sys.argv[2]
    CUDA = torch.cuda.is_available()
    local = int(os.environ["LOCAL_RANK"])
    if CUDA:
        torch.cuda.set_device(local)
    te, recipe = fp8lab.import_te()
    device = torch.device("cuda", local) if CUDA else torch.device("cpu")
    dist.init_process_group(
        "nccl" if CUDA else "gloo",
        device_id=device if CUDA else None,
        timeout=datetime.timedelta(seconds=300),
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    H, F_, A, L, S, B = (JOB[k] for k in ("H", "F", "A", "L", "S", "B"))
    DTYPE = torch.bfloat16 if CUDA else torch.float32
    PAIR = 2  # the TP group of TP2 x DP2
    pairs = [dist.new_group(list(range(r, r + PAIR))) for r in range(0, world - 1, PAIR)]
    across = [dist.new_group(list(range(t, world, PAIR))) for t in range(PAIR)]
    everyone = dist.new_group(list(range(world)))

    def stack(**parallel):
        torch.manual_seed(1234)
        return torch.nn.Sequential(
            *[
                te.TransformerLayer(
                    H,
                    F_,
                    A,
                    layer_number=i + 1,
                    hidden_dropout=0.0,
                    attention_dropout=0.0,
                    self_attn_mask_type="causal",
                    fuse_qkv_params=True,
                    params_dtype=DTYPE,
                    device=device,
                    **parallel,
                )
                for i in range(L)
            ]
        )

    def fsdp2():
        model = stack()
        kept = {n: dict(vars(p)) for n, p in model.named_parameters()}  # TE's attributes
        mesh = init_device_mesh(device.type, (world,))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        for name, param in model.named_parameters():
            for key, value in kept[name].items():
                setattr(param, key, value)
        return model

    def build(layout):
        """The model of ``layout``, this rank's input shape [S, b, H] and its SP group."""
        ids = [device.index] if CUDA else None
        if layout == "DDP":
            return (
                DDP(stack(), device_ids=ids, bucket_cap_mb=200, gradient_as_bucket_view=True),
                (S, B),
                None,
            )
        if layout == "FSDP2":
            return fsdp2(), (S, B), None
        if layout == "TP+SP":  # the group takes N*B sequences, each rank S/N of their tokens
            return (
                stack(tp_group=everyone, set_parallel_mode=True, sequence_parallel=True),
                (S // world, world * B),
                everyone,
            )
        if layout == "TP2 x DP2 (SP)":
            pair = pairs[rank // PAIR]
            model = stack(tp_group=pair, set_parallel_mode=True, sequence_parallel=True)
            return (
                DDP(model, process_group=across[rank % PAIR], device_ids=ids),
                (S // PAIR, PAIR * B),
                pair,
            )
        raise ValueError(f"layout={layout!r}: unknown")

    def peak_above(layout, precision):
        gc.collect()
        if CUDA:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if CUDA else 0
        model, (seq, batch), sp_group = build(layout)
        x = torch.randn(seq, batch, H, device=device, dtype=DTYPE)
        target = torch.randn(seq, batch, H, device=device)
        opt = te.optimizers.FusedAdam(
            model.parameters(), lr=1e-4, master_weights=True, master_weight_dtype=torch.float32
        )
        autocast = {
            "enabled": precision == "fp8",
            "recipe": recipe.DelayedScaling(),
            "amax_reduction_group": everyone,
        }
        for _ in range(JOB["steps"]):
            with te.autocast(**autocast):
                out = model(x)
            F.mse_loss(out.float(), target).backward()
            if sp_group is not None:  # norm weights saw this rank's tokens only
                for param in model.parameters():
                    if getattr(param, "sequence_parallel", False) and param.grad is not None:
                        dist.all_reduce(param.grad, group=sp_group)
            opt.step()
            opt.zero_grad(set_to_none=True)
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20 if CUDA else float("nan")
        del model, opt, x, target, out
        found = [None] * world
        dist.all_gather_object(found, peak)
        return max(found), (seq, batch)

    rows = []
    for layout in JOB["layouts"]:
        for precision in JOB["precisions"]:
            peak, (seq, batch) = peak_above(layout, precision)
            rows.append(
                {
                    "layout": layout,
                    "precision": precision,
                    "gpus": world,
                    "layers": L,
                    "seq": S,
                    "batch": B,
                    "seq_per_gpu": seq,
                    "batch_per_group": batch,
                    "peak_MiB": peak,
                }
            )
    if rank == 0:
        with open(OUT, "w") as handle:
            json.dump({"rows": rows}, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
