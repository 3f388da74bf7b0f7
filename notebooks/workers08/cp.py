"""Context parallelism: TE's ring of key/value chunks, checked and timed at a long S."""
import torch
import torch.distributed as dist

from common import ARGS, OUT, adam, build, data, gather, relative_error
from common import rounds_on_ranks, start, step_fn, write

te, recipe, device = start()
rank, cp = dist.get_rank(), dist.get_world_size()
cp_group, cp_ranks = dist.group.WORLD, list(range(cp))
alone = [dist.new_group([r]) for r in range(cp)][rank]
stream = torch.cuda.Stream()  # TE overlaps each chunk's transfer with attention on it


def context_parallel(model):
    for layer in model:
        layer.set_context_parallel_group(cp_group, cp_ranks, stream, "p2p")
    return model


def my_tokens(t):
    """Rank r's part of a causal sequence: chunks r and 2cp-1-r of 2cp (equal work)."""
    chunks = t.chunk(2 * cp, dim=0)
    return torch.cat([chunks[rank], chunks[2 * cp - 1 - rank]])

fp8 = {"enabled": True, "recipe": recipe.DelayedScaling(),
       "amax_reduction_group": cp_group}
x, grad_y = data(device, 1, seq=ARGS["check_seq"])
check = []
for name, autocast in (("BF16", {"enabled": False}), ("FP8", fp8)):
    whole, part = build(te, device), context_parallel(build(te, device))
    results = []
    for model, xin, gy, group in ((whole, x, grad_y, alone),
                                  (part, my_tokens(x), my_tokens(grad_y), cp_group)):
        xin = xin.detach().clone().requires_grad_()
        local = dict(autocast, amax_reduction_group=group) if autocast["enabled"] \
            else autocast
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            with te.autocast(**local):
                y = model(xin)
            y.backward(gy.to(y.dtype))
        results.append((y, xin.grad, [p.grad for p in model.parameters()]))
    for grad in results[1][2]:
        dist.all_reduce(grad, group=cp_group)
    errors = [relative_error(results[1][0], my_tokens(results[0][0])),
              relative_error(results[1][1], my_tokens(results[0][1]))]
    errors += [relative_error(a, b) for a, b in zip(results[1][2], results[0][2])]
    check.append({"precision": name, "error": max(gather(max(errors)))})

S_LONG = ARGS["S_long"]
xl, tl = data(device, 1, seq=S_LONG)
whole, part = build(te, device), context_parallel(build(te, device))
steps = {}
for label, autocast in (("FP8", fp8), ("BF16", {"enabled": False})):
    local = dict(autocast, amax_reduction_group=alone) if autocast["enabled"] \
        else autocast
    steps[f"one GPU, {label}"] = step_fn(te, whole, adam(te, whole.parameters()),
                                         xl, tl, local)
    steps[f"CP, {label}"] = step_fn(
        te, part, adam(te, part.parameters()), my_tokens(xl), my_tokens(tl), autocast,
        after_backward=lambda: [dist.all_reduce(p.grad, group=cp_group)
                                for p in part.parameters()])
found = rounds_on_ranks(steps, device, rounds=ARGS["rounds"], calls=ARGS["calls"],
                        warmup=ARGS["warmup"])
write(OUT, {"check": check, "rounds": found, "n": cp, "seq": S_LONG})
dist.destroy_process_group()
