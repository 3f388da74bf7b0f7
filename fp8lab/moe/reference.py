"""Plain-PyTorch stand-ins for Transformer Engine 2.20's mixture-of-experts pieces.

Chapter 10 builds an MoE feed-forward layer from TE's router, permutation and
``GroupedLinear``. TE runs them as CUDA/Triton kernels, so on a machine without a GPU the
chapter takes these stand-ins instead: the same names, arguments and outputs, the same
numerics for what they cover, and a clear error for what they do not.

=====================================  ===================================================
stand-in                               Transformer Engine 2.20.2
=====================================  ===================================================
:func:`fused_topk_with_score_function`  ``pytorch/router.py`` (~line 305); numerics of
:func:`fused_compute_score_for_moe_aux_loss`  TE's own PyTorch references in
:func:`fused_moe_aux_loss`             ``tests/pytorch/test_fused_router.py``
:func:`moe_permute`,                   ``pytorch/permutation.py`` (~lines 879-1106),
:func:`moe_permute_with_probs`,        mask routing maps only; ``row_id_map`` in TE's
:func:`moe_permute_and_pad_with_probs`, layout ``[T, 2E + 1]`` (``pytorch/triton/
:func:`moe_unpermute`                  permutation.py``, ``make_row_id_map``)
:class:`GroupedLinear`                 ``pytorch/module/grouped_linear.py`` (~line 1538):
                                       one GEMM per expert, each with its own FP8 state,
                                       through the CPU reference's FP8 GEMM
=====================================  ===================================================

What the numerics follow: the router computes in FP32 and returns probabilities in the
logits' dtype (TE's router notes, ``router.py`` lines 6-14); tokens are grouped expert by
expert, in token order inside an expert; padding rows are zeros; ``moe_unpermute`` sums a
token's expert outputs in FP32, weighted by ``merging_probs``, and returns the input dtype.
A token's entries in ``row_id_map`` are in ascending row order here; TE does not promise an
order, so code should not read them, only pass the map on, as the chapter does.

Not modelled (``NotImplementedError``): grouped top-k (``num_groups``/``group_topk``),
``"sqrtsoftplus"``, bit-packed routing maps, dense ``topk_indices`` outputs, quantile
balancing, index routing maps (``map_type="index"``), dropping tokens (``num_out_tokens``
below the routed rows), and every ``GroupedLinear`` option besides ``bias``,
``params_dtype``, ``init_method``, ``device`` and ``name``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from fp8lab import checks
from fp8lab.reference.modules import _device, _GemmModule, _init_weight

__all__ = [
    "GroupedLinear",
    "fused_compute_score_for_moe_aux_loss",
    "fused_moe_aux_loss",
    "fused_topk_with_score_function",
    "moe_permute",
    "moe_permute_and_pad_with_probs",
    "moe_permute_with_probs",
    "moe_unpermute",
]

SCORE_FUNCTIONS = ("softmax", "sigmoid")


def _refuse(what: str) -> None:
    raise NotImplementedError(
        f"{what} is not modelled by fp8lab's MoE stand-ins; use Transformer Engine on a GPU"
    )


def _check_logits(logits, topk: int) -> int:
    checks.tensor("logits", logits, dims=2, floating=True)
    if logits.dtype == torch.float64:
        raise ValueError("Current TE does not support float64 router type.")
    return checks.integer("topk", topk, maximum=logits.shape[-1])


# --- router ------------------------------------------------------------------------------------


def _scores(logits32: torch.Tensor, score_function: str) -> torch.Tensor:
    if score_function == "softmax":
        return torch.softmax(logits32, dim=-1)
    return torch.sigmoid(logits32)


def fused_topk_with_score_function(
    logits: torch.Tensor,
    topk: int,
    use_pre_softmax: bool,
    num_groups: int | None,
    group_topk: int | None,
    scaling_factor: float | None,
    score_function: str,
    expert_bias: torch.Tensor | None,
    routing_map_format="bytemap",
    topk_indices: torch.Tensor | None = None,
    qb_histogram: torch.Tensor | None = None,
    qb_bin_bounds: torch.Tensor | None = None,
    qb_histogram_mode: str | None = None,
):
    """``(probs, routing_map)``: each token's top-``topk`` experts and their weights.

    ``probs`` ``[T, E]`` has the logits' dtype and zeros off the chosen experts;
    ``routing_map`` ``[T, E]`` is bool. Softmax: with ``use_pre_softmax`` the softmax over all
    experts is taken first and the top-k kept, else the top-k logits are chosen and the
    softmax taken over them only (weights that sum to 1). Sigmoid: the top-k sigmoid scores
    (chosen with ``expert_bias`` added, weighted without it), normalised to sum 1 when
    ``topk > 1``. ``scaling_factor`` multiplies the weights."""
    topk = _check_logits(logits, topk)
    checks.choice("score_function", score_function, SCORE_FUNCTIONS + ("sqrtsoftplus",))
    if score_function == "sqrtsoftplus":
        _refuse("score_function='sqrtsoftplus'")
    if num_groups is not None or group_topk is not None:
        _refuse("grouped top-k (num_groups, group_topk)")
    if routing_map_format not in ("bytemap", 0):
        _refuse(f"routing_map_format={routing_map_format!r}")
    if topk_indices is not None or qb_histogram is not None or qb_bin_bounds is not None:
        _refuse("topk_indices and quantile balancing (qb_*)")
    if qb_histogram_mode is not None:
        _refuse("quantile balancing (qb_histogram_mode)")
    checks.flag("use_pre_softmax", use_pre_softmax)
    if expert_bias is not None and score_function != "sigmoid":
        raise ValueError("expert_bias: used with score_function='sigmoid' only")
    logits32 = logits.float()
    if score_function == "softmax":
        if use_pre_softmax:
            weights, index = torch.topk(torch.softmax(logits32, dim=-1), topk, dim=-1)
        else:
            top, index = torch.topk(logits32, topk, dim=-1)
            weights = torch.softmax(top, dim=-1)
    else:
        scores = torch.sigmoid(logits32)
        chooser = scores if expert_bias is None else scores + expert_bias.float()
        index = torch.topk(chooser, topk, dim=-1).indices
        weights = torch.gather(scores, 1, index)
        if topk > 1:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    if scaling_factor:
        weights = weights * scaling_factor
    probs = torch.zeros_like(logits32).scatter(1, index, weights).to(logits.dtype)
    routing_map = torch.zeros_like(logits32, dtype=torch.bool).scatter(1, index, True)
    return probs, routing_map


def fused_compute_score_for_moe_aux_loss(
    logits: torch.Tensor, topk: int, score_function: str, routing_map_format="bytemap"
):
    """``(routing_map, scores)`` for the load-balancing loss: ``scores`` ``[T, E]`` in FP32
    over *all* experts (softmax; or sigmoid normalised to sum 1 when ``topk > 1``), and the
    top-k routing map they give."""
    topk = _check_logits(logits, topk)
    checks.choice("score_function", score_function, SCORE_FUNCTIONS + ("sqrtsoftplus",))
    if score_function == "sqrtsoftplus":
        _refuse("score_function='sqrtsoftplus'")
    if routing_map_format not in ("bytemap", 0):
        _refuse(f"routing_map_format={routing_map_format!r}")
    scores = _scores(logits.float(), score_function)
    if score_function == "sigmoid" and topk > 1:
        scores = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)
    index = torch.topk(scores, topk, dim=-1).indices
    routing_map = torch.zeros_like(scores, dtype=torch.bool).scatter(1, index, True)
    return routing_map, scores


def fused_moe_aux_loss(
    probs: torch.Tensor,
    tokens_per_expert: torch.Tensor,
    total_num_tokens: int,
    num_experts: int,
    topk: int,
    coeff: float,
) -> torch.Tensor:
    """The switch-transformer load-balancing loss, as TE computes it::

        coeff * E / (k * T**2) * sum_e (sum_t probs[t, e]) * tokens_per_expert[e]

    It is ``coeff`` when every expert gets the same share of tokens and of probability, and
    grows as the router favours a few experts. A scalar in ``probs``' dtype."""
    checks.tensor("probs", probs, dims=2, floating=True)
    checks.tensor("tokens_per_expert", tokens_per_expert, dims=1)
    if isinstance(total_num_tokens, torch.Tensor):
        _refuse("a tensor total_num_tokens (the CUDA-graph path)")
    total = checks.integer("total_num_tokens", total_num_tokens)
    experts = checks.integer("num_experts", num_experts)
    topk = checks.integer("topk", topk, maximum=experts)
    coeff = checks.number("coeff", coeff, non_negative=True)
    if probs.shape[1] != experts or tokens_per_expert.shape[0] != experts:
        raise ValueError(
            f"probs {tuple(probs.shape)} and tokens_per_expert "
            f"{tuple(tokens_per_expert.shape)}: need num_experts={experts} columns"
        )
    factor = experts * coeff / (topk * total * total)
    per_expert = probs.float().sum(dim=0)  # [E]
    loss = (per_expert * tokens_per_expert.float()).sum() * factor
    return loss.to(probs.dtype)


