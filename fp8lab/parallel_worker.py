"""The processes :mod:`fp8lab.distributed` starts: one per GPU (or CPU process), under torchrun.

``python -m torch.distributed.run --nproc-per-node N -m fp8lab.parallel_worker --plan P --out D``
runs the tasks listed in the JSON file ``P`` in order. Rank 0 writes ``D/<task>.started`` when a
task begins and ``D/<task>.json`` when it ends: ``{"ok", "data": {"rows": [...]}, "error",
"seconds"}``. Every rank runs every task; a task builds the process groups it needs from the
world size, so the same code runs on 2, 4 or 8 GPUs (and on 2 CPU processes, through the CPU
reference, with gloo).

The model is a stack of ``te.TransformerLayer`` (``TransformerConfig.num_layers`` of them),
dropout off (so that every layout computes the same function and can be checked against one
GPU), causal attention, fused QKV in TE's non-interleaved order. The loss is the mean squared
error against a random target; the optimizer is TE's ``FusedAdam`` with FP32 master weights
(``torch.optim.AdamW`` on the CPU reference). A sub-run that raises becomes a row with its
``error``; the other rows of the task still run.

Task kinds (one function each, ``TASKS``): ``links`` (collective bandwidth), ``amax`` (scales
across ranks with and without amax reduction), ``ddp_check`` (losses of N GPUs against one),
``ddp`` (step time and memory, 1..N GPUs), ``fsdp`` (FSDP2 with TE, meta init, FP8 weights),
``tp_check`` and ``tp`` (tensor and sequence parallelism, Userbuffers), ``cp_check`` and ``cp``
(context parallelism), ``timeline`` (where the kernels of one step run), ``sleep`` (for tests).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import os
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from fp8lab.config import TransformerConfig
from fp8lab.environment import import_te, preset
from fp8lab.formats import relative_error
from fp8lab.profiling import categorize
from fp8lab.speedometer import time_callable

__all__ = ["main"]

COMMUNICATION = re.compile(
    r"nccl|userbuffers|kuserbuffers|allgather|all_gather|reducescatter|reduce_scatter|allreduce|"
    r"all_reduce|sendrecv|c10d|gloo|broadcast",
    re.I,
)
MiB = 2**20


# --- the process and its groups ------------------------------------------------------------------


@dataclasses.dataclass
class Context:
    """What every task gets: ranks, device, TE (or the CPU reference) and helper groups."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    cuda: bool
    te: object
    recipes: object
    cpu_group: object
    out: Path
    groups: dict = dataclasses.field(default_factory=dict)

    def barrier(self) -> None:
        dist.barrier(group=self.cpu_group)

    def gather(self, value) -> list:
        """Every rank's ``value`` (any picklable object), on every rank."""
        values = [None] * self.world
        dist.all_gather_object(values, value, group=self.cpu_group)
        return values

    def group(self, ranks) -> object:
        """The process group of ``ranks``. Creating one is collective: every rank must ask for
        a new group, in the same order (the groups of the first n ranks exist from the start,
        so code that runs on some ranks only may ask for those)."""
        ranks = tuple(ranks)
        if ranks == tuple(range(self.world)):
            return dist.group.WORLD
        if ranks not in self.groups:
            self.groups[ranks] = dist.new_group(list(ranks))
        return self.groups[ranks]

    def sizes(self) -> list[int]:
        """1, 2, 4, ... up to the world size, and the world size itself."""
        sizes = [1]
        while sizes[-1] * 2 <= self.world:
            sizes.append(sizes[-1] * 2)
        return sorted(set(sizes) | {self.world})


def _setup(out: Path) -> Context:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        if name not in os.environ:
            raise ValueError(
                f"main: {name} is not set; run this module under torchrun "
                "(python -m torch.distributed.run ... -m fp8lab.parallel_worker)"
            )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available() and os.environ.get("FP8LAB_DIST_BACKEND", "") != "gloo"
    if cuda:  # this process's GPU first, so that nothing starts a context on GPU 0
        torch.cuda.set_device(local_rank)
    te, recipes = import_te()  # TE next: it must load cuDNN before anything else does
    if cuda:
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device, timeout=timedelta(minutes=20))
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(minutes=20))
    cpu_group = dist.new_group(backend="gloo", timeout=timedelta(minutes=30)) if cuda else None
    (out / f"pid.{rank}").write_text(str(os.getpid()))
    ctx = Context(rank, world, local_rank, device, cuda, te, recipes, cpu_group, out)
    for n in ctx.sizes():  # the groups of the first n ranks, created by every rank alike
        ctx.group(range(n))
    return ctx


