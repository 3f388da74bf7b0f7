"""How each layout of chapter 08 wraps or shards the model (:mod:`fp8lab.parallel.model`, a
stack of ``te.TransformerLayer``) with Transformer Engine: this file is the chapter's code.

* **DDP**: the whole model on every GPU; gradients averaged by ``DistributedDataParallel``
  (buckets, overlapped with the backward) or in one all-reduce after it; with ZeRO-1, each GPU
  keeps the optimizer state of 1/N of the parameters (``ZeroRedundancyOptimizer``);
* **FSDP2**: ``fully_shard`` per layer on ``meta`` parameters, TE's ``reset_parameters()``
  materialising each rank's shard; FP8 weights under ``te.quantized_model_init``;
* **TP/SP**: TE's tensor-parallel layers (``set_parallel_mode=True``: QKV and FC1
  column-parallel, projection and FC2 row-parallel), sequence parallelism, Userbuffers;
* **CP**: a context-parallel group on every layer (TE's p2p ring), the sequence cut so that
  each rank gets an equal share of causal attention.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from fp8lab.config import TransformerConfig
from fp8lab.parallel.model import build_model, fp8_recipe, initialize_meta_parameters
from fp8lab.parallel.process import Context

# --- DDP --------------------------------------------------------------------------------------

DDP_VARIANTS = {
    "default": {},
    "tuned": {"bucket_cap_mb": 200, "gradient_as_bucket_view": True},
}


def ddp(ctx: Context, model, group, **options):
    """``DistributedDataParallel`` over ``group`` (buckets, overlap with the backward)."""
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [ctx.local_rank] if ctx.cuda else None
    return DistributedDataParallel(model, device_ids=device_ids, process_group=group, **options)


def all_reduce_grads(model, group) -> None:
    """Average gradients over ``group`` in one call after the backward (no overlap)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    for grad, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
        grad.copy_(synced)


def zero1_optimizer(ctx: Context, model, group, lr: float = 1e-4):
    """DDP + ZeRO-1: each rank keeps the optimizer state (FP32 master weights and moments) of
    1/N of the parameters and broadcasts its updated part after the step."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if not ctx.cuda:  # the CPU reference trains with AdamW
        return ZeroRedundancyOptimizer(
            model.parameters(), torch.optim.AdamW, process_group=group, lr=lr
        )
    return ZeroRedundancyOptimizer(
        model.parameters(),
        ctx.te.optimizers.FusedAdam,
        process_group=group,
        lr=lr,
        master_weights=True,
        master_weight_dtype=torch.float32,
    )


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


# --- FSDP2 ------------------------------------------------------------------------------------


def _custom_attributes(model) -> dict:
    """Attributes TE hangs on parameters (FSDP2 replaces the parameters; TE's tests keep them)."""
    saved = {}
    for name, param in model.named_parameters():
        quantized = type(param).__name__ != "Parameter" and hasattr(param, "_quantizer")
        saved[name] = {
            k: v for k, v in vars(param).items() if not (quantized and k.startswith("_"))
        }
    return saved


def fsdp_model(ctx: Context, cfg: TransformerConfig, precision: str, *, meta=True, reshard=True):
    """FSDP2 (``fully_shard``) over every rank: each layer a unit, then the whole model.

    The layers are created on the ``meta`` device (no memory), sharded, then materialised shard
    by shard: TE's ``reset_parameters()`` allocates and initialises only this rank's part. With
    ``precision="fp8_weights"`` the layers are built under ``te.quantized_model_init``, so the
    shards are FP8 tensors and FSDP2 all-gathers FP8 bytes (TE's ``fsdp_pre_all_gather``).
    ``meta=False`` shards a whole model built on the device (the same weights as one GPU's, for
    the checks); ``reshard=False`` keeps the gathered weights from the forward to the backward
    (``reshard_after_forward=False``: one gather per step instead of two, ZeRO-2-like memory).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = "meta" if meta else None
    if precision == "fp8_weights":
        with ctx.te.quantized_model_init(enabled=True, recipe=fp8_recipe(ctx)):
            model = build_model(ctx, cfg, device=device)
    else:
        model = build_model(ctx, cfg, device=device)
    attributes = _custom_attributes(model)
    mesh = init_device_mesh("cuda" if ctx.cuda else "cpu", (ctx.world,))
    for layer in model:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    for module in model.modules() if meta else ():  # TE: materialise this rank's shard
        if hasattr(module, "reset_parameters") and module is not model:
            module.reset_parameters()
    if any(p.is_meta for p in model.parameters()):  # the CPU reference has no reset_parameters
        initialize_meta_parameters(model, ctx.device)
    for name, param in model.named_parameters():
        for key, value in attributes.get(name, {}).items():
            setattr(param, key, value)
    return model


# --- TP and SP --------------------------------------------------------------------------------


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


def tensor_parallel_model(
    ctx: Context, cfg, tp_group, *, sequence_parallel: bool, userbuffers=False, seed=1234
):
    """TE's tensor-parallel layers over ``tp_group`` (QKV and FC1 column-parallel, projection
    and FC2 row-parallel), with sequence parallelism and Userbuffers overlap optionally."""
    options = {"tp_group": tp_group, "set_parallel_mode": True}
    options["sequence_parallel"] = sequence_parallel
    if userbuffers:
        options["ub_tp_comm_overlap"] = True
    return build_model(ctx, cfg, seed=seed, **options)


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


def initialize_userbuffers(ctx: Context, cfg: TransformerConfig, tokens: int, tp: int) -> None:
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


def release_userbuffers(ctx: Context) -> None:
    """Free TE's Userbuffers, if :func:`initialize_userbuffers` made them."""
    if getattr(ctx, "_ub_ready", False):
        with contextlib.suppress(Exception):
            ctx.te.destroy_ub()
        ctx._ub_ready = False


# --- CP ---------------------------------------------------------------------------------------


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
