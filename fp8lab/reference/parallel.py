"""Tensor and sequence parallelism of TE 2.20 on ``torch.distributed`` (CPU reference).

Mirrors what ``transformer_engine/pytorch/module/{linear,layernorm_linear,layernorm_mlp}.py``
and ``pytorch/distributed.py`` do around a GEMM when ``tp_group`` has more than one rank
(Shoeybi et al. 2019; sequence parallelism: Korthikanti et al. 2022):

======================  ===================================  =================================
module, mode            forward                              backward (input gradient)
======================  ===================================  =================================
column, no SP           input used as is (replicated)        all-reduce over ``tp_group``
column, SP              all-gather the input along dim 0     reduce-scatter along dim 0
row, no SP              all-reduce the output                used as is (each rank's shard)
row, SP                 reduce-scatter the output, dim 0     all-gather along dim 0
======================  ===================================  =================================

A column-parallel GEMM holds ``out_features / tp`` rows of the weight, a row-parallel one
``in_features / tp`` columns; the bias of a row-parallel GEMM is added after the reduction.
Parameters whose gradient covers only this rank's tokens under sequence parallelism (norm
weights and the bias of a row-parallel GEMM) carry ``param.sequence_parallel = True``, as in TE:
the training loop all-reduces their gradients over ``tp_group`` (Megatron-LM does it in
``finalize_model_grads``); TE does not.

The collectives are ``all_reduce`` and ``all_gather``, which every backend has (gloo on CPUs);
they compute what NCCL's all-gather and reduce-scatter compute, more slowly.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

MODES = (None, "column", "row")


def group_size(group) -> int:
    """Ranks in ``group`` (the default group for None); 1 where torch.distributed is not
    initialized."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def tp_world_size(module: str, tp_group, tp_size: int) -> int:
    """The tensor-parallel size a module uses, as TE reads it: the group's size when a group is
    given, else ``tp_size`` (which needs ``set_tensor_parallel_group`` later, not modelled)."""
    if tp_group is not None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(f"{module}: tp_group given but torch.distributed is not initialized")
        return dist.get_world_size(tp_group)
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"{module}: tp_size={tp_size!r} must be a positive integer")
    if tp_size != 1:
        raise NotImplementedError(
            f"{module}: tensor parallelism over {tp_size} ranks needs tp_group (a "
            "torch.distributed process group); tp_size without a group, set later with "
            "set_tensor_parallel_group, is not modelled by the CPU reference"
        )
    return 1


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(
            f"{what}={numerator} is not divisible by the tensor-parallel size {denominator}"
        )
    return numerator // denominator


def mark_sequence_parallel(*params, value: bool = True) -> None:
    """Set ``param.sequence_parallel`` as TE does on norm weights and row-parallel biases."""
    for param in params:
        if param is not None:
            param.sequence_parallel = value


def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    x = x.contiguous().clone()
    dist.all_reduce(x, group=group)
    return x


def _all_gather(x: torch.Tensor, group) -> torch.Tensor:
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=0)


def _reduce_scatter(x: torch.Tensor, group) -> torch.Tensor:
    size = dist.get_world_size(group)
    if x.shape[0] % size:
        raise ValueError(
            f"sequence parallelism: the sequence dimension {x.shape[0]} is not divisible by the "
            f"tensor-parallel size {size}"
        )
    summed = _all_reduce(x, group)
    return summed.chunk(size, dim=0)[dist.get_rank(group)].contiguous()


class _CopyToTensorParallel(torch.autograd.Function):
    """Identity forward, all-reduce of the gradient (the input of a column-parallel GEMM)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """All-reduce forward, identity backward (the output of a row-parallel GEMM)."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromSequenceParallel(torch.autograd.Function):
    """All-gather along dim 0 forward, reduce-scatter backward (column-parallel input under SP)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.group), None


class _ReduceScatterToSequenceParallel(torch.autograd.Function):
    """Reduce-scatter along dim 0 forward, all-gather backward (row-parallel output under SP)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.group), None


def column_input(x: torch.Tensor, group, tp: int, sequence_parallel: bool) -> torch.Tensor:
    """What a column-parallel GEMM multiplies: the gathered sequence (SP) or the input itself."""
    if tp == 1:
        return x
    if sequence_parallel:
        return _GatherFromSequenceParallel.apply(x, group)
    return _CopyToTensorParallel.apply(x, group)


def row_output(x: torch.Tensor, group, tp: int, sequence_parallel: bool) -> torch.Tensor:
    """A row-parallel GEMM's partial output, summed over ranks (scattered along dim 0 under SP)."""
    if tp == 1:
        return x
    if sequence_parallel:
        return _ReduceScatterToSequenceParallel.apply(x, group)
    return _ReduceFromTensorParallel.apply(x, group)


def amax_group_size(group) -> int:
    """How many ranks delayed-scaling amaxes are reduced over: TE uses ``amax_reduction_group``,
    or the default (world) group when it is None and torch.distributed is initialized."""
    return group_size(group)


def reduce_amax(amaxes: list[torch.Tensor], group) -> None:
    """All-reduce (MAX) the newest amaxes of several histories in place, as one buffer, as TE's
    ``reduce_and_update_fp8_tensors`` does before the scale update."""
    if not amaxes or amax_group_size(group) == 1:
        return
    buffer = torch.cat([a.reshape(-1) for a in amaxes])
    dist.all_reduce(buffer, op=dist.ReduceOp.MAX, group=group)
    offset = 0
    for amax in amaxes:
        amax.copy_(buffer[offset : offset + amax.numel()].view_as(amax))
        offset += amax.numel()
