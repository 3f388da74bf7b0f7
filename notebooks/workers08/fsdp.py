"""FSDP2 with FP8 weights: meta-device init, the check against one GPU, the gathers."""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from common import ARGS, CUDA, OUT, adam, build, data, gather, peak_mib
from common import rounds_on_ranks, start, step_fn, write

te, recipe, device = start()
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh(device.type, (world,))
alone = [dist.new_group([r]) for r in range(world)][rank]
fp8 = {"enabled": True, "recipe": recipe.DelayedScaling(),
       "amax_reduction_group": dist.group.WORLD}


def fp8_weights(on):
    """A stack whose weights are FP8 tensors (TE casts them once, at creation)."""
    with te.quantized_model_init(enabled=True, recipe=fp8["recipe"]):
        return build(te, on)


def shard(model):
    """fully_shard each layer, then the stack; keep TE's attributes of weights."""
    kept = {n: {k: v for k, v in vars(p).items() if not k.startswith("_")}
            for n, p in model.named_parameters()}
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for name, param in model.named_parameters():
        for key, value in kept[name].items():
            setattr(param, key, value)
    return model

on_meta = CUDA
model = shard(fp8_weights("meta" if on_meta else device))
for module in model.modules() if on_meta else ():
    if module is not model and hasattr(module, "reset_parameters"):
        module.reset_parameters()  # this rank's shard only
shards = {}
for name, param in model.named_parameters():
    local = param.to_local()
    shards[type(local).__name__] = shards.get(type(local).__name__, 0) + local.numel()


def refresh(model):
    """After the optimizer wrote FP8 weights, drop their stale transposes (ch. 06)."""
    for param in model.parameters():
        local = param.to_local() if hasattr(param, "to_local") else param
        if hasattr(local, "_reset_caches"):
            local._reset_caches()  # private TE API

B = ARGS["B"]
x, target = data(device, B * world)
x_mine, target_mine = x[:, rank * B:(rank + 1) * B], target[:, rank * B:(rank + 1) * B]
makers = {"BF16": lambda on: build(te, on), "FP8": lambda on: build(te, on),
          "FP8 weights": fp8_weights}
check, peaks = {}, {}
for name, make in makers.items():
    autocast = {"enabled": False} if name == "BF16" else fp8
    runs = [("FSDP2", True)] + ([("one GPU", True)] if rank == 0 else [])
    if name == "FP8 weights" and rank == 0:
        runs.append(("one GPU, no refresh (control)", False))
    for where, fresh in runs:
        if CUDA:
            torch.cuda.reset_peak_memory_stats()
        net = shard(make(device)) if where == "FSDP2" else make(device)
        local = dict(autocast, amax_reduction_group=alone) if where != "FSDP2" \
            else autocast
        xs, ts = (x_mine, target_mine) if where == "FSDP2" else (x, target)
        step = step_fn(te, net, adam(te, net.parameters()), xs, ts, local,
                       after_step=(lambda net=net: refresh(net)) if fresh else None)
        losses = [step().item() for _ in range(ARGS["check_steps"])]
        if where == "FSDP2":
            losses = [sum(v) / world for v in zip(*gather(losses))]
            peaks[name] = max(gather(peak_mib(device)))
        check[name, where] = losses
        del net, step

variants = {name: shard(make(device)) for name, make in makers.items()}
steps = {}
for name, net in variants.items():
    autocast = {"enabled": False} if name == "BF16" else fp8
    steps[name] = step_fn(te, net, adam(te, net.parameters()), x_mine, target_mine,
                          autocast, after_step=lambda net=net: refresh(net))
gathers = {}
for name, step in steps.items():
    step()
    with torch.profiler.profile() as prof:
        step()
    kernels = [e for e in prof.events() if "allgather" in e.name.lower()]
    gathers[name] = {"kernels": len(kernels),
                     "us": sum(e.device_time_total for e in kernels)}
found = rounds_on_ranks(steps, device, rounds=ARGS["rounds"], calls=ARGS["calls"],
                        warmup=ARGS["warmup"])
write(OUT, {"check": [[*k, v] for k, v in check.items()], "peaks": peaks,
            "shards": shards, "gathers": gathers, "rounds": found})
dist.destroy_process_group()