def _te_version(ctx: Context) -> str | None:
    """TE's version where TE itself runs; None for the CPU reference."""
    if not ctx.cuda:
        return None
    import transformer_engine

    return transformer_engine.__version__


def _machine(ctx: Context) -> dict:
    record = {
        "gpu_name": torch.cuda.get_device_name() if ctx.cuda else None,
        "gpu_count": ctx.world if ctx.cuda else 0,
        "processes": ctx.world,
        "compute_capability": ".".join(map(str, torch.cuda.get_device_capability()))
        if ctx.cuda
        else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda if ctx.cuda else None,
        "transformer_engine": _te_version(ctx),
        "te": _te_version(ctx) or getattr(ctx.te, "__version__", "CPU reference"),
        "backend": "nccl" if ctx.cuda else "gloo",
        "preset": preset(),
    }
    if ctx.cuda:
        with contextlib.suppress(Exception):
            record["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return record


def _write(path: Path, payload: dict) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(payload, default=_jsonable))
    temporary.replace(path)


def _jsonable(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def _clean(ctx: Context) -> None:
    """Free what a sub-run left: Python objects, cached GPU memory, FP8 global state."""
    gc.collect()
    if ctx.cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        quantization = getattr(ctx.te, "quantization", None)
        manager = getattr(quantization, "FP8GlobalStateManager", None)
        if manager is not None:
            manager.reset()
    else:
        state = getattr(getattr(ctx.te, "quantization", None), "STATE", None)
        if state is not None:
            state.__init__()


def _error_text(error: BaseException) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0][:400] if lines else ''}"


def sub_run(ctx: Context, row: dict, function: Callable[[], dict | None]) -> dict:
    """Run ``function`` on every rank and merge what each rank returns into ``row``.

    Numbers that differ by rank keep the largest (the slowest rank sets the step time, the
    fullest GPU the memory) and, for memory, every rank's value; an exception on any rank
    becomes the row's ``error``.
    """
    error = None
    result: dict = {}
    try:
        result = function() or {}
    except Exception as caught:  # a failed sub-run is a row, not a failed chapter
        error = _error_text(caught)
        if ctx.rank == 0:
            traceback.print_exc()
    finally:
        _clean(ctx)
    everything = ctx.gather((error, result))
    errors = [e for e, _ in everything if e]
    merged = dict(row)
    if errors:
        merged["error"] = errors[0]
        return merged
    merged.update(everything[0][1])
    for key in ("step_ms", "peak_mib"):
        values = [r.get(key) for _, r in everything if r.get(key) is not None]
        if values:
            merged[key] = max(values)
            if key == "peak_mib":
                merged["peak_mib_per_rank"] = values
    return merged


# --- the model, the data, one step -----------------------------------------------------------


def config_of(args: dict) -> TransformerConfig:
    return TransformerConfig(**args["model"])


def dtype_of(ctx: Context) -> torch.dtype:
    """BF16 on GPUs; FP32 on the CPU reference (BF16 matmuls on CPUs are slow and not the point)."""
    return torch.bfloat16 if ctx.cuda else torch.float32


def fp8_recipe(ctx: Context, **changes):
    """The chapter's FP8 recipe: delayed scaling, TE's default on Hopper."""
    return ctx.recipes.DelayedScaling(**changes)


def build_model(
    ctx: Context,
    cfg: TransformerConfig,
    *,
    device: str | None = None,
    tp_group=None,
    sequence_parallel: bool = False,
    userbuffers: bool = False,
    fp8_weights=None,
    seed: int = 1234,
) -> torch.nn.Sequential:
    """``cfg.num_layers`` ``te.TransformerLayer``s; the same weights on every rank (one seed).

    With ``tp_group`` the layers are tensor-parallel (``set_parallel_mode=True``: QKV and FC1
    column-parallel, projection and FC2 row-parallel), with ``sequence_parallel`` optionally;
    ``fp8_weights`` (a recipe) builds them under ``te.quantized_model_init``.
    """
    te = ctx.te
    torch.manual_seed(seed)
    kwargs = {
        "num_gqa_groups": cfg.groups,
        "kv_channels": cfg.head_dim,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "self_attn_mask_type": "causal",
        "bias": cfg.bias,
        "activation": cfg.activation,
        "normalization": cfg.normalization,
        "params_dtype": dtype_of(ctx),
        "fuse_qkv_params": True,
        "qkv_weight_interleaved": False,
        "device": device or ("cuda" if ctx.cuda else "cpu"),
    }
    if tp_group is not None:
        kwargs.update(
            tp_group=tp_group, set_parallel_mode=True, sequence_parallel=sequence_parallel
        )
    if userbuffers:
        kwargs["ub_tp_comm_overlap"] = True
    init = (
        te.quantized_model_init(enabled=True, recipe=fp8_weights)
        if fp8_weights is not None
        else contextlib.nullcontext()
    )
    with init:
        layers = [
            te.TransformerLayer(
                cfg.hidden_size,
                cfg.ffn_hidden_size,
                cfg.num_attention_heads,
                layer_number=i + 1,
                **kwargs,
            )
            for i in range(cfg.num_layers)
        ]
    return torch.nn.Sequential(*layers)


