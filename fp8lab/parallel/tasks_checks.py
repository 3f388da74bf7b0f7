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
    fsdp_model,
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

    calls = int(args.get("calls", 100))

    def reduction():  # many calls between two events: the GPU's latency, not the host's
        buffer = torch.ones(buffer_floats, device=ctx.device)

        def burst():
            for _ in range(calls):
                dist.all_reduce(buffer, op=dist.ReduceOp.MAX)

        timing = time_callable(burst, warmup=3, iters=20, device=ctx.device)
        return {"time_us": timing.median_ms * 1e3 / calls, "calls": calls}

    reduce_row = sub_run(
        ctx, {"setting": "one amax all-reduce", "floats": buffer_floats}, reduction
    )
    return {"rows": rows, "reduction": reduce_row}


def _wrapped_model(ctx: Context, cfg, precision: str, layout: str):
    """The model of one ``ddp_check`` case: whole on one GPU, DDP, or FSDP2 sharding the same
    whole model (FP8 weights under ``te.quantized_model_init`` for ``fp8_weights``)."""
    if layout.startswith("FSDP2"):
        return fsdp_model(ctx, cfg, precision, meta=False)
    if precision == "fp8_weights":
        with ctx.te.quantized_model_init(enabled=True, recipe=fp8_recipe(ctx)):
            model = build_model(ctx, cfg)
    else:
        model = build_model(ctx, cfg)
    return model if layout == "1 GPU" else ddp(ctx, model, dist.group.WORLD)


def _ddp_losses(ctx: Context, args: dict, precision: str, layout: str, changes: dict) -> dict:
    """Losses of ``steps`` steps on one GPU or on every GPU under DDP or FSDP2 (averaged)."""
    cfg = config_of(args)
    seq, batch, steps = int(args["seq"]), int(args["batch"]), int(args.get("steps", 6))
    one = layout == "1 GPU"
    model = _wrapped_model(ctx, cfg, precision, layout)
    x, target = batch_data(ctx, cfg, seq, batch * ctx.world)
    group = ctx.group((0,)) if one else dist.group.WORLD
    if not one:
        x, target = x.chunk(ctx.world, 1)[ctx.rank], target.chunk(ctx.world, 1)[ctx.rank]
    optimizer = make_optimizer(ctx, model.parameters(), lr=float(args.get("lr", 1e-3)))
    fp8 = autocast_args(ctx, "bf16" if precision == "bf16" else "fp8", group, **changes)
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
    """Losses of a few steps on one GPU at the global batch against N GPUs with DDP and with
    FSDP2 (BF16, FP8, and FSDP2 with FP8 weights against one GPU with FP8 weights)."""
    n = ctx.world
    cases = [
        ("bf16", "1 GPU", {}),
        ("bf16", f"DDP, {n} GPUs", {}),
        ("bf16", f"FSDP2, {n} GPUs", {}),
        ("fp8", "1 GPU", {}),
        ("fp8", f"DDP, {n} GPUs", {}),
        ("fp8", f"DDP, {n} GPUs, reduce_amax=False", {"reduce_amax": False}),
        ("fp8", f"FSDP2, {n} GPUs", {}),
        ("fp8_weights", "1 GPU", {}),
        ("fp8_weights", f"FSDP2, {n} GPUs", {}),
    ]
    rows = []
    for precision, layout, changes in cases:

        def run(precision=precision, layout=layout, changes=changes):
            return _ddp_losses(ctx, args, precision, layout, changes)

        runner = only(ctx, (0,), run) if layout == "1 GPU" else run
        rows.append(sub_run(ctx, {"precision": precision, "layout": layout}, runner))
    return {"rows": rows, "global_batch": int(args["batch"]) * n}


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


