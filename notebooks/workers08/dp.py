"""Data parallelism in FP8: the amax group, DDP against one GPU, FSDP2, rounds."""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from common import ARGS, CUDA, OUT, adam, build, data, gather, rounds_on_ranks
from common import start, step_fn, write

te, recipe, device = start()
rank, world = dist.get_rank(), dist.get_world_size()
singles = [dist.new_group([r]) for r in range(world)]  # every rank creates every group
alone = singles[rank]  # a group of this rank only: TE reduces nothing over it
fp8 = {"enabled": True, "recipe": recipe.DelayedScaling(),
       "amax_reduction_group": dist.group.WORLD}  # every replica of the weights
fp8_alone = dict(fp8, amax_reduction_group=alone)
bf16 = {"enabled": False}
B = ARGS["B"]
x, target = data(device, B * world)  # one global batch [S, N*B, H] ...
mine = slice(rank * B, (rank + 1) * B)
x_mine, target_mine = x[:, mine], target[:, mine]  # ... of which this rank trains B


def ddp(model):
    """DDP over every rank; 200 MB buckets, gradients living in them (no copies)."""
    ids = [device.index] if CUDA else None
    return DDP(model, device_ids=ids, bucket_cap_mb=200, gradient_as_bucket_view=True)


def first_scales(model):
    """The delayed-scaling scales of the first GEMM (layer 1's QKV) on this rank."""
    layer = model.module[0] if hasattr(model, "module") else model[0]
    meta = layer.self_attention.layernorm_qkv.fp8_meta
    return {"input": meta["scaling_fwd"].scale[0].item(),
            "grad-output": meta["scaling_bwd"].scale[0].item()}


def train(model, xs, ts, autocast):
    """ARGS['check_steps'] steps; the losses, and this rank's first-GEMM scales."""
    step = step_fn(te, model, adam(te, model.parameters()), xs, ts, autocast)
    losses = [step().item() for _ in range(ARGS["check_steps"])]
    return losses, first_scales(model) if autocast["enabled"] else None

check = {}
for name, on_one, on_all in (("BF16", bf16, bf16), ("FP8", fp8_alone, fp8),
                             ("FP8, one-rank amax groups", None, fp8_alone)):
    if on_one is not None and rank == 0:
        check[name, "one GPU"] = train(build(te, device), x, target, on_one)
    losses, scales = train(ddp(build(te, device)), x_mine, target_mine, on_all)
    everyone = gather((losses, scales))
    mean = [sum(v) / world for v in zip(*[e[0] for e in everyone])]
    check[name, "DDP"] = (mean, [e[1] for e in everyone])

mesh = init_device_mesh(device.type, (world,))


def fsdp2(reshard):
    """FSDP2 over every rank: each layer a unit, then the stack. reshard=False keeps
    the gathered weights from forward to backward (one gather per step, ZeRO-2-like)."""
    model = build(te, device)
    kept = {n: dict(vars(p)) for n, p in model.named_parameters()}  # TE's attributes
    for layer in model:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    for name, param in model.named_parameters():  # FSDP2 made new parameters
        for key, value in kept[name].items():
            setattr(param, key, value)
    return model

plain = build(te, device)
layouts = {"DDP": ddp(build(te, device)), "FSDP2, no reshard": fsdp2(False),
           "FSDP2": fsdp2(True)}
opts = {name: adam(te, m.parameters())
        for name, m in [("one", plain), *layouts.items()]}
steps = {}
for label, autocast, autocast_one in (("FP8", fp8, fp8_alone), ("BF16", bf16, bf16)):
    one = step_fn(te, plain, opts["one"], x_mine, target_mine, autocast_one)
    steps[f"one GPU alone, {label}"] = lambda one=one: one() if rank == 0 else None
    steps[f"one GPU per rank, {label}"] = one
    for name, model in layouts.items():
        steps[f"{name}, {label}"] = step_fn(
            te, model, opts[name], x_mine, target_mine, autocast)


def forward(backward):
    """One GPU's forward (and backward): the window gradients can travel in."""
    with te.autocast(**fp8_alone):
        out = plain(x_mine)
    if backward:
        out.float().square().mean().backward()
        plain.zero_grad(set_to_none=True)


steps["one GPU forward, FP8"] = lambda: forward(False)
steps["one GPU forward+backward, FP8"] = lambda: forward(True)
found = rounds_on_ranks(steps, device, rounds=ARGS["rounds"], calls=ARGS["calls"],
                        warmup=ARGS["warmup"])
grad_bytes = sum(p.numel() * p.element_size() for p in plain.parameters())
write(OUT, {"check": [[*k, *v] for k, v in check.items()], "rounds": found,
            "grad_bytes": grad_bytes, "n": world})
dist.destroy_process_group()