def make_optimizer(ctx: Context, parameters, lr: float = 1e-4):
    """TE's FusedAdam with FP32 master weights on GPUs; AdamW on the CPU reference."""
    parameters = list(parameters)
    if ctx.cuda:
        return ctx.te.optimizers.FusedAdam(
            parameters, lr=lr, master_weights=True, master_weight_dtype=torch.float32
        )
    return torch.optim.AdamW(parameters, lr=lr)


def batch_data(ctx: Context, cfg: TransformerConfig, seq: int, batch: int, seed: int = 7):
    """A global batch ``x, target`` of shape ``[S, B, H]``, the same on every rank."""
    generator = torch.Generator(device=ctx.device).manual_seed(seed)
    shape = (seq, batch, cfg.hidden_size)
    x = torch.randn(shape, generator=generator, device=ctx.device).to(dtype_of(ctx))
    target = torch.randn(shape, generator=generator, device=ctx.device)
    return x, target


def autocast_args(ctx: Context, precision: str, group, **recipe_changes) -> dict:
    """``te.autocast`` arguments: FP8 delayed scaling with amaxes reduced over ``group``."""
    if precision == "bf16":
        return {"enabled": False}
    return {
        "enabled": True,
        "recipe": fp8_recipe(ctx, **recipe_changes),
        "amax_reduction_group": group,
    }


def training_step(ctx, model, optimizer, x, target, fp8: dict, after_backward=None):
    """One step: forward under ``te.autocast(**fp8)``, MSE loss, backward, optimizer step."""

    def step():
        with ctx.te.autocast(**fp8):
            out = model(x)
        loss = F.mse_loss(out.float(), target)
        loss.backward()
        if after_backward is not None:
            after_backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def timed(ctx: Context, step: Callable, args: dict, base: int) -> dict:
    """Median step time (ms), its spread and this rank's peak memory above ``base`` (MiB)."""
    timing = time_callable(
        step,
        warmup=int(args.get("warmup", 5)),
        iters=int(args.get("iters", 20)),
        device=ctx.device,
        measure_memory=ctx.cuda,
    )
    result = {"step_ms": timing.median_ms, "spread": timing.spread, "iters": timing.iters}
    if ctx.cuda:
        result["peak_mib"] = (timing.peak_memory_bytes - base) / MiB
    return result


def memory_base(ctx: Context) -> int:
    if not ctx.cuda:
        return 0
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def sequence_parallel_grads(model, group) -> None:
    """All-reduce, over the tensor-parallel group, the gradients TE leaves per sequence shard
    (parameters marked ``sequence_parallel``: norms and row-parallel biases)."""
    grads = [
        p.grad
        for p in model.parameters()
        if getattr(p, "sequence_parallel", False) and p.grad is not None
    ]
    if not grads or dist.get_world_size(group) == 1:
        return
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group)
    for grad, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
        grad.copy_(synced)


