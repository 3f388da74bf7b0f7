"""The fair comparison of the data-parallel layouts: every variant built once, then timed by the
book's protocol (:func:`fp8lab.protocol.rounds`, the order reversed every other round, a barrier
before each variant), so that a clock or a neighbour that drifts during the run weighs on every
variant alike and the rounds give an interval, not one number; each round keeps the slowest
rank's median.

Variants (each at the same work per GPU, B sequences of S tokens): ``1 GPU`` (every rank trains
its own whole model, no communication: the baseline, run on all GPUs at once so that they share
the same power and clocks), ``DDP`` (a full optimizer on every GPU), ``DDP + ZeRO-1``
(``ZeroRedundancyOptimizer``: each GPU steps 1/N of the parameters), ``FSDP2, no reshard``
(``reshard_after_forward=False``: weights gathered once per step) and ``FSDP2`` (gathered for
the forward and again for the backward). A variant that fails to build becomes a row with its
error; the others still run.
"""

from __future__ import annotations

import torch.distributed as dist

from fp8lab import protocol
from fp8lab.parallel.layouts import ddp, fsdp_model, zero1_optimizer
from fp8lab.parallel.measure import MiB, memory_base
from fp8lab.parallel.model import (
    autocast_args,
    batch_data,
    build_model,
    config_of,
    make_optimizer,
    training_step,
)
from fp8lab.parallel.process import Context, clean, error_text

VARIANTS = ("1 GPU", "DDP", "DDP + ZeRO-1", "FSDP2, no reshard", "FSDP2")


def _build(ctx: Context, args: dict, variant: str, precision: str):
    """One variant's training step (a closure over its model, optimizer and data)."""
    cfg = config_of(args)
    seq, batch = int(args["seq"]), int(args["batch"])
    world = dist.group.WORLD
    if variant.startswith("FSDP2"):
        model = fsdp_model(ctx, cfg, precision, meta=False, reshard=variant == "FSDP2")
        optimizer = make_optimizer(ctx, model.parameters())
    else:
        model = build_model(ctx, cfg)
        if variant != "1 GPU":
            model = ddp(ctx, model, world, bucket_cap_mb=200, gradient_as_bucket_view=True)
        if variant == "DDP + ZeRO-1":
            optimizer = zero1_optimizer(ctx, model, world)
        else:
            optimizer = make_optimizer(ctx, model.parameters())
    x, target = batch_data(ctx, cfg, seq, batch, seed=7 + ctx.rank)
    if variant == "1 GPU":  # alone: amaxes of this GPU only
        fp8 = autocast_args(ctx, precision, None, reduce_amax=False)
    else:
        fp8 = autocast_args(ctx, precision, world)
    return training_step(ctx, model, optimizer, x, target, fp8)


def _rounds(ctx: Context, args: dict, precision: str) -> list[dict]:
    """Build every variant of one precision, then time them in rounds."""
    steps, rows, errors, state = {}, [], {}, {}
    for variant in args.get("variants", VARIANTS):
        base = memory_base(ctx)
        try:
            steps[variant] = _build(ctx, args, variant, precision)
            steps[variant]()  # the first step allocates the optimizer state
            state[variant] = (memory_base(ctx) - base) / MiB
        except Exception as caught:  # a variant that cannot run is a row, not a dead task
            errors[variant] = error_text(caught)
            steps.pop(variant, None)
    everyone = ctx.gather(sorted(errors.items()))
    failed = {name: error for rank_errors in everyone for name, error in rank_errors}
    steps = {name: step for name, step in steps.items() if name not in failed}
    timing = {"rounds": int(args.get("rounds", 5)), "calls": int(args.get("iters", 20))}
    timing.update(warmup=int(args.get("warmup", 5)), kernel_time=None, device=ctx.device)
    # the same order on every rank, and a barrier before each variant's calls
    timed = protocol.rounds(steps, before_each=ctx.barrier, **timing) if steps else None
    for name in args.get("variants", VARIANTS):
        row = {"variant": name, "precision": precision, "n": ctx.world}
        row.update(batch=int(args["batch"]), seq=int(args["seq"]))
        if name in failed:
            rows.append({**row, "error": failed[name]})
            continue
        per_rank = ctx.gather(list(timed.round_ms(name)))
        slowest = [max(values) for values in zip(*per_rank, strict=True)]
        state_mib = max(ctx.gather(state.get(name, 0.0)))
        rows.append({**row, "round_ms": slowest, "state_mib": state_mib})
    return rows


def task_rounds(ctx: Context, args: dict) -> dict:
    """Step time of the data-parallel layouts in alternating rounds, BF16 and FP8: the slowest
    rank's median per round and variant, and each variant's memory held between steps (MiB)."""
    rows = []
    for precision in args.get("precisions", ("bf16", "fp8")):
        try:
            rows.extend(_rounds(ctx, args, precision))
        finally:
            clean(ctx)
    return {"rows": rows, "rounds": int(args.get("rounds", 5))}