# --- permutation -------------------------------------------------------------------------------


def _routed(routing_map: torch.Tensor):
    """``(experts, tokens)`` of every routed pair, expert by expert, tokens ascending."""
    checks.tensor("routing_map", routing_map, dims=2)
    experts, tokens = routing_map.bool().t().nonzero(as_tuple=True)
    return experts, tokens


def _row_id_map(tokens, experts, rows, num_tokens: int, num_experts: int) -> torch.Tensor:
    """TE's layout ``[T, 2E + 1]``: a token's destination rows, then their experts, then how
    many experts it went to; -1 where unused."""
    row_id_map = torch.full(
        (num_tokens, 2 * num_experts + 1), -1, dtype=torch.int32, device=tokens.device
    )
    routed = torch.bincount(tokens, minlength=num_tokens)
    order = torch.argsort(tokens * (rows.numel() + 1) + rows)  # by token, then row
    starts = torch.cumsum(routed, 0) - routed
    slot = torch.arange(tokens.numel(), device=tokens.device) - starts[tokens[order]]
    row_id_map[tokens[order], slot] = rows[order].int()
    row_id_map[tokens[order], num_experts + slot] = experts[order].int()
    row_id_map[:, -1] = routed.int()
    return row_id_map


def _permute(inp, routing_map, num_out_tokens, probs, pad_offsets):
    checks.tensor("inp", inp, dims=2)
    experts, tokens = _routed(routing_map)
    if inp.shape[0] != routing_map.shape[0]:
        raise ValueError(
            f"Permute not possible: inp.size(0) ({inp.shape[0]}) must match "
            f"routing_map.size(0) ({routing_map.shape[0]})."
        )
    num_out_tokens = checks.integer("num_out_tokens", num_out_tokens)
    rows = torch.arange(tokens.numel(), device=inp.device)
    placed = rows if pad_offsets is None else rows + pad_offsets.to(inp.device)[experts]
    needed = int(placed.max()) + 1 if placed.numel() else 0
    if num_out_tokens < needed:
        _refuse(f"dropping tokens (num_out_tokens={num_out_tokens} < {needed} routed rows)")
    output = inp.new_zeros(num_out_tokens, inp.shape[1])
    output = output.index_put((placed,), inp[tokens])
    permuted_probs = None
    if probs is not None:
        permuted_probs = probs.new_zeros(num_out_tokens)
        permuted_probs = permuted_probs.index_put((placed,), probs[tokens, experts])
    row_id_map = _row_id_map(tokens, experts, rows, *routing_map.shape)
    return output, row_id_map, permuted_probs