def all_reduce_grads(model, group) -> None:
    """Average gradients over ``group`` in one call after the backward (no overlap)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    for grad, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
        grad.copy_(synced)


def ddp(ctx: Context, model, group, **options):
    """``DistributedDataParallel`` over ``group`` (buckets, overlap with the backward)."""
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [ctx.local_rank] if ctx.cuda else None
    return DistributedDataParallel(model, device_ids=device_ids, process_group=group, **options)


def only(ctx: Context, ranks, function: Callable[[], dict | None]) -> Callable[[], dict | None]:
    """Run ``function`` on ``ranks`` only; the other ranks wait (for one-GPU baselines)."""

    def run():
        return function() if ctx.rank in ranks else None

    return run


# --- tasks --------------------------------------------------------------------------------------


def _collective(op: str, nbytes: int, group, ctx: Context):
    """A callable that runs one collective of ``nbytes`` (nccl-tests' size convention)."""
    n = dist.get_world_size(group)
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    element = torch.tensor([], dtype=dtype).element_size()
    count = max(n, nbytes // element // n * n)
    if op == "all_reduce":
        buffer = torch.ones(count, dtype=dtype, device=ctx.device)
        return lambda: dist.all_reduce(buffer, group=group)
    if op == "all_gather":  # size = the gathered output
        out = torch.empty(count, dtype=dtype, device=ctx.device)
        chunk = torch.ones(count // n, dtype=dtype, device=ctx.device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(out, chunk, group=group)
    if op == "reduce_scatter":  # size = each rank's input
        inp = torch.ones(count, dtype=dtype, device=ctx.device)
        out = torch.empty(count // n, dtype=dtype, device=ctx.device)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(out, inp, group=group)
    raise ValueError(f"op={op!r}: must be all_reduce, all_gather or reduce_scatter")


def task_links(ctx: Context, args: dict) -> dict:
    """Time all-reduce, all-gather and reduce-scatter over message sizes (nccl-tests style)."""
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
                    fn = _collective(op, nbytes, group, ctx)
                    iters = 20 if nbytes <= 2**26 else 10
                    timing = time_callable(fn, warmup=3, iters=iters, device=ctx.device)
                    return {"time_us": timing.median_ms * 1e3, "spread": timing.spread}

                rows.append(
                    sub_run(ctx, {"op": op, "n": n, "bytes": nbytes}, only(ctx, ranks, measure))
                )
    return {"rows": rows}


def _first_gemm_meta(model):
    """The FP8 state of the first GEMM (QKV of the first layer), in TE and the reference."""
    layer = model.module[0] if hasattr(model, "module") else model[0]
    return layer.self_attention.layernorm_qkv.fp8_meta


def task_amax(ctx: Context, args: dict) -> dict:
    """Delayed-scaling scales on each rank after a few DDP steps on different data, with amaxes
    kept per rank (``reduce_amax=False``), reduced over the default group (TE's fallback when
    ``amax_reduction_group`` is None) and over an explicit group; and what the reduction costs."""
    cfg = config_of(args)
    seq, batch = int(args["seq"]), int(args["batch"])
    world_group = dist.group.WORLD
    settings = {
        "per rank (reduce_amax=False)": ({"reduce_amax": False}, world_group),
        "default group (amax_reduction_group=None)": ({}, None),
        "amax_reduction_group=world": ({}, world_group),
    }
    rows = []
    for name, (changes, group) in settings.items():

        def run(changes=changes, group=group):
            model = ddp(ctx, build_model(ctx, cfg), world_group)
            optimizer = make_optimizer(ctx, model.parameters())
            x, target = batch_data(ctx, cfg, seq, batch * ctx.world)
            x, target = x.chunk(ctx.world, 1)[ctx.rank], target.chunk(ctx.world, 1)[ctx.rank]
            fp8 = {
                "enabled": True,
                "recipe": fp8_recipe(ctx, **changes),
                "amax_reduction_group": group,
            }
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


def task_ddp_check(ctx: Context, args: dict) -> dict:
    """Losses of a few steps on one GPU at the global batch against N GPUs with DDP."""
    cfg = config_of(args)
    seq, batch, steps = int(args["seq"]), int(args["batch"]), int(args.get("steps", 6))
    world_group = dist.group.WORLD
    single = ctx.group((0,))
    global_batch = batch * ctx.world
    rows = []
    cases = [
        ("bf16", "1 GPU", {}),
        ("bf16", f"DDP, {ctx.world} GPUs", {}),
        ("fp8", "1 GPU", {}),
        ("fp8", f"DDP, {ctx.world} GPUs", {}),
        ("fp8", f"DDP, {ctx.world} GPUs, reduce_amax=False", {"reduce_amax": False}),
    ]
    for precision, layout, changes in cases:
        one = layout == "1 GPU"

        def run(precision=precision, one=one, changes=changes):
            model = build_model(ctx, cfg)
            x, target = batch_data(ctx, cfg, seq, global_batch)
            if one:
                group = single
            else:
                model = ddp(ctx, model, world_group)
                group = world_group
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

        runner = only(ctx, (0,), run) if one else run
        rows.append(sub_run(ctx, {"precision": precision, "layout": layout}, runner))
    return {"rows": rows, "global_batch": global_batch}


DDP_VARIANTS = {
    "default": {},
    "tuned": {"bucket_cap_mb": 200, "gradient_as_bucket_view": True},
}


def ddp_model(ctx: Context, cfg: TransformerConfig, n: int, mode: str):
    """The model of one DDP variant on the first ``n`` ranks: plain on one GPU, DDP with
    ``DDP_VARIANTS[mode]``, or ``"no_overlap"`` (gradients averaged in one all-reduce after the
    backward). Returns the model, its group and the after-backward hook."""
    group = ctx.group(range(n))
    model = build_model(ctx, cfg)
    if n == 1:
        return model, group, None
    if mode == "no_overlap":
        return model, group, lambda: all_reduce_grads(model, group)
    return ddp(ctx, model, group, **DDP_VARIANTS[mode]), group, None


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


def _custom_attributes(model) -> dict:
    """Attributes TE hangs on parameters (FSDP2 replaces the parameters; TE's tests keep them)."""
    saved = {}
    for name, param in model.named_parameters():
        quantized = type(param).__name__ != "Parameter" and hasattr(param, "_quantizer")
        saved[name] = {
            k: v for k, v in vars(param).items() if not (quantized and k.startswith("_"))
        }
    return saved


def fsdp_model(ctx: Context, cfg: TransformerConfig, precision: str):
    """FSDP2 (``fully_shard``) over every rank: each layer a unit, then the whole model.

    The layers are created on the ``meta`` device (no memory), sharded, then materialised shard
    by shard: TE's ``reset_parameters()`` allocates and initialises only this rank's part. With
    ``precision="fp8_weights"`` the layers are built under ``te.quantized_model_init``, so the
    shards are FP8 tensors and FSDP2 all-gathers FP8 bytes (TE's ``fsdp_pre_all_gather``).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    fp8_weights = fp8_recipe(ctx) if precision == "fp8_weights" else None
    model = build_model(ctx, cfg, device="meta", fp8_weights=fp8_weights)
    attributes = _custom_attributes(model)
    mesh = init_device_mesh("cuda" if ctx.cuda else "cpu", (ctx.world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():  # TE: materialise and initialise this rank's shard
        if hasattr(module, "reset_parameters") and module is not model:
            module.reset_parameters()
    if any(p.is_meta for p in model.parameters()):  # the CPU reference has no reset_parameters
        model.to_empty(device=ctx.device)
        with torch.no_grad():
            for name, param in model.named_parameters():
                local = param.to_local() if hasattr(param, "to_local") else param
                if "norm_weight" in name:
                    local.fill_(1.0)
                elif local.dim() == 1:
                    local.zero_()
                else:
                    local.normal_(0.0, 0.023)
    for name, param in model.named_parameters():
        for key, value in attributes.get(name, {}).items():
            setattr(param, key, value)
    return model


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor holds: its FP8 data (and transpose) for TE's quantized tensors."""
    parts = [getattr(tensor, name, None) for name in ("_data", "_transpose")]
    parts = [t for t in parts if isinstance(t, torch.Tensor)]
    if parts:
        return sum(t.numel() * t.element_size() for t in parts)
    return tensor.numel() * tensor.element_size()


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


def tp_groups(ctx: Context, tp: int):
    """Tensor-parallel groups of ``tp`` consecutive ranks, data-parallel groups across them;
    returns this rank's (tp_group, dp_group)."""
    mine_tp = mine_dp = None
    for start in range(0, ctx.world, tp):
        ranks = tuple(range(start, start + tp))
        group = ctx.group(ranks)
        if ctx.rank in ranks:
            mine_tp = group
    for offset in range(tp):
        ranks = tuple(range(offset, ctx.world, tp))
        group = ctx.group(ranks)
        if ctx.rank in ranks:
            mine_dp = group
    return mine_tp, mine_dp


def task_tp_check(ctx: Context, args: dict) -> dict:
    """The tensor-parallel model (and with sequence parallelism) against the whole model on one
    GPU, same weights and input: relative error of the output and of every gradient."""
    cfg = config_of(args)
    seq, batch = int(args["seq"]), int(args["batch"])
    tp = ctx.world
    tp_group, _ = tp_groups(ctx, tp)
    rows = []
    for precision in args.get("precisions", ("bf16", "fp8")):
        for sp in (True, False):

            def run(precision=precision, sp=sp):
                full = build_model(ctx, cfg)
                part = build_model(ctx, cfg, tp_group=tp_group, sequence_parallel=sp, seed=99)
                weights = dict(full.named_parameters())
                with torch.no_grad():
                    for name, param in part.named_parameters():
                        param.copy_(
                            shard_parameter(name, weights[name], param.shape, ctx.rank, tp, cfg)
                        )
                x, grad_y = batch_data(ctx, cfg, seq, batch)
                grad_y = grad_y.to(x.dtype)
                mine = (lambda t: t.chunk(tp, 0)[ctx.rank]) if sp else (lambda t: t)
                alone = autocast_args(ctx, precision, None, reduce_amax=False)
                shared = autocast_args(ctx, precision, tp_group)
                for _ in range(int(args.get("steps", 3))):  # delayed scaling settles its scales
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
                    sequence_parallel_grads(part, tp_group)
                errors = {
                    "output": relative_error(y_part, mine(y_full)),
                    "input gradient": relative_error(x_part.grad, mine(x_full.grad)),
                }
                worst, worst_name = 0.0, ""
                for name, param in part.named_parameters():
                    expected = shard_parameter(
                        name, weights[name].grad, param.shape, ctx.rank, tp, cfg
                    )
                    error = relative_error(param.grad, expected)
                    if error >= worst:
                        worst, worst_name = error, name
                errors["worst parameter gradient"] = worst
                everyone = ctx.gather((errors, worst_name))
                merged = {k: max(e[k] for e, _ in everyone) for k in errors}
                names = [
                    n
                    for e, n in everyone
                    if e["worst parameter gradient"] == merged["worst parameter gradient"]
                ]
                return {**merged, "worst parameter": names[0]}

            rows.append(
                sub_run(ctx, {"precision": precision, "sequence_parallel": sp, "tp": tp}, run)
            )
    return {"rows": rows}


def _initialize_userbuffers(ctx: Context, cfg: TransformerConfig, tokens: int, tp: int) -> None:
    """TE's Userbuffers for tensor-parallel layers of ``tokens`` x H activations, BF16 and FP8
    (once per process: TE keeps them in a global)."""
    te = ctx.te
    if getattr(ctx, "_ub_ready", False):
        return
    modes = getattr(te, "UserBufferQuantizationMode", None)
    te.initialize_ub(
        [tokens, cfg.hidden_size],
        tp,
        quantization_modes=[modes.NONE, modes.FP8] if modes is not None else None,
        dtype=torch.bfloat16,
    )
    ctx._ub_ready = True


def task_tp(ctx: Context, args: dict) -> dict:
    """Step time and memory of tensor parallelism (with and without sequence parallelism, and with
    Userbuffers overlap), each tensor-parallel group processing ``batch * tp`` sequences."""
    cfg = config_of(args)
    seq, batch = int(args["seq"]), int(args["batch"])
    rows = []
    tp_sizes = args.get("tp_sizes") or [ctx.world]
    for tp in tp_sizes:
        tp = int(tp)
        if tp > ctx.world or ctx.world % tp:
            continue
        tp_group, dp_group = tp_groups(ctx, tp)
        dp = ctx.world // tp
        for variant in args["variants"]:
            sp, ub = bool(variant.get("sp", True)), bool(variant.get("userbuffers", False))
            for precision in args.get("precisions", ("bf16", "fp8")):

                def run(
                    precision=precision,
                    sp=sp,
                    ub=ub,
                    tp=tp,
                    dp=dp,
                    tp_group=tp_group,
                    dp_group=dp_group,
                ):
                    if ub:
                        _initialize_userbuffers(ctx, cfg, seq * batch * tp, tp)
                    base = memory_base(ctx)
                    model = build_model(
                        ctx, cfg, tp_group=tp_group, sequence_parallel=sp, userbuffers=ub
                    )
                    if dp > 1:
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

                layout = "TP+SP" if sp else "TP"
                row = {
                    "layout": layout + (" + Userbuffers" if ub else ""),
                    "n": ctx.world,
                    "tp": tp,
                    "dp": dp,
                    "batch": batch,
                    "seq": seq,
                    "precision": precision,
                    "cuda_device_max_connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
                }
                rows.append(sub_run(ctx, row, run))
    if getattr(ctx, "_ub_ready", False):
        with contextlib.suppress(Exception):
            ctx.te.destroy_ub()
        ctx._ub_ready = False
    return {"rows": rows}


def dual_chunks(x: torch.Tensor, rank: int, cp: int, dim: int = 0) -> torch.Tensor:
    """This rank's part of a sequence under TE's context parallelism: the sequence cut into
    ``2 cp`` chunks, rank r holding chunks r and 2cp - 1 - r (balances causal attention work)."""
    chunks = x.chunk(2 * cp, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * cp - 1 - rank]], dim=dim)


def context_parallel(ctx: Context, model, group, ranks) -> None:
    """Attach a context-parallel group to every layer (TE's p2p ring: K/V chunks passed on)."""
    stream = torch.cuda.Stream() if ctx.cuda else None
    for layer in model:
        layer.set_context_parallel_group(group, list(ranks), stream, "p2p")


def task_cp_check(ctx: Context, args: dict) -> dict:
    """Context parallelism against the whole sequence on one GPU: output and gradients."""
    cfg = config_of(args)
    seq, batch = int(args["seq"]), int(args["batch"])
    cp, ranks = ctx.world, tuple(range(ctx.world))
    rows = []
    for precision in args.get("precisions", ("bf16", "fp8")):

        def run(precision=precision):
            full = build_model(ctx, cfg)
            part = build_model(ctx, cfg)
            context_parallel(ctx, part, dist.group.WORLD, ranks)
            x, grad_y = batch_data(ctx, cfg, seq, batch)
            grad_y = grad_y.to(x.dtype)
            mine = lambda t: dual_chunks(t, ctx.rank, cp)  # noqa: E731
            alone = autocast_args(ctx, precision, None, reduce_amax=False)
            shared = autocast_args(ctx, precision, dist.group.WORLD)
            for _ in range(int(args.get("steps", 3))):
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
            grads = [p.grad for p in part.parameters()]
            flat = torch._utils._flatten_dense_tensors(grads)
            dist.all_reduce(flat)  # each rank holds the gradient of its tokens: sum them
            summed = torch._utils._unflatten_dense_tensors(flat, grads)
            worst, worst_name = 0.0, ""
            for (name, _), grad in zip(part.named_parameters(), summed, strict=True):
                error = relative_error(grad, dict(full.named_parameters())[name].grad)
                if error >= worst:
                    worst, worst_name = error, name
            errors = {
                "output": relative_error(y_part, mine(y_full)),
                "input gradient": relative_error(x_part.grad, mine(x_full.grad)),
                "worst parameter gradient": worst,
            }
            everyone = ctx.gather(errors)
            return {
                **{k: max(e[k] for e in everyone) for k in errors},
                "worst parameter": worst_name,
            }

        rows.append(sub_run(ctx, {"precision": precision, "cp": cp}, run))
    return {"rows": rows}


def task_cp(ctx: Context, args: dict) -> dict:
    """Step time and memory with the sequence split over the GPUs (context parallelism, gradients
    averaged over them by DDP) against one GPU holding the whole sequence."""
    cfg = config_of(args)
    rows = []
    for case in args["cases"]:
        seq, batch = int(case["seq"]), int(case["batch"])
        ns = [1, ctx.world] if case.get("single", True) else [ctx.world]
        for n in ns:
            for precision in args.get("precisions", ("bf16", "fp8")):

                def run(precision=precision, n=n, seq=seq, batch=batch, case=case):
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

                row = {
                    "layout": "CP" if n > 1 else "1 GPU",
                    "n": n,
                    "cp": n,
                    "batch": batch,
                    "seq": seq,
                }
                rows.append(sub_run(ctx, {**row, "precision": precision}, only(ctx, range(n), run)))
    return {"rows": rows}


def _intervals_length(intervals: list[tuple[float, float]]) -> float:
    """Total length of a union of intervals."""
    total, end = 0.0, -math.inf
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def _kernel_events(trace: dict, cuda: bool) -> list[dict]:
    events = []
    for event in trace.get("traceEvents", []):
        if event.get("ph") != "X" or "dur" not in event:
            continue
        category = str(event.get("cat", "")).lower()
        if (cuda and category != "kernel") or (not cuda and category != "cpu_op"):
            continue
        name = str(event.get("name", ""))
        kind = "communication" if COMMUNICATION.search(name) else categorize(name)
        stream = (event.get("args") or {}).get("stream", event.get("tid"))
        events.append(
            {
                "kind": kind,
                "stream": str(stream),
                "start_us": round(float(event["ts"]), 1),
                "dur_us": round(float(event["dur"]), 2),
                "name": name[:80],
            }
        )
    return events


def profile_step(ctx: Context, step: Callable, warmup: int = 3) -> dict:
    """Kernels of one step (their kind, stream, start and duration) and how much of the
    communication time ran while nothing else did (exposed)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        step()
    if ctx.cuda:
        torch.cuda.synchronize()
    activity = ProfilerActivity.CUDA if ctx.cuda else ProfilerActivity.CPU
    with profile(activities=[activity], acc_events=True) as prof:
        step()
        if ctx.cuda:
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = _kernel_events(json.loads(path.read_text()), ctx.cuda)
    if not events:
        raise RuntimeError("the profiler recorded no kernels")
    origin = min(e["start_us"] for e in events)
    for event in events:
        event["start_us"] = round(event["start_us"] - origin, 1)
    comm = [
        (e["start_us"], e["start_us"] + e["dur_us"]) for e in events if e["kind"] == "communication"
    ]
    compute = [
        (e["start_us"], e["start_us"] + e["dur_us"]) for e in events if e["kind"] != "communication"
    ]
    comm_us, compute_us = _intervals_length(comm), _intervals_length(compute)
    both = _intervals_length(comm + compute)
    overlapped = comm_us + compute_us - both
    events.sort(key=lambda e: e["start_us"])
    return {
        "events": events[:3000],
        "span_us": max(e["start_us"] + e["dur_us"] for e in events),
        "communication_us": comm_us,
        "compute_us": compute_us,
        "exposed_communication_us": comm_us - overlapped,
    }


def task_timeline(ctx: Context, args: dict) -> dict:
    """One profiled step of DDP and of TP+SP (FP8): which kernels ran where, and for how long
    communication ran alone."""
    cfg = config_of(args)
    seq, batch = int(args["seq"]), int(args["batch"])
    rows = []
    world = dist.group.WORLD
    for layout in args.get("layouts", ("DP", "TP+SP")):

        def run(layout=layout):
            if layout == "DP":
                model, group, hook = ddp_model(ctx, cfg, ctx.world, "tuned")
                x, target = batch_data(ctx, cfg, seq, batch)
            else:
                tp_group, _ = tp_groups(ctx, ctx.world)
                model = build_model(ctx, cfg, tp_group=tp_group, sequence_parallel=True)
                x, target = batch_data(ctx, cfg, seq, batch * ctx.world)
                x, target = x.chunk(ctx.world, 0)[ctx.rank], target.chunk(ctx.world, 0)[ctx.rank]
                hook = lambda: sequence_parallel_grads(model, tp_group)  # noqa: E731
            optimizer = make_optimizer(ctx, model.parameters())
            fp8 = autocast_args(ctx, args.get("precision", "fp8"), world)
            step = training_step(ctx, model, optimizer, x, target, fp8, hook)
            profile = profile_step(ctx, step)
            return profile if ctx.rank == 0 else {}

        rows.append(
            sub_run(ctx, {"layout": layout, "precision": args.get("precision", "fp8")}, run)
        )
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


TASKS = {
    "links": task_links,
    "amax": task_amax,
    "ddp_check": task_ddp_check,
    "ddp": task_ddp,
    "fsdp": task_fsdp,
    "tp_check": task_tp_check,
    "tp": task_tp,
    "cp_check": task_cp_check,
    "cp": task_cp,
    "timeline": task_timeline,
    "sleep": task_sleep,
}


def main(argv: list[str] | None = None) -> int:
    """Run the tasks of a plan file; rank 0 writes their results (see the module's docstring)."""
    if argv is not None and (
        not isinstance(argv, list) or not all(isinstance(a, str) for a in argv)
    ):
        raise TypeError(f"argv={argv!r}: must be a list of strings")
    given = sys.argv[1:] if argv is None else argv
    if "--plan" not in given or "--out" not in given:
        raise ValueError(f"argv={given!r}: needs --plan PLAN.json --out FOLDER")
    parser = argparse.ArgumentParser(prog="python -m fp8lab.parallel_worker")
    parser.add_argument("--plan", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    options, _ = parser.parse_known_args(argv)
    if not options.plan.exists():
        raise ValueError(f"argv: no plan file {options.plan}")
    plan = json.loads(options.plan.read_text())
    ctx = _setup(options.out)
    if ctx.rank == 0:
        _write(ctx.out / "machine.json", _machine(ctx))
    for task in plan["tasks"]:
        name, kind = task["name"], task["kind"]
        if ctx.rank == 0:
            (ctx.out / f"{name}.started").write_text(str(time.time()))
        begin = time.perf_counter()
        error, data = None, {}
        try:
            data = TASKS[kind](ctx, task["args"])
        except Exception as caught:
            error = _error_text(caught)
            if ctx.rank == 0:
                traceback.print_exc()
            _clean(ctx)
        errors = [e for e in ctx.gather(error) if e]
        if ctx.rank == 0:
            _write(
                ctx.out / f"{name}.json",
                {
                    "ok": not errors,
                    "data": data if not errors else {},
                    "error": errors[0] if errors else None,
                    "seconds": time.perf_counter() - begin,
                },
            )
        ctx.barrier()
    ctx.barrier()
    (ctx.out / f"pid.{ctx.rank}").unlink(missing_ok=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
