"""Correctness tasks: each layout against one GPU (or one process), same weights, same data.

``ddp_check`` compares the losses of N GPUs under DDP with one GPU at the global batch;
``tp_check`` and ``cp_check`` compare the output and every gradient of the tensor- (and
sequence-) parallel and the context-parallel stacks with the whole stack on one GPU; ``amax``
reads the delayed-scaling scales of each rank with and without amax reduction.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from fp8lab.formats import relative_error
from fp8lab.parallel.layouts import (
    context_parallel,
    ddp,
    dual_chunks,
    sequence_parallel_grads,
    tensor_parallel_model,
    tp_groups,
)
from fp8lab.parallel.measure import memory_base, timed
from fp8lab.parallel.model import (
    autocast_args,
    batch_data,
    build_model,
    config_of,
    fp8_recipe,
    make_optimizer,
    training_step,
)
from fp8lab.parallel.process import Context, only, sub_run
from fp8lab.speedometer import time_callable


def _first_gemm_meta(model):
    """The FP8 state of the first GEMM (QKV of the first layer), in TE and the reference."""
    layer = model.module[0] if hasattr(model, "module") else model[0]
    return layer.self_attention.layernorm_qkv.fp8_meta


def _scales_after_steps(ctx: Context, args: dict, changes: dict, group) -> dict:
    """A few DDP steps on rank-specific data, then every rank's scales of the first GEMM."""
    cfg = config_of(args)
    seq, batch = int(args["seq"]), int(args["batch"])
    model = ddp(ctx, build_model(ctx, cfg), dist.group.WORLD)
    optimizer = make_optimizer(ctx, model.parameters())
    x, target = batch_data(ctx, cfg, seq, batch * ctx.world)
    x, target = x.chunk(ctx.world, 1)[ctx.rank], target.chunk(ctx.world, 1)[ctx.rank]
    fp8 = {"enabled": True, "recipe": fp8_recipe(ctx, **changes), "amax_reduction_group": group}
    step = training_step(ctx, model, optimizer, x, target, fp8)
    for _ in range(int(args.get("steps", 3))):
        step()
    meta = _first_gemm_meta(model)
    scales = {
        "input scale": meta["scaling_fwd"].scale[0].item(),
        "weight scale": meta["scaling_fwd"].scale[1].item(),
        "grad-output scale": meta["scaling_bwd"].scale[0].item(),
    }
    everyone = ctx.gather(scales)
    timing = timed(ctx, step, args, memory_base(ctx))
    return {"scales": everyone, "step_ms": timing["step_ms"], "spread": timing["spread"]}


def task_amax(ctx: Context, args: dict) -> dict:
    """Delayed-scaling scales on each rank after a few DDP steps on different data, with amaxes
    kept per rank (``reduce_amax=False``), reduced over the default group (TE's fallback when
    ``amax_reduction_group`` is None) and over an explicit group; and what the reduction costs."""
    cfg = config_of(args)
    world_group = dist.group.WORLD
    settings = {
        "per rank (reduce_amax=False)": ({"reduce_amax": False}, world_group),
        "default group (amax_reduction_group=None)": ({}, None),
        "amax_reduction_group=world": ({}, world_group),
    }
    rows = []
    for name, (changes, group) in settings.items():

        def run(changes=changes, group=group):
            return _scales_after_steps(ctx, args, changes, group)

        rows.append(sub_run(ctx, {"setting": name}, run))
    # the reduction itself: one all-reduce (MAX) of every amax of the model, per direction
    buffer_floats = cfg.num_layers * 4 * 3

    def reduction():
        buffer = torch.ones(buffer_floats, device=ctx.device)
        timing = time_callable(
            lambda: dist.all_reduce(buffer, op=dist.ReduceOp.MAX),
            warmup=5,
            iters=50,
            device=ctx.device,
        )
        return {"time_us": timing.median_ms * 1e3}

    reduce_row = sub_run(
        ctx, {"setting": "one amax all-reduce", "floats": buffer_floats}, reduction
    )
    return {"rows": rows, "reduction": reduce_row}