def moe_permute(inp, routing_map, num_out_tokens: int, max_token_num: int = -1,
                map_type: str = "mask"):
    """``(permuted, row_id_map)``: the rows of ``inp`` ``[T, H]`` copied once per expert
    each token was routed to, grouped expert by expert (``[num_out_tokens, H]``)."""
    checks.choice("map_type", map_type, ("mask", "index"))
    if map_type == "index":
        _refuse("map_type='index'")
    output, row_id_map, _ = _permute(inp, routing_map, num_out_tokens, None, None)
    return output, row_id_map


def moe_permute_with_probs(inp, probs, routing_map, num_out_tokens: int):
    """``(permuted, permuted_probs, row_id_map)``: :func:`moe_permute`, and each permuted
    row's router weight beside it."""
    checks.tensor("probs", probs, dims=2, floating=True)
    output, row_id_map, permuted_probs = _permute(
        inp, routing_map, num_out_tokens, probs, None
    )
    return output, permuted_probs, row_id_map


def moe_permute_and_pad_with_probs(inp, probs, routing_map, tokens_per_expert, align_size):
    """:func:`moe_permute_with_probs` with each expert's rows padded by zero rows to a
    multiple of ``align_size``; returns ``(permuted, permuted_probs, row_id_map, pad_offsets,
    padded_tokens_per_expert)``, ``pad_offsets`` None when nothing needed padding."""
    if tokens_per_expert is None:
        raise ValueError(
            "tokens_per_expert must be provided to the fused permute padding function."
        )
    checks.tensor("probs", probs, dims=2, floating=True)
    align_size = checks.integer("align_size", align_size)
    tokens_per_expert = tokens_per_expert.to(inp.device)
    target = (torch.ceil(tokens_per_expert / align_size) * align_size).long()
    if torch.equal(tokens_per_expert, target):
        pad_offsets = None
    else:
        cum_pad = torch.cumsum(target - tokens_per_expert, dim=0)
        pad_offsets = torch.cat([cum_pad.new_zeros(1), cum_pad[:-1]])
    output, row_id_map, permuted_probs = _permute(
        inp, routing_map, int(target.sum()), probs, pad_offsets
    )
    return output, permuted_probs, row_id_map, pad_offsets, target


