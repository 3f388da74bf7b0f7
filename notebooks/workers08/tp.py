"""TE's tensor and sequence parallelism: one GPU's weights, split and checked."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from common import ARGS, CUDA, OUT, DTYPE, adam, build, data, gather, relative_error
from common import rounds_on_ranks, start, step_fn, write

te, recipe, device = start()
rank, tp = dist.get_rank(), dist.get_world_size()
tp_group = dist.group.WORLD  # one tensor-parallel group of every rank
alone = [dist.new_group([r]) for r in range(tp)][rank]


def tp_model(sequence_parallel, seed=99, **more):
    """QKV and FC1 column-parallel, projection and FC2 row-parallel, over tp_group."""
    return build(te, device, seed=seed, tp_group=tp_group, set_parallel_mode=True,
                 sequence_parallel=sequence_parallel, **more)


def my_shard(name, whole, shape):
    """This rank's part of a one-GPU tensor, as TE's tensor-parallel layers hold it."""
    if whole.shape == shape:
        return whole  # norms, row-parallel biases
    if "layernorm_qkv" in name:  # [3 * A * D, ...]: q, k, v blocks of A heads each
        heads = whole.unflatten(0, (3, ARGS["A"], -1))
        return heads.chunk(tp, dim=1)[rank].flatten(0, 2)
    if "fc1" in name:
        return whole.chunk(tp, dim=0)[rank]  # column-parallel: rows
    return whole.chunk(tp, dim=1)[rank]  # row-parallel: columns


def load_from(part, whole_model):
    whole = dict(whole_model.named_parameters())
    with torch.no_grad():
        for name, param in part.named_parameters():
            param.copy_(my_shard(name, whole[name], param.shape))


def sum_sequence_parallel_grads(model):
    for param in model.parameters():
        if getattr(param, "sequence_parallel", False) and param.grad is not None:
            dist.all_reduce(param.grad, group=tp_group)


def passes(model, x, grad_y, autocast, after=None):
    """Three forward+backward passes; the last output, input gradient and grads."""
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        xin = x.detach().clone().requires_grad_()
        with te.autocast(**autocast):
            y = model(xin)
        y.backward(grad_y)
        if after:
            after()
    return y, xin.grad, {n: p.grad for n, p in model.named_parameters()}


x, grad_y = data(device, ARGS["check_batch"])
x[x.shape[0] // 2:, :, 0] += 8 * ARGS["H"] ** 0.5  # the outlier channel
grad_y = grad_y.to(DTYPE)  # a gradient comes in the output's dtype
reference = build(te, device)
fp32 = build(te, device, dtype=torch.float32)  # the yardstick: same weights, in FP32
with torch.no_grad():
    for mine32, theirs in zip(fp32.parameters(), reference.parameters()):
        mine32.copy_(theirs)
ref32 = passes(fp32, x.float(), grad_y.float(), {"enabled": False})


def distances(result, sp, cut_seq):
    """Worst relative error of output, input gradient and parameter gradients."""
    y, gx, grads = result
    mine = (lambda t: t.chunk(tp, 0)[rank]) if cut_seq and sp else (lambda t: t)
    errors = [relative_error(y, mine(ref32[0])), relative_error(gx, mine(ref32[1]))]
    for name, grad in grads.items():
        errors.append(relative_error(grad, my_shard(name, ref32[2][name], grad.shape)))
    return max(errors)


fp8 = {"enabled": True, "recipe": recipe.DelayedScaling(),
       "amax_reduction_group": tp_group}
cases = [("BF16", False, {"enabled": False}), ("BF16", True, {"enabled": False}),
         ("FP8", False, fp8), ("FP8", True, fp8),
         ("FP8, one-rank amax group (control)", True,
          dict(fp8, amax_reduction_group=alone))]
check = []

for name, sp, autocast in cases:
    whole_run = passes(reference, x, grad_y, dict(autocast, amax_reduction_group=alone)
                       if autocast["enabled"] else autocast)
    part = tp_model(sp)
    load_from(part, reference)
    mine = x.chunk(tp, 0)[rank] if sp else x
    my_grad = grad_y.chunk(tp, 0)[rank] if sp else grad_y
    try:
        split_run = passes(part, mine, my_grad, autocast,
                           after=lambda: sum_sequence_parallel_grads(part))
        meta = part[0].self_attention.layernorm_qkv.fp8_meta
        scale = meta["scaling_fwd"].scale[0].item() if autocast["enabled"] else None
        row = {"split": max(gather(distances(split_run, sp, True))),
               "one GPU": distances(whole_run, sp, False), "scales": gather(scale)}
    except Exception as error:  # a refusal is a result too
        row = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
    check.append({"precision": name, "sequence_parallel": sp, **row})
    del part

B, S, H = ARGS["B"], ARGS["S"], ARGS["H"]
xb, tb = data(device, B * tp)
x_dp, t_dp = xb[:, rank * B:(rank + 1) * B], tb[:, rank * B:(rank + 1) * B]
x_sp, t_sp = xb.chunk(tp, 0)[rank], tb.chunk(tp, 0)[rank]  # SP: this rank's tokens
models = {"DDP": DDP(build(te, device), device_ids=[device.index] if CUDA else None),
          "TP": tp_model(False), "TP+SP": tp_model(True)}
ub_error = None
if CUDA:
    try:
        modes = te.UserBufferQuantizationMode
        te.initialize_ub([S * B * tp, H], tp, dtype=DTYPE,
                         quantization_modes=[modes.NONE, modes.FP8])
        models["TP+SP, Userbuffers"] = tp_model(True, ub_tp_comm_overlap=True)
    except Exception as error:  # printed by the notebook, not guessed
        ub_error = f"{type(error).__name__}: {str(error)[:300]}"

steps = {}
for label, autocast in (("FP8", fp8), ("BF16", {"enabled": False})):
    for name, model in models.items():
        if label == "BF16" and name not in ("DDP", "TP+SP"):
            continue
        inputs = {"DDP": (x_dp, t_dp), "TP": (xb, tb)}.get(name, (x_sp, t_sp))
        after = (lambda m=model: sum_sequence_parallel_grads(m)) if "SP" in name \
            else None
        steps[f"{name}, {label}"] = step_fn(te, model, adam(te, model.parameters()),
                                            *inputs, autocast, after_backward=after)
found = rounds_on_ranks(steps, device, rounds=ARGS["rounds"], calls=ARGS["calls"],
                        warmup=ARGS["warmup"])
write(OUT, {"check": check, "rounds": found, "ub_error": ub_error, "n": tp})
dist.destroy_process_group()