def _ddp_losses(ctx: Context, args: dict, precision: str, one: bool, changes: dict) -> dict:
    """Losses of ``steps`` steps on one GPU (``one``) or on every GPU under DDP (averaged)."""
    cfg = config_of(args)
    seq, batch, steps = int(args["seq"]), int(args["batch"]), int(args.get("steps", 6))
    model = build_model(ctx, cfg)
    x, target = batch_data(ctx, cfg, seq, batch * ctx.world)
    if one:
        group = ctx.group((0,))
    else:
        group = dist.group.WORLD
        model = ddp(ctx, model, group)
        x, target = x.chunk(ctx.world, 1)[ctx.rank], target.chunk(ctx.world, 1)[ctx.rank]
    optimizer = make_optimizer(ctx, model.parameters(), lr=float(args.get("lr", 1e-3)))
    fp8 = autocast_args(ctx, precision, group, **changes)
    step = training_step(ctx, model, optimizer, x, target, fp8)
    losses = []
    for _ in range(steps):
        loss = step().detach()
        if not one:
            dist.all_reduce(loss, group=group)
            loss /= ctx.world
        losses.append(loss.item())
    return {"losses": losses}


def task_ddp_check(ctx: Context, args: dict) -> dict:
    """Losses of a few steps on one GPU at the global batch against N GPUs with DDP."""
    cases = [
        ("bf16", "1 GPU", {}),
        ("bf16", f"DDP, {ctx.world} GPUs", {}),
        ("fp8", "1 GPU", {}),
        ("fp8", f"DDP, {ctx.world} GPUs", {}),
        ("fp8", f"DDP, {ctx.world} GPUs, reduce_amax=False", {"reduce_amax": False}),
    ]
    rows = []
    for precision, layout, changes in cases:
        one = layout == "1 GPU"

        def run(precision=precision, one=one, changes=changes):
            return _ddp_losses(ctx, args, precision, one, changes)

        runner = only(ctx, (0,), run) if one else run
        rows.append(sub_run(ctx, {"precision": precision, "layout": layout}, runner))
    return {"rows": rows, "global_batch": int(args["batch"]) * ctx.world}