def outlier_half(x: torch.Tensor, channel: int = 0) -> torch.Tensor:
    """``x`` (``[S, B, H]``) with one outlier channel, 8 sqrt(H), in the second half of the
    sequence: after LayerNorm that channel is close to sqrt(H) there and a few units elsewhere,
    so under sequence parallelism the ranks' amaxes differ several times over and skipping the
    amax reduction shows (the negative control of :func:`task_tp_check`)."""
    x = x.clone()
    x[x.shape[0] // 2 :, :, channel] += 8 * x.shape[-1] ** 0.5
    return x


def fp32_reference(ctx: Context, cfg, full, x, grad_y) -> dict:
    """The whole stack in FP32 without FP8, with ``full``'s weights, on the same input: its
    output, input gradient and parameter gradients (the yardstick both sides are measured
    from)."""
    reference = build_model(ctx, cfg, params_dtype=torch.float32)
    weights = dict(full.named_parameters())
    with torch.no_grad():
        for name, param in reference.named_parameters():
            param.copy_(weights[name])
    x_ref = x.float().clone().requires_grad_()
    y_ref = reference(x_ref)
    y_ref.backward(grad_y.float())
    return _results(y_ref, x_ref, reference)


def _results(y: torch.Tensor, x: torch.Tensor, model) -> dict:
    """A pass's output, input gradient and parameter gradients, as :func:`_distances` reads
    them."""
    grads = {name: p.grad for name, p in model.named_parameters()}
    return {"output": y.detach(), "input": x.grad, "grads": grads}


def _distances(output, x_grad, grads, reference: dict, mine) -> dict:
    """Relative errors of an output, input gradient and ``(name, grad, cut)`` parameter
    gradients from the FP32 reference (``mine`` and ``cut`` take this rank's part of it)."""
    worst, _ = _worst_gradient(
        (name, grad, cut(reference["grads"][name])) for name, grad, cut in grads
    )
    return {
        "output": relative_error(output, mine(reference["output"])),
        "input gradient": relative_error(x_grad, mine(reference["input"])),
        "worst parameter gradient": worst,
    }


def _input_scales(ctx: Context, model) -> list[float]:
    """Every rank's FP8 scale of the first GEMM's input (empty without FP8 state)."""
    meta = _first_gemm_meta(model)
    scale = meta["scaling_fwd"].scale[0].item() if "scaling_fwd" in meta else None
    return [s for s in ctx.gather(scale) if s is not None]


def _tp_errors(ctx: Context, args: dict, tp_group, precision: str, sp: bool, reduce=True):
    """Relative errors of the tensor-parallel stack (sequence-parallel with ``sp``) against the
    whole stack, and of both from an FP32 reference, worst over ranks; ``reduce=False`` keeps
    amaxes per rank (the negative control)."""
    cfg = config_of(args)
    seq, batch, tp = int(args["seq"]), int(args["batch"]), ctx.world
    full = build_model(ctx, cfg)
    part = tensor_parallel_model(ctx, cfg, tp_group, sequence_parallel=sp, seed=99)
    weights = dict(full.named_parameters())
    cut = lambda name, shape: lambda t: shard_parameter(name, t, shape, ctx.rank, tp, cfg)  # noqa: E731
    with torch.no_grad():
        for name, param in part.named_parameters():
            param.copy_(cut(name, param.shape)(weights[name]))
    x, grad_y = batch_data(ctx, cfg, seq, batch)
    x, grad_y = outlier_half(x), grad_y.to(x.dtype)
    mine = (lambda t: t.chunk(tp, 0)[ctx.rank]) if sp else (lambda t: t)
    shared = {} if reduce else {"reduce_amax": False}
    autocasts = (
        autocast_args(ctx, precision, None, reduce_amax=False),
        autocast_args(ctx, precision, tp_group, **shared),
    )
    after = lambda: sequence_parallel_grads(part, tp_group)  # noqa: E731
    y_full, y_part, x_full, x_part = _run_both(
        ctx, full, part, x, grad_y, mine, autocasts, int(args.get("steps", 3)), after
    )
    part_grads = [(n, p.grad, cut(n, p.shape)) for n, p in part.named_parameters()]
    one_gpu = _results(y_full, x_full, full)
    errors = _distances(y_part, x_part.grad, part_grads, one_gpu, mine)
    reference = fp32_reference(ctx, cfg, full, x, grad_y)
    for key, value in _distances(y_part, x_part.grad, part_grads, reference, mine).items():
        errors[f"TP from FP32: {key}"] = value
    full_grads = [(n, p.grad, lambda t: t) for n, p in full.named_parameters()]
    for key, value in _distances(y_full, x_full.grad, full_grads, reference, lambda t: t).items():
        errors[f"1 GPU from FP32: {key}"] = value
    everyone = ctx.gather(errors)
    merged = {k: max(e[k] for e in everyone) for k in errors}
    scales = _input_scales(ctx, part) if precision != "bf16" else []
    spread = max(scales) / min(scales) - 1 if scales else None
    return {**merged, "input scales": scales, "scale spread": spread}


def task_tp_check(ctx: Context, args: dict) -> dict:
    """The tensor-parallel model (and with sequence parallelism) against the whole model on one
    GPU, same weights and input, and both against an FP32 reference; plus a negative control:
    sequence parallelism in FP8 without the amax reduction over the tensor-parallel group."""
    tp = ctx.world
    tp_group, _ = tp_groups(ctx, tp)
    cases = [(p, sp, True) for p in args.get("precisions", ("bf16", "fp8")) for sp in (True, False)]
    cases.append(("fp8", True, False))
    rows = []
    for precision, sp, reduce in cases:

        def run(precision=precision, sp=sp, reduce=reduce):
            return _tp_errors(ctx, args, tp_group, precision, sp, reduce)

        row = {"precision": precision, "sequence_parallel": sp, "tp": tp}
        row["amax reduction"] = "TP group" if reduce else "none (negative control)"
        rows.append(sub_run(ctx, row, run))
    return {"rows": rows}


def _cp_errors(ctx: Context, args: dict, precision: str) -> dict:
    """Relative errors of the context-parallel stack against the whole sequence on one GPU, and
    of both from an FP32 reference (same weights, same input)."""
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
    same = lambda t: t  # noqa: E731
    names = [name for name, _ in part.named_parameters()]
    part_grads = [(n, g, same) for n, g in zip(names, summed, strict=True)]
    one_gpu = _results(y_full, x_full, full)
    errors = _distances(y_part, x_part.grad, part_grads, one_gpu, mine)
    reference = fp32_reference(ctx, cfg, full, x, grad_y)
    for key, value in _distances(y_part, x_part.grad, part_grads, reference, mine).items():
        errors[f"CP from FP32: {key}"] = value
    full_grads = [(n, p.grad, same) for n, p in full.named_parameters()]
    for key, value in _distances(y_full, x_full.grad, full_grads, reference, same).items():
        errors[f"1 GPU from FP32: {key}"] = value
    everyone = ctx.gather(errors)
    return {k: max(e[k] for e in everyone) for k in errors}


def task_cp_check(ctx: Context, args: dict) -> dict:
    """Context parallelism against the whole sequence on one GPU: output and gradients."""
    rows = []
    for precision in args.get("precisions", ("bf16", "fp8")):

        def run(precision=precision):
            return _cp_errors(ctx, args, precision)

        rows.append(sub_run(ctx, {"precision": precision, "cp": ctx.world}, run))
    return {"rows": rows}