def moe_unpermute(inp, row_id_map, merging_probs=None, restore_shape=None, map_type="mask",
                  probs=None, pad_offsets=None):
    """``[T, H]``: each token's rows of ``inp`` summed back into one (in FP32, weighted by
    ``merging_probs`` ``[T, E]`` when given), in ``inp``'s dtype; padding rows are skipped."""
    checks.choice("map_type", map_type, ("mask", "index"))
    if map_type == "index":
        _refuse("map_type='index'")
    if probs is not None:
        if merging_probs is not None:
            raise ValueError(
                "Both merging_probs and probs kwarg are provided. probs is deprecated."
            )
        merging_probs = probs
    checks.tensor("inp", inp, dims=2)
    checks.tensor("row_id_map", row_id_map, dims=2)
    num_tokens = row_id_map.shape[0]
    num_experts = (row_id_map.shape[1] - 1) // 2
    hidden = inp.shape[1] if restore_shape is None else restore_shape[-1]
    if restore_shape is not None and restore_shape[0] != num_tokens:
        raise ValueError(f"restore_shape={tuple(restore_shape)}: needs {num_tokens} rows")
    slots = torch.arange(num_experts, device=inp.device)
    used = slots < row_id_map[:, -1:].long()  # [T, E]
    tokens = torch.arange(num_tokens, device=inp.device)[:, None].expand_as(used)[used]
    rows = row_id_map[:, :num_experts][used].long()
    experts = row_id_map[:, num_experts:2 * num_experts][used].long()
    if pad_offsets is not None:
        rows = rows + pad_offsets.to(inp.device)[experts]
    values = inp[rows].float()
    if merging_probs is not None:
        values = values * merging_probs[tokens, experts].float()[:, None]
    out = torch.zeros(num_tokens, hidden, dtype=torch.float32, device=inp.device)
    return out.index_add(0, tokens, values).to(inp.dtype)


# --- GroupedLinear -----------------------------------------------------------------------------


def _default(name: str, value) -> bool:
    """Whether a GroupedLinear argument the stand-in ignores has its harmless value."""
    if name == "tp_size":
        return value == 1 and not isinstance(value, bool)
    return value is None or value is False


class GroupedLinear(_GemmModule):
    """``te.GroupedLinear(num_gemms, in_features, out_features)``: ``num_gemms`` weights
    (``weight0`` ... with ``bias0`` ...) applied to consecutive row blocks of the input, of
    ``m_splits`` rows each. Under ``autocast`` each GEMM is an FP8 GEMM of the CPU reference
    with its own scaling state, as each of TE's GEMMs has (``fp8_meta_index`` per GEMM)."""

    def __init__(self, num_gemms: int, in_features: int, out_features: int, *,
                 bias: bool = True, params_dtype: torch.dtype | None = None,
                 init_method=None, device=None, name: str | None = None, **extra):
        super().__init__()
        unsupported = {k: v for k, v in extra.items() if not _default(k, v)}
        if unsupported:
            _refuse(f"GroupedLinear({', '.join(f'{k}={v!r}' for k, v in unsupported.items())})")
        self.num_gemms = checks.integer("num_gemms", num_gemms)
        self.in_features = checks.integer("in_features", in_features)
        self.out_features = checks.integer("out_features", out_features)
        self.use_bias, self.name = checks.flag("bias", bias), name
        dtype = params_dtype or torch.get_default_dtype()
        device = _device(device)
        self._setup_gemm_state(False)
        for i in range(self.num_gemms):
            weight = _init_weight((out_features, in_features), dtype, device, init_method)
            self.register_parameter(f"weight{i}", weight)
            b = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device))
            self.register_parameter(f"bias{i}", b if bias else None)

    def forward(self, inp: torch.Tensor, m_splits, is_first_microbatch=None):
        checks.tensor("inp", inp, floating=True)
        splits = m_splits.tolist() if isinstance(m_splits, torch.Tensor) else list(m_splits)
        if len(splits) != self.num_gemms:
            raise ValueError(
                f"Shape of splits tensor (({len(splits)},)) does not match number of GEMMs "
                f"({self.num_gemms})."
            )
        if inp.shape[-1] != self.in_features:
            raise ValueError(f"inp {tuple(inp.shape)}: last dim must be {self.in_features}")
        x2d = inp.reshape(-1, self.in_features)
        if sum(splits) != x2d.shape[0] or min(splits) < 0:
            raise ValueError(f"m_splits={splits}: must be >= 0 and sum to {x2d.shape[0]} rows")
        outputs = []
        for i, x_i in enumerate(torch.split(x2d, splits)):
            weight, bias = getattr(self, f"weight{i}"), getattr(self, f"bias{i}")
            if x_i.shape[0] == 0:  # an expert without tokens: no GEMM, an empty block
                outputs.append(F.linear(x_i, weight.to(x_i.dtype)))
                continue
            outputs.append(self._gemm(x_i, weight, bias, f"weight{i}", is_first_microbatch))
        out = torch.cat(outputs) if outputs else x2d.new_zeros(0, self.out_features)
        return out.reshape(*inp.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"num_gemms={self.num_gemms}, in_features={self.in_features}, "
                f"out_features={self.out_features}, bias={self.use_bias}")