def shard_parameter(name: str, full: torch.Tensor, shape, rank: int, tp: int, cfg) -> torch.Tensor:
    """This rank's part of a full parameter of the model, as TE's tensor-parallel layers hold it.

    QKV (non-interleaved, ``[A/G + 2, G, D]`` rows) keeps this rank's key/value groups and their
    queries; FC1 (and each half of a gated FC1) keeps a block of rows; the output projection and
    FC2 keep a block of columns; norms and row-parallel biases are whole.
    """
    shape = tuple(shape)
    if tuple(full.shape) == shape:
        return full
    groups, head_dim = cfg.groups, cfg.head_dim
    if "layernorm_qkv" in name:
        per_group = cfg.num_attention_heads // groups + 2
        view = full.reshape(per_group, groups, head_dim, *full.shape[1:])
        return view[:, rank * groups // tp : (rank + 1) * groups // tp].reshape(shape)
    if "fc1" in name:
        halves = 2 if cfg.activation == "swiglu" else 1
        view = full.reshape(halves, -1, *full.shape[1:])
        return view.chunk(tp, dim=1)[rank].reshape(shape)
    if full.dim() == 2 and full.shape[0] == shape[0]:
        return full.chunk(tp, dim=1)[rank]
    raise ValueError(f"{name}: no tensor-parallel layout for {tuple(full.shape)} -> {shape}")


def _run_both(ctx, full, part, x, grad_y, mine, autocasts, steps, after=None):
    """``steps`` forward-backward passes of the whole stack and of the parallel one, on the same
    input (``mine`` cuts this rank's part); returns the last outputs and inputs of both."""
    alone, shared = autocasts
    for _ in range(steps):  # delayed scaling settles its scales
        full.zero_grad(set_to_none=True)
        part.zero_grad(set_to_none=True)
        x_full = x.clone().requires_grad_()
        with ctx.te.autocast(**alone):
            y_full = full(x_full)
        y_full.backward(grad_y)
        x_part = mine(x).clone().requires_grad_()
        with ctx.te.autocast(**shared):
            y_part = part(x_part)
        y_part.backward(mine(grad_y))
        if after is not None:
            after()
    return y_full, y_part, x_full, x_part


def _worst_gradient(pairs) -> tuple[float, str]:
    """The largest relative error of ``(name, gradient, expected)`` and its parameter's name."""
    worst, worst_name = 0.0, ""
    for name, grad, expected in pairs:
        error = relative_error(grad, expected)
        if error >= worst:
            worst, worst_name = error, name
    return worst, worst_name


def _tp_errors(ctx: Context, args: dict, tp_group, precision: str, sp: bool) -> dict:
    """Relative errors of the tensor-parallel stack (sequence-parallel with ``sp``) against the
    whole stack, the worst over ranks, and the parameter with the worst gradient."""
    cfg = config_of(args)
    seq, batch, tp = int(args["seq"]), int(args["batch"]), ctx.world
    full = build_model(ctx, cfg)
    part = tensor_parallel_model(ctx, cfg, tp_group, sequence_parallel=sp, seed=99)
    weights = dict(full.named_parameters())
    with torch.no_grad():
        for name, param in part.named_parameters():
            param.copy_(shard_parameter(name, weights[name], param.shape, ctx.rank, tp, cfg))
    x, grad_y = batch_data(ctx, cfg, seq, batch)
    grad_y = grad_y.to(x.dtype)
    mine = (lambda t: t.chunk(tp, 0)[ctx.rank]) if sp else (lambda t: t)
    autocasts = (
        autocast_args(ctx, precision, None, reduce_amax=False),
        autocast_args(ctx, precision, tp_group),
    )
    after = lambda: sequence_parallel_grads(part, tp_group)  # noqa: E731
    steps = int(args.get("steps", 3))
    y_full, y_part, x_full, x_part = _run_both(
        ctx, full, part, x, grad_y, mine, autocasts, steps, after
    )
    errors = {
        "output": relative_error(y_part, mine(y_full)),
        "input gradient": relative_error(x_part.grad, mine(x_full.grad)),
    }
    worst, worst_name = _worst_gradient(
        (name, p.grad, shard_parameter(name, weights[name].grad, p.shape, ctx.rank, tp, cfg))
        for name, p in part.named_parameters()
    )
    errors["worst parameter gradient"] = worst
    everyone = ctx.gather((errors, worst_name))
    merged = {k: max(e[k] for e, _ in everyone) for k in errors}
    worst = merged["worst parameter gradient"]
    names = [n for e, n in everyone if e["worst parameter gradient"] == worst]
    return {**merged, "worst parameter": names[0]}


def task_tp_check(ctx: Context, args: dict) -> dict:
    """The tensor-parallel model (and with sequence parallelism) against the whole model on one
    GPU, same weights and input: relative error of the output and of every gradient."""
    tp = ctx.world
    tp_group, _ = tp_groups(ctx, tp)
    rows = []
    for precision in args.get("precisions", ("bf16", "fp8")):
        for sp in (True, False):

            def run(precision=precision, sp=sp):
                return _tp_errors(ctx, args, tp_group, precision, sp)

            rows.append(
                sub_run(ctx, {"precision": precision, "sequence_parallel": sp, "tp": tp}, run)
            )
    return {"rows": rows}


def _cp_errors(ctx: Context, args: dict, precision: str) -> dict:
    """Relative errors of the context-parallel stack against the whole sequence on one GPU."""
    cfg = config_of(args)
    seq, batch = int(args["seq"]), int(args["batch"])
    cp, ranks = ctx.world, tuple(range(ctx.world))
    full = build_model(ctx, cfg)
    part = build_model(ctx, cfg)
    context_parallel(ctx, part, dist.group.WORLD, ranks)
    x, grad_y = batch_data(ctx, cfg, seq, batch)
    grad_y = grad_y.to(x.dtype)
    mine = lambda t: dual_chunks(t, ctx.rank, cp)  # noqa: E731
    autocasts = (
        autocast_args(ctx, precision, None, reduce_amax=False),
        autocast_args(ctx, precision, dist.group.WORLD),
    )
    steps = int(args.get("steps", 3))
    y_full, y_part, x_full, x_part = _run_both(ctx, full, part, x, grad_y, mine, autocasts, steps)
    grads = [p.grad for p in part.parameters()]
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat)  # each rank holds the gradient of its tokens: sum them
    summed = torch._utils._unflatten_dense_tensors(flat, grads)
    expected = dict(full.named_parameters())
    worst, worst_name = _worst_gradient(
        (name, grad, expected[name].grad)
        for (name, _), grad in zip(part.named_parameters(), summed, strict=True)
    )
    errors = {
        "output": relative_error(y_part, mine(y_full)),
        "input gradient": relative_error(x_part.grad, mine(x_full.grad)),
        "worst parameter gradient": worst,
    }
    everyone = ctx.gather(errors)
    return {**{k: max(e[k] for e in everyone) for k in errors}, "worst parameter": worst_name}


def task_cp_check(ctx: Context, args: dict) -> dict:
    """Context parallelism against the whole sequence on one GPU: output and gradients."""
    rows = []
    for precision in args.get("precisions", ("bf16", "fp8")):

        def run(precision=precision):
            return _cp_errors(ctx, args, precision)

        rows.append(sub_run(ctx, {"precision": precision, "cp": ctx.world}, run))
    return {"rows": rows}
