"""``DotProductAttention`` and the attention block of ``TransformerLayer`` (CPU reference).

Mirrors ``transformer_engine/pytorch/attention/dot_product_attention`` and
``multi_head_attention.py``: inputs in ``sbhd`` (or ``bshd``) layout, query
``[S, B, A, D]``, key and value ``[S, B, G, D]`` with G groups for GQA (query head h
uses group ``h // (A/G)``), output ``[S, B, A*D]``; masks ``causal`` and ``no_mask``;
softmax scale ``1/sqrt(D)``. The attention itself runs in the input dtype through
``F.scaled_dot_product_attention`` (TE picks FlashAttention or cuDNN kernels; FP8
attention, ``fp8_dpa``, is not modelled).

The fused QKV weight is laid out as TE lays it: with ``qkv_weight_interleaved``
(TE's default when ``fuse_qkv_params=True``) the output splits as
``[G, A/G + 2, D]`` (each group's queries, then its key and value); otherwise as
``[A/G + 2, G, D]``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fp8lab.reference.modules import _refuse, _refuse_unknown, check_parallel

MASK_TYPES = ("causal", "no_mask")
FORMATS = ("sbhd", "bshd")


class DotProductAttention(nn.Module):
    """``te.DotProductAttention(num_attention_heads, kv_channels, num_gqa_groups=None,
    attention_dropout=0.0,
    qkv_format="sbhd", attn_mask_type="causal", ...)``."""

    def __init__(
        self,
        num_attention_heads: int,
        kv_channels: int,
        num_gqa_groups: int | None = None,
        attention_dropout: float = 0.0,
        qkv_format: str = "sbhd",
        attn_mask_type: str = "causal",
        window_size=None,
        sequence_parallel: bool = False,
        tp_size: int = 1,
        get_rng_state_tracker=None,
        tp_group=None,
        layer_number: int | None = None,
        attention_type: str = "self",
        softmax_scale: float | None = None,
        **extra,
    ):
        super().__init__()
        extra = {k: v for k, v in extra.items() if not (k.startswith("cp_") and v is None)}
        _refuse_unknown("DotProductAttention", extra)
        # with tensor parallelism each rank holds num_attention_heads / tp heads, as in TE
        self.tp_size = check_parallel("DotProductAttention", tp_group, tp_size, sequence_parallel)
        _refuse(
            "DotProductAttention",
            qkv_format=(qkv_format, FORMATS),
            attn_mask_type=(attn_mask_type, MASK_TYPES),
            window_size=(window_size, (None, (-1, -1), (-1, 0))),
            attention_type=(attention_type, ("self",)),
        )
        groups = num_gqa_groups or num_attention_heads
        if num_attention_heads % groups:
            raise ValueError(
                f"num_gqa_groups={groups} must divide num_attention_heads={num_attention_heads}"
            )
        if groups % self.tp_size:
            raise ValueError(f"num_gqa_groups={groups} must be divisible by tp_size={self.tp_size}")
        self.num_gqa_groups_per_partition = groups // self.tp_size
        if not 0.0 <= attention_dropout < 1.0:
            raise ValueError(f"attention_dropout={attention_dropout}: must be in [0, 1)")
        self.num_attention_heads, self.num_gqa_groups, self.kv_channels = (
            num_attention_heads,
            groups,
            kv_channels,
        )
        self.attention_dropout, self.qkv_format, self.attn_mask_type = (
            attention_dropout,
            qkv_format,
            attn_mask_type,
        )
        self.softmax_scale = (
            softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(kv_channels)
        )

    def forward(
        self,
        query_layer: torch.Tensor,
        key_layer: torch.Tensor,
        value_layer: torch.Tensor,
        attention_mask=None,
        qkv_format: str | None = None,
        attn_mask_type: str | None = None,
        **extra,
    ) -> torch.Tensor:
        _refuse_unknown(
            "DotProductAttention.forward", {k: v for k, v in extra.items() if v is not None}
        )
        qkv_format = qkv_format or self.qkv_format
        mask = attn_mask_type or self.attn_mask_type
        _refuse(
            "DotProductAttention.forward",
            qkv_format=(qkv_format, FORMATS),
            attn_mask_type=(mask, MASK_TYPES),
            attention_mask=(attention_mask, (None,)),
        )
        heads = self.num_attention_heads // self.tp_size
        if (
            query_layer.shape[-2] != heads
            or key_layer.shape[-2] != self.num_gqa_groups_per_partition
        ):
            raise ValueError(
                f"expected {heads} query heads and {self.num_gqa_groups_per_partition} "
                f"key/value "
                f"groups, got query {tuple(query_layer.shape)} and key {tuple(key_layer.shape)}"
            )
        to_bhsd = (
            (lambda t: t.permute(1, 2, 0, 3))
            if qkv_format == "sbhd"
            else (lambda t: t.permute(0, 2, 1, 3))
        )
        q, k, v = (to_bhsd(t) for t in (query_layer, key_layer, value_layer))
        repeat = self.num_attention_heads // self.num_gqa_groups
        if repeat > 1:
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        context = F.scaled_dot_product_attention(
            q,
            k,
            v,
            dropout_p=self.attention_dropout if self.training else 0.0,
            is_causal=mask == "causal",
            scale=self.softmax_scale,
        )
        if qkv_format == "sbhd":
            context = context.permute(2, 0, 1, 3)
        else:
            context = context.permute(0, 2, 1, 3)
        return context.reshape(*context.shape[:2], -1)


def split_qkv(mixed: torch.Tensor, heads: int, groups: int, head_dim: int, interleaved: bool):
    """Split the fused QKV projection ``[S, B, (A + 2G) D]`` as TE's MultiheadAttention does."""
    per_group = heads // groups
    if interleaved:
        view = mixed.view(*mixed.shape[:-1], groups, per_group + 2, head_dim)
        q, k, v = torch.split(view, [per_group, 1, 1], dim=-2)
    else:
        view = mixed.view(*mixed.shape[:-1], per_group + 2, groups, head_dim)
        q, k, v = torch.split(view, [per_group, 1, 1], dim=-3)
    shape = mixed.shape[:-1]
    return (
        q.reshape(*shape, -1, head_dim),
        k.reshape(*shape, -1, head_dim),
        v.reshape(*shape, -1, head_dim),
    )


def apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """TE's non-interleaved RoPE: ``freqs`` is ``[S, 1, 1, D]`` of angles, applied to ``t: [S, B, H,
    D]``."""
    cos, sin = freqs.cos().to(t.dtype), freqs.sin().to(t.dtype)
    first, second = t.chunk(2, dim=-1)
    return t * cos + torch.cat([-second, first], dim=-1) * sin
