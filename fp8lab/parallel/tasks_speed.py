"""Speed tasks: step time and memory of each layout, collective bandwidth, one profiled step.

``links`` times all-reduce, all-gather and reduce-scatter over message sizes (nccl-tests style);
``ddp``, ``fsdp``, ``tp`` and ``cp`` time training steps of each layout
(:mod:`fp8lab.parallel.layouts`); ``timeline`` profiles one step of DDP and of TP+SP; ``sleep``
exists for the launcher's tests.
"""

from __future__ import annotations

import os
import time

import torch.distributed as dist

from fp8lab.parallel.layouts import (
    context_parallel,
    ddp,
    ddp_model,
    dual_chunks,
    fsdp_model,
    initialize_userbuffers,
    release_userbuffers,
    sequence_parallel_grads,
    tensor_parallel_model,
    tp_groups,
)
from fp8lab.parallel.measure import (
    MiB,
    collective,
    memory_base,
    profile_step,
    tensor_bytes,
    timed,
)
from fp8lab.parallel.model import (
    autocast_args,
    batch_data,
    build_model,
    config_of,
    make_optimizer,
    training_step,
)
from fp8lab.parallel.process import Context, only, sub_run
from fp8lab.speedometer import time_callable


def back_to_back(nbytes: int, most: int = 100) -> int:
    """Calls timed between one pair of events for a message of ``nbytes``: up to ``most`` for
    small messages, so that the time per call is the collective's latency on the GPU and not
    the host's cost of launching one call; one call from 64 MiB on."""
    return max(1, min(int(most), 2**26 // max(int(nbytes), 1)))


def task_links(ctx: Context, args: dict) -> dict:
    """Time all-reduce, all-gather and reduce-scatter over message sizes (nccl-tests style),
    many calls back to back between two events for small messages."""
    rows = []
    sizes = []
    size = int(args.get("min_bytes", 2**12))
    while size <= int(args.get("max_bytes", 2**30)):
        sizes.append(size)
        size *= int(args.get("step", 4))
    for n in [s for s in ctx.sizes() if s > 1]:
        ranks = tuple(range(n))
        group = ctx.group(ranks)
        for op in args.get("ops", ("all_reduce", "all_gather", "reduce_scatter")):
            for nbytes in sizes:

                def measure(op=op, nbytes=nbytes, group=group):
                    one = collective(op, nbytes, group, ctx)
                    calls = back_to_back(nbytes, args.get("max_calls", 100))

                    def burst():
                        for _ in range(calls):
                            one()

                    iters = 20 if nbytes <= 2**26 else 10
                    timing = time_callable(burst, warmup=3, iters=iters, device=ctx.device)
                    return {
                        "time_us": timing.median_ms * 1e3 / calls,
                        "spread": timing.spread,
                        "calls": calls,
                    }

                rows.append(
                    sub_run(ctx, {"op": op, "n": n, "bytes": nbytes}, only(ctx, ranks, measure))
                )
    return {"rows": rows}


def task_ddp(ctx: Context, args: dict) -> dict:
    """Step time and memory of data parallelism on 1, 2, ... N GPUs at a fixed per-GPU batch."""
    cfg = config_of(args)
    seq = int(args["seq"])
    rows = []
    for variant in args["variants"]:
        ns = ctx.sizes() if variant.get("n", "all") == "all" else [int(variant["n"])]
        for n in ns:
            if n > ctx.world:
                continue
            mode = "single" if n == 1 else variant.get("mode", "default")
            batch = int(variant.get("batch", args["batch"]))
            if n == 1 and any(r.get("n") == 1 and r.get("batch") == batch for r in rows):
                continue  # one baseline per batch size and precision
            for precision in args.get("precisions", ("bf16", "fp8")):

                def run(precision=precision, n=n, mode=mode, batch=batch):
                    base = memory_base(ctx)
                    model, group, hook = ddp_model(ctx, cfg, n, mode)
                    optimizer = make_optimizer(ctx, model.parameters())
                    x, target = batch_data(ctx, cfg, seq, batch)
                    fp8 = autocast_args(ctx, precision, group)
                    step = training_step(ctx, model, optimizer, x, target, fp8, hook)
                    return timed(ctx, step, args, base)

                row = {"layout": "DP", "n": n, "mode": mode, "batch": batch, "seq": seq}
                rows.append(sub_run(ctx, {**row, "precision": precision}, only(ctx, range(n), run)))
    return {"rows": rows}


def task_fsdp(ctx: Context, args: dict) -> dict:
    """FSDP2 with TE modules: step time and memory per GPU, BF16, FP8 and FP8 weights."""
    cfg = config_of(args)
    seq, batch = int(args["seq"]), int(args["batch"])
    rows = []
    for precision in args.get("precisions", ("bf16", "fp8", "fp8_weights")):

        def run(precision=precision):
            base = memory_base(ctx)
            model = fsdp_model(ctx, cfg, precision)
            locals_ = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
            shard_bytes = sum(tensor_bytes(t) for t in locals_)
            kinds = sorted({type(t).__name__ for t in locals_})
            optimizer = make_optimizer(ctx, model.parameters())
            x, target = batch_data(ctx, cfg, seq, batch)
            fp8 = autocast_args(ctx, "bf16" if precision == "bf16" else "fp8", dist.group.WORLD)
            step = training_step(ctx, model, optimizer, x, target, fp8)
            result = timed(ctx, step, args, base)
            return {**result, "shard_mib": shard_bytes / MiB, "parameter_types": kinds}

        row = {"layout": "FSDP2", "n": ctx.world, "batch": batch, "seq": seq}
        rows.append(sub_run(ctx, {**row, "precision": precision}, run))
    return {"rows": rows}


def _tp_step_time(ctx: Context, args: dict, tp: int, precision: str, sp: bool, ub: bool) -> dict:
    """Time steps of ``tp``-way tensor parallelism (DDP across the tensor-parallel groups),
    each group processing ``batch * tp`` sequences."""
    cfg = config_of(args)
    seq, batch = int(args["seq"]), int(args["batch"])
    tp_group, dp_group = tp_groups(ctx, tp)
    if ub:
        initialize_userbuffers(ctx, cfg, seq * batch * tp, tp)
    base = memory_base(ctx)
    model = tensor_parallel_model(ctx, cfg, tp_group, sequence_parallel=sp, userbuffers=ub)
    if ctx.world // tp > 1:
        model = ddp(ctx, model, dp_group)
    optimizer = make_optimizer(ctx, model.parameters())
    x, target = batch_data(ctx, cfg, seq, batch * tp)
    if sp:
        tp_rank = dist.get_rank(tp_group)
        x, target = x.chunk(tp, 0)[tp_rank], target.chunk(tp, 0)[tp_rank]
    fp8 = autocast_args(ctx, precision, dist.group.WORLD)
    hook = (lambda: sequence_parallel_grads(model, tp_group)) if sp else None
    step = training_step(ctx, model, optimizer, x, target, fp8, hook)
    return timed(ctx, step, args, base)


def task_tp(ctx: Context, args: dict) -> dict:
    """Step time and memory of tensor parallelism (with and without sequence parallelism, and with
    Userbuffers overlap), each tensor-parallel group processing ``batch * tp`` sequences."""
    seq, batch = int(args["seq"]), int(args["batch"])
    rows = []
    for tp in [int(tp) for tp in args.get("tp_sizes") or [ctx.world]]:
        if tp > ctx.world or ctx.world % tp:
            continue
        tp_groups(ctx, tp)  # every rank creates the groups, in the same order, before any sub-run
        for variant in args["variants"]:
            sp, ub = bool(variant.get("sp", True)), bool(variant.get("userbuffers", False))
            for precision in args.get("precisions", ("bf16", "fp8")):

                def run(precision=precision, sp=sp, ub=ub, tp=tp):
                    return _tp_step_time(ctx, args, tp, precision, sp, ub)

                row = {
                    "layout": ("TP+SP" if sp else "TP") + (" + Userbuffers" if ub else ""),
                    "n": ctx.world,
                    "tp": tp,
                    "dp": ctx.world // tp,
                    "batch": batch,
                    "seq": seq,
                    "precision": precision,
                    "cuda_device_max_connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
                }
                rows.append(sub_run(ctx, row, run))
    release_userbuffers(ctx)
    return {"rows": rows}


def _cp_step_time(ctx: Context, args: dict, case: dict, n: int, precision: str) -> dict:
    """Time steps with the sequence split over the first ``n`` ranks (one GPU when n is 1)."""
    cfg = config_of(args)
    seq, batch = int(case["seq"]), int(case["batch"])
    base = memory_base(ctx)
    ranks = tuple(range(n))
    group = ctx.group(ranks)
    model = build_model(ctx, cfg)
    x, target = batch_data(ctx, cfg, seq, batch)
    if n > 1:
        context_parallel(ctx, model, group, ranks)
        model = ddp(ctx, model, group)
        x, target = dual_chunks(x, ctx.rank, n), dual_chunks(target, ctx.rank, n)
    optimizer = make_optimizer(ctx, model.parameters())
    fp8 = autocast_args(ctx, precision, group)
    step = training_step(ctx, model, optimizer, x, target, fp8)
    return timed(ctx, step, args | case, base)


def task_cp(ctx: Context, args: dict) -> dict:
    """Step time and memory with the sequence split over the GPUs (context parallelism, gradients
    averaged over them by DDP) against one GPU holding the whole sequence."""
    rows = []
    for case in args["cases"]:
        seq, batch = int(case["seq"]), int(case["batch"])
        ns = [1, ctx.world] if case.get("single", True) else [ctx.world]
        for n in ns:
            for precision in args.get("precisions", ("bf16", "fp8")):

                def run(precision=precision, n=n, case=case):
                    return _cp_step_time(ctx, args, case, n, precision)

                row = {"layout": "CP" if n > 1 else "1 GPU", "n": n, "cp": n}
                row.update(batch=batch, seq=seq, precision=precision)
                rows.append(sub_run(ctx, row, only(ctx, range(n), run)))
    return {"rows": rows}


def _profiled_layout(ctx: Context, args: dict, layout: str) -> dict:
    """One profiled FP8 step of DDP (``"DP"``) or of TP+SP over every rank."""
    cfg = config_of(args)
    seq, batch = int(args["seq"]), int(args["batch"])
    if layout == "DP":
        model, group, hook = ddp_model(ctx, cfg, ctx.world, "tuned")
        x, target = batch_data(ctx, cfg, seq, batch)
    else:
        tp_group, _ = tp_groups(ctx, ctx.world)
        model = tensor_parallel_model(ctx, cfg, tp_group, sequence_parallel=True)
        x, target = batch_data(ctx, cfg, seq, batch * ctx.world)
        x, target = x.chunk(ctx.world, 0)[ctx.rank], target.chunk(ctx.world, 0)[ctx.rank]
        hook = lambda: sequence_parallel_grads(model, tp_group)  # noqa: E731
    optimizer = make_optimizer(ctx, model.parameters())
    fp8 = autocast_args(ctx, args.get("precision", "fp8"), dist.group.WORLD)
    step = training_step(ctx, model, optimizer, x, target, fp8, hook)
    profile = profile_step(ctx, step)
    return profile if ctx.rank == 0 else {}


def task_timeline(ctx: Context, args: dict) -> dict:
    """One profiled step of DDP and of TP+SP (FP8): which kernels ran where, and for how long
    communication ran alone."""
    rows = []
    for layout in args.get("layouts", ("DP", "TP+SP")):

        def run(layout=layout):
            return _profiled_layout(ctx, args, layout)

        row = {"layout": layout, "precision": args.get("precision", "fp8")}
        rows.append(sub_run(ctx, row, run))
    return {"rows": rows}


def task_sleep(ctx: Context, args: dict) -> dict:
    """For the launcher's tests: sleep, raise on every rank, or end one process abruptly."""
    if args.get("raise"):
        raise RuntimeError("asked to fail")
    if args.get("exit_rank") is not None and ctx.rank == int(args["exit_rank"]):
        os._exit(3)
    time.sleep(float(args.get("seconds", 0.0)))
    values = ctx.gather(ctx.rank)
    return {"rows": [{"rank": r} for r in values], "world": ctx.world}
