"""``TransformerLayer`` of TE 2.20 (CPU reference), mirroring
``transformer_engine/pytorch/transformer.py``.

A pre-norm layer: ``x + dropout(proj(attention(LayerNormLinear_qkv(x))))``, then
``+ dropout(LayerNormMLP(.))``, with TE's defaults: **causal** self-attention and
**0.1** dropout after attention and MLP (``hidden_dropout``) and on the attention
probabilities (``attention_dropout``). Submodules and parameter names follow TE
(``self_attention.layernorm_qkv``, ``self_attention.core_attention``,
``self_attention.proj``, ``layernorm_mlp``), so ``state_dict``s move between the two.

With ``tp_group`` of several ranks and ``set_parallel_mode=True``, QKV and FC1 are
column-parallel, the attention output projection and FC2 row-parallel, each rank holds
``A / tp`` heads, and with ``sequence_parallel=True`` the layer takes and returns its
``S / tp`` slice of the sequence (:mod:`fp8lab.reference.parallel`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fp8lab.reference.attention import DotProductAttention, apply_rotary_pos_emb, split_qkv
from fp8lab.reference.modules import (
    LayerNormLinear,
    LayerNormMLP,
    Linear,
    _refuse,
    _refuse_unknown,
    check_parallel,
)


class _SelfAttention(nn.Module):
    """The attention block of ``TransformerLayer`` (TE's ``MultiheadAttention`` with an input
    norm)."""

    def __init__(self, settings: dict, tp_size: int, sequence_parallel: bool):
        """``settings``: the ``TransformerLayer``'s arguments by name; ``tp_size`` ranks."""
        super().__init__()
        heads, set_parallel_mode = settings["num_attention_heads"], settings["set_parallel_mode"]
        hidden_size, groups = settings["hidden_size"], settings["num_gqa_groups"] or heads
        kv_channels = settings["kv_channels"] or hidden_size // heads
        tensor_parallel = {
            "tp_group": settings["tp_group"],
            "tp_size": tp_size,
            "sequence_parallel": sequence_parallel,
        }
        self.heads, self.groups, self.head_dim = heads // tp_size, groups // tp_size, kv_channels
        self.interleaved = settings["qkv_weight_interleaved"] and settings["fuse_qkv_params"]
        q_size, kv_size = heads * kv_channels, groups * kv_channels
        split = (
            None
            if settings["fuse_qkv_params"]
            else {"query": q_size, "key": kv_size, "value": kv_size}
        )
        gemm = {k: settings[k] for k in ("bias", "params_dtype", "device")} | tensor_parallel
        gemm["fuse_wgrad_accumulation"] = settings["fuse_wgrad_accumulation"]
        self.layernorm_qkv = LayerNormLinear(
            hidden_size,
            q_size + 2 * kv_size,
            eps=settings["layernorm_epsilon"],
            init_method=settings["init_method"],
            normalization=settings["normalization"],
            parameters_split=split,
            zero_centered_gamma=settings["zero_centered_gamma"],
            parallel_mode="column" if set_parallel_mode else None,
            **gemm,
        )
        self.core_attention = DotProductAttention(
            heads,
            kv_channels,
            num_gqa_groups=groups,
            attention_dropout=settings["attention_dropout"],
            attn_mask_type=settings["self_attn_mask_type"],
            layer_number=settings["layer_number"],
            qkv_format=settings["attn_input_format"],
            **tensor_parallel,
        )
        self.proj = Linear(
            q_size,
            hidden_size,
            init_method=settings["output_layer_init_method"],
            return_bias=True,
            parallel_mode="row" if set_parallel_mode else None,
            **gemm,
        )

    def forward(self, x, mask_type, rotary_pos_emb, is_first_microbatch):
        mixed = self.layernorm_qkv(x, is_first_microbatch=is_first_microbatch)
        q, k, v = split_qkv(mixed, self.heads, self.groups, self.head_dim, self.interleaved)
        if rotary_pos_emb is not None:
            freqs_q, freqs_k = (
                rotary_pos_emb if isinstance(rotary_pos_emb, tuple) else (rotary_pos_emb,) * 2
            )
            q, k = apply_rotary_pos_emb(q, freqs_q), apply_rotary_pos_emb(k, freqs_k)
        context = self.core_attention(q, k, v, attn_mask_type=mask_type)
        return self.proj(context, is_first_microbatch=is_first_microbatch)


