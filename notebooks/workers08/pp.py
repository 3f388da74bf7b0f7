"""A two-stage pipeline of TE layers with torch.distributed.pipelining."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

from common import ARGS, OUT, adam, build, data, gather, peak_mib, relative_error
from common import rounds_on_ranks, start, write

te, recipe, device = start()
rank, p = dist.get_rank(), dist.get_world_size()  # one stage per rank
singles = [dist.new_group([r]) for r in range(p)]
stage_group = singles[rank]  # a stage's amax group: its own ranks, never other stages
pp_group = dist.new_group(list(range(p)))  # the pipeline's sends, apart from the rest


class Stage(torch.nn.Module):
    """Some layers under their own autocast; [B, S, H] in and out."""

    def __init__(self, layers, autocast):
        super().__init__()
        self.layers, self.autocast = layers, autocast

    def forward(self, x):
        with te.autocast(**self.autocast):
            y = self.layers(x.transpose(0, 1).contiguous())  # [S, b, H]
        return y.transpose(0, 1).contiguous()  # [b, S, H]


def stages(autocast, plain_last=False):
    """Each stage's layers, sliced from one stack built from the common seed."""
    whole, per = build(te, device), ARGS["L"] // p
    return [Stage(whole[i * per:(i + 1) * per],
                  {"enabled": False} if plain_last and i == p - 1 else autocast)
            for i in range(p)]


def mse(out, target):
    return F.mse_loss(out.float(), target)

x, target = data(device, ARGS["global_batch"])
x, target = x.transpose(0, 1).contiguous(), target.transpose(0, 1).contiguous()


def pipeline(stage_module, m):
    shape = (x.shape[0] // m, *x.shape[1:])  # one micro-batch, [b, S, H]
    example = torch.empty(shape, device=device, dtype=x.dtype)
    stage = PipelineStage(  # shapes given: no trial forward through TE's layers
        stage_module, rank, p, device, group=pp_group,
        input_args=example.requires_grad_(rank > 0),
        output_args=example.detach().requires_grad_())
    schedule = ScheduleGPipe(stage, n_microbatches=m, loss_fn=mse)
    opt = adam(te, stage_module.parameters())

    def step():
        losses = []
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=target, losses=losses)  # one stage per rank: last
        opt.step()
        opt.zero_grad(set_to_none=True)
        return [loss.item() for loss in losses]
    return step


def one_gpu(all_stages, m):
    opt = adam(te, [q for s in all_stages for q in s.parameters()])

    def step():
        outs = []
        for xs, ts in zip(x.chunk(m), target.chunk(m)):
            h = xs
            for s in all_stages:
                h = s(h)
            outs.append(mse(h, ts))
        for loss in outs:
            loss.backward()
        for q in (q for s in all_stages for q in s.parameters()):
            q.grad /= m
        opt.step()
        opt.zero_grad(set_to_none=True)
        return [loss.item() for loss in outs]
    return step

M = ARGS["M"]
fp8 = {"enabled": True, "recipe": recipe.DelayedScaling(),
       "amax_reduction_group": stage_group}


def scales(stage_module):
    """The first GEMM's input and grad-output scales of a stage (None without FP8)."""
    meta = stage_module.layers[0].self_attention.layernorm_qkv.fp8_meta
    if "scaling_fwd" not in meta:
        return None
    return [meta["scaling_fwd"].scale[0].item(), meta["scaling_bwd"].scale[0].item()]


check = {}
if rank == 0:
    ref = stages(dict(fp8, amax_reduction_group=stage_group))
    step = one_gpu(ref, M)
    check["one GPU"] = [step() for _ in range(ARGS["check_steps"])]
    check["one GPU scales"] = [scales(s) for s in ref]
    bf = stages({"enabled": False})
    step = one_gpu(bf, M)
    check["one GPU, BF16"] = [step() for _ in range(ARGS["check_steps"])]
for name, plain_last in (("pipeline", False), ("pipeline, last stage without autocast "
                                              "(control)", True)):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    mine = stages(fp8, plain_last=plain_last)[rank]
    step = pipeline(mine, M)
    check[name] = [gather(step())[-1] for _ in range(ARGS["check_steps"])]
    check[name + " scales"] = gather(scales(mine))
    check[name + " peak MiB"] = gather(peak_mib(device))


def stage_alone(stage_module, m):
    """This stage's forward and backward of m micro-batches, no communication."""
    opt = adam(te, stage_module.parameters())

    def step():
        for xs in x.chunk(m):
            stage_module(xs).float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


steps = {}
for label, autocast in (("FP8", fp8), ("BF16", {"enabled": False})):
    mine = stages(autocast)[rank]
    for m in ARGS["Ms"] if label == "FP8" else ARGS["Ms"][-1:]:
        steps[f"pipeline M={m}, {label}"] = pipeline(mine, m)
        steps[f"stage alone M={m}, {label}"] = stage_alone(mine, m)
found = rounds_on_ranks(steps, device, rounds=ARGS["rounds"], calls=ARGS["calls"],
                        warmup=ARGS["warmup"])
write(OUT, {"check": check, "rounds": found, "p": p, "M": M})
dist.destroy_process_group()