def _check_layer_arguments(extra: dict, settings: dict) -> int:
    """Refuse what ``TransformerLayer`` does not model (``settings``: its arguments by name);
    returns the tensor-parallel size."""
    extra = {k: v for k, v in extra.items() if not (k.startswith("ub_") and not v)}
    _refuse_unknown("TransformerLayer", extra)
    tp = check_parallel(
        "TransformerLayer",
        settings["tp_group"],
        settings["tp_size"],
        settings["sequence_parallel"],
        set_parallel_mode=settings["set_parallel_mode"],
    )
    _refuse(
        "TransformerLayer",
        **{
            name: (settings[name], allowed)
            for name, allowed in (
                ("apply_residual_connection_post_layernorm", (False,)),
                ("output_layernorm", (False,)),
                ("parallel_attention_mlp", (False,)),
                ("layer_type", ("encoder",)),
                ("drop_path_rate", (0.0, 0)),
                ("rotary_pos_interleaved", (False,)),
                ("self_attn_mask_type", ("causal", "no_mask")),
            )
        },
    )
    hidden_size, heads = settings["hidden_size"], settings["num_attention_heads"]
    if hidden_size % heads and settings["kv_channels"] is None:
        raise ValueError(
            f"num_attention_heads={heads} must divide hidden_size={hidden_size} "
            "(or give kv_channels)"
        )
    if not 0.0 <= settings["hidden_dropout"] < 1.0:
        raise ValueError(f"hidden_dropout={settings['hidden_dropout']}: must be in [0, 1)")
    groups = settings["num_gqa_groups"] or heads
    if heads % groups:
        raise ValueError(f"num_gqa_groups={groups} must divide num_attention_heads={heads}")
    return tp


def _make_layernorm_mlp(settings: dict, tp: int, sequence_parallel: bool) -> LayerNormMLP:
    """The MLP block (norm, FC1, activation, FC2) of a ``TransformerLayer`` of these
    ``settings``."""
    return LayerNormMLP(
        settings["hidden_size"],
        settings["ffn_hidden_size"],
        eps=settings["layernorm_epsilon"],
        return_bias=True,
        tp_size=tp,
        sequence_parallel=sequence_parallel,
        **{
            name: settings[name]
            for name in (
                "bias",
                "normalization",
                "activation",
                "activation_params",
                "init_method",
                "output_layer_init_method",
                "fuse_wgrad_accumulation",
                "params_dtype",
                "zero_centered_gamma",
                "device",
                "tp_group",
                "set_parallel_mode",
            )
        },
    )


class TransformerLayer(nn.Module):
    """``te.TransformerLayer(hidden_size, ffn_hidden_size, num_attention_heads, ...)``; input ``[S,
    B, H]``."""

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        num_attention_heads: int,
        num_gqa_groups: int | None = None,
        layernorm_epsilon: float = 1e-5,
        hidden_dropout: float = 0.1,
        attention_dropout: float = 0.1,
        init_method=None,
        output_layer_init_method=None,
        layer_number: int | None = None,
        kv_channels: int | None = None,
        self_attn_mask_type: str = "causal",
        tp_group=None,
        tp_size: int = 1,
        params_dtype: torch.dtype | None = None,
        get_rng_state_tracker=None,
        fuse_wgrad_accumulation: bool = False,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
        sequence_parallel: bool = False,
        apply_residual_connection_post_layernorm: bool = False,
        output_layernorm: bool = False,
        parallel_attention_mlp: bool = False,
        layer_type: str = "encoder",
        drop_path_rate: float = 0.0,
        set_parallel_mode: bool = False,
        fuse_qkv_params: bool = False,
        rotary_pos_interleaved: bool = False,
        zero_centered_gamma: bool = False,
        qkv_weight_interleaved: bool = True,
        bias: bool = True,
        activation: str = "gelu",
        activation_params=None,
        normalization: str = "LayerNorm",
        device=None,
        attn_input_format: str = "sbhd",
        name: str | None = None,
        **extra,
    ):
        settings = {k: v for k, v in locals().items() if k not in ("self", "extra", "__class__")}
        super().__init__()
        tp = _check_layer_arguments(extra, settings)
        self.tp_size, self.sequence_parallel = tp, tp > 1 and sequence_parallel
        self.hidden_dropout, self.self_attn_mask_type = hidden_dropout, self_attn_mask_type
        self.self_attention = _SelfAttention(settings, tp, self.sequence_parallel)
        self.layernorm_mlp = _make_layernorm_mlp(settings, tp, self.sequence_parallel)

    def set_context_parallel_group(self, cp_group, cp_global_ranks, cp_stream, cp_comm_type="p2p"):
        """TE splits attention over a context-parallel group here; the reference does not."""
        raise NotImplementedError(
            "context parallelism (set_context_parallel_group) is not modelled by the CPU "
            "reference; use Transformer Engine on GPUs"
        )

    def _residual(self, out, bias, residual):
        if bias is not None:
            out = out + bias
        return residual + F.dropout(out, self.hidden_dropout, self.training)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask=None,
        self_attn_mask_type: str | None = None,
        rotary_pos_emb=None,
        is_first_microbatch: bool | None = None,
        **extra,
    ) -> torch.Tensor:
        _refuse_unknown(
            "TransformerLayer.forward", {k: v for k, v in extra.items() if v is not None}
        )
        mask = self_attn_mask_type or self.self_attn_mask_type
        _refuse(
            "TransformerLayer.forward",
            attention_mask=(attention_mask, (None,)),
            self_attn_mask_type=(mask, ("causal", "no_mask")),
        )
        out, bias = self.self_attention(hidden_states, mask, rotary_pos_emb, is_first_microbatch)
        x = self._residual(out, bias, hidden_states)
        out, bias = self.layernorm_mlp(x, is_first_microbatch=is_first_microbatch)
        return self._residual(out, bias, x)
