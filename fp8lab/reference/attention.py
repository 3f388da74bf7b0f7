"""``DotProductAttention`` and the attention block of ``TransformerLayer`` (CPU reference).

Mirrors ``transformer_engine/pytorch/attention/dot_product_attention`` and
``multi_head_attention.py``: inputs in ``sbhd`` (or ``bshd``) layout, query
``[S, B, A, D]``, key and value ``[S, B, G, D]`` with G groups for GQA (query head h
uses group ``h // (A/G)``), output ``[S, B, A*D]``; softmax scale ``1/sqrt(D)``. The attention
itself runs in the input dtype through ``F.scaled_dot_product_attention`` (TE picks cuDNN,
FlashAttention or its unfused PyTorch path; the reference has one path).

Masks, as in TE: ``no_mask``, ``causal`` (diagonal at the top left of the ``[S_q, S_kv]``
scores) and ``causal_bottom_right`` (at the bottom right; the same as ``causal`` when
S_q = S_kv), each with an optional sliding window ``window_size=(left, right)``: query i
attends to keys ``i + S_kv - S_q - left .. i + S_kv - S_q + right`` when the diagonal is at
the bottom right, ``i - left .. i + right`` at the top left; -1 is unlimited. ``window_size``
is checked and rewritten exactly as TE's ``check_set_window_size`` does (the same warnings,
the same assertion), and ``bottom_right_diagonal`` resolved as TE resolves it (forced to the
mask's own alignment for the causal masks, bottom right by default for ``no_mask``). The
window itself follows TE's ``get_full_mask``.

Not modelled (``NotImplementedError`` naming the argument): padding masks and arbitrary masks
(``attention_mask``, ``cu_seqlens_*``), softcapping, other softmax types, FP8 attention
(``fp8_dpa``, refused by the reference's ``autocast``), context parallelism, and query rows
left with no key to attend to.

The fused QKV weight is laid out as TE lays it: with ``qkv_weight_interleaved``
(TE's default when ``fuse_qkv_params=True``) the output splits as
``[G, A/G + 2, D]`` (each group's queries, then its key and value); otherwise as
``[A/G + 2, G, D]``.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from fp8lab.reference.modules import _refuse, _refuse_unknown, check_parallel

MASK_TYPES = ("causal", "no_mask", "causal_bottom_right")
TE_MASK_TYPES = (  # transformer_engine.pytorch.constants.AttnMaskTypes
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
    "arbitrary",
)
FORMATS = ("sbhd", "bshd")


def _mask_type(attn_mask_type: str) -> str:
    """TE's spelling rules: ``"padding,causal"`` -> ``"padding_causal"``, and so on."""
    if not isinstance(attn_mask_type, str):
        raise TypeError(f"attn_mask_type={attn_mask_type!r}: must be a string")
    attn_mask_type = attn_mask_type.replace(",", "_")
    return "padding_causal" if attn_mask_type == "causal_padding" else attn_mask_type


def check_set_window_size(attn_mask_type: str, window_size=None):
    """TE's ``dpa_utils.check_set_window_size``: validate ``window_size`` against the mask, and
    rewrite it where TE rewrites it (with TE's warning)."""
    orig = None if window_size is None else tuple(window_size)
    if "causal" in attn_mask_type:
        if orig is None:
            return (-1, 0)
        if orig == (-1, -1) or (orig[0] >= 0 and orig[1] != 0):
            warnings.warn(
                "window_size should be (-1, 0) or (>=0, 0) for attn_mask_type=" + attn_mask_type,
                stacklevel=3,
            )
            return (orig[0], 0)
        if orig != (-1, 0) and (orig[0] < 0 or orig[1] != 0):
            raise AssertionError(
                "window_size should be (-1, 0) or (>=0, 0) for attn_mask_type=" + attn_mask_type
            )
        return orig
    if attn_mask_type in ("no_mask", "padding", "arbitrary"):
        if orig is None:
            return (-1, -1)
        if orig == (-1, 0):
            warnings.warn(
                "window_size should be (-1, -1) or (>=0, >=0) for attn_mask_type=" + attn_mask_type,
                stacklevel=3,
            )
            return (-1, -1)
        if orig != (-1, -1) and (orig[0] < 0 or orig[1] < 0):
            raise AssertionError(
                "window_size should be (-1, -1) or (>=0, >=0) for attn_mask_type=" + attn_mask_type
            )
        return orig
    raise AssertionError("Invalid attn_mask_type: " + attn_mask_type)


def _check_mask_type(module: str, attn_mask_type: str) -> str:
    """TE's checks (the forward's assertion; the constructor's comes from the window check),
    then the reference's refusal of the mask types it does not model."""
    attn_mask_type = _mask_type(attn_mask_type)
    if module.endswith("forward") and attn_mask_type not in TE_MASK_TYPES:
        raise AssertionError(f"Attention mask type {attn_mask_type} is not supported!")
    check_set_window_size(attn_mask_type, None)  # asserts "Invalid attn_mask_type: ..."
    _refuse(module, attn_mask_type=(attn_mask_type, MASK_TYPES))
    return attn_mask_type


def _bottom_right(attn_mask_type: str, bottom_right_diagonal: bool | None) -> bool:
    """TE's resolution: top left for ``causal``, bottom right for ``causal_bottom_right`` and, by
    default, for ``no_mask``."""
    if attn_mask_type in ("causal", "padding_causal"):
        return False
    if bottom_right_diagonal is None or "bottom_right" in attn_mask_type:
        return True
    return bottom_right_diagonal


def allowed_keys(
    seq_q: int,
    seq_kv: int,
    attn_mask_type: str,
    window_size: tuple[int, int],
    bottom_right: bool,
    device=None,
) -> torch.Tensor | None:
    """``[S_q, S_kv]`` booleans, True where query i may attend to key j (TE's ``get_full_mask``
    for the mask types the reference models); ``None`` when every pair is allowed."""
    left, right = window_size
    if "causal" in attn_mask_type:
        right = 0
    if attn_mask_type == "no_mask" and (left, right) == (-1, -1):
        return None
    unlimited = seq_q + seq_kv  # -1 means no limit: farther than any query-key distance here
    left = unlimited if left == -1 else left
    right = unlimited if right == -1 else right
    offset = seq_kv - seq_q if bottom_right else 0
    distance = torch.arange(seq_q, device=device)[:, None] - torch.arange(seq_kv, device=device)
    # TE: swa_left = i - j + offset - left <= 0 and swa_right = i - j + offset + right >= 0
    return (distance + offset - left <= 0) & (distance + offset + right >= 0)


def _gqa_groups(num_attention_heads: int, num_gqa_groups: int | None, tp_size: int) -> int:
    """G, checked as TE checks it: dividing A, and divisible by the tensor-parallel size."""
    groups = num_gqa_groups or num_attention_heads
    if num_attention_heads % groups:
        raise ValueError(
            f"num_gqa_groups={groups} must divide num_attention_heads={num_attention_heads}"
        )
    if groups % tp_size:
        raise ValueError(f"num_gqa_groups={groups} must be divisible by tp_size={tp_size}")
    return groups


def _to_bhsd(qkv_format: str, t: torch.Tensor) -> torch.Tensor:
    """``[S, B, heads, D]`` (``sbhd``) or ``[B, S, heads, D]`` (``bshd``) to
    ``[B, heads, S, D]``."""
    return t.permute(1, 2, 0, 3) if qkv_format == "sbhd" else t.permute(0, 2, 1, 3)


def _from_bhsd(qkv_format: str, context: torch.Tensor) -> torch.Tensor:
    """``[B, A, S, D]`` -> ``[S, B, A*D]`` (``sbhd``) or ``[B, S, A*D]`` (``bshd``)."""
    order = (2, 0, 1, 3) if qkv_format == "sbhd" else (0, 2, 1, 3)
    context = context.permute(*order)
    return context.reshape(*context.shape[:2], -1)


def _sdpa_mask(seq_q: int, seq_kv: int, mask: str, window, bottom_right: bool, device):
    """``(attn_mask, is_causal)`` for ``F.scaled_dot_product_attention``; refuses query rows
    left with no key to attend to."""
    allowed = allowed_keys(seq_q, seq_kv, mask, window, bottom_right, device=device)
    is_causal = False
    if allowed is not None and seq_q == seq_kv and window[0] in (-1,) and "causal" in mask:
        allowed, is_causal = None, True  # the plain causal mask: SDPA's own
    if allowed is not None and not bool(allowed.any(dim=-1).all()):
        raise NotImplementedError(
            f"DotProductAttention(attn_mask_type={mask!r}, window_size={window}) leaves query "
            f"rows with no key to attend to (S_q={seq_q}, S_kv={seq_kv}); not modelled by "
            "the CPU reference"
        )
    return allowed, is_causal


class DotProductAttention(nn.Module):
    """``te.DotProductAttention(num_attention_heads, kv_channels, num_gqa_groups=None,
    attention_dropout=0.0, qkv_format="sbhd", attn_mask_type="causal", window_size=None,
    bottom_right_diagonal=None, ...)``."""

    def __init__(
        self,
        num_attention_heads: int,
        kv_channels: int,
        num_gqa_groups: int | None = None,
        attention_dropout: float = 0.0,
        qkv_format: str = "sbhd",
        attn_mask_type: str = "causal",
        window_size=None,
        bottom_right_diagonal: bool | None = None,
        softcap: float = 0.0,
        sequence_parallel: bool = False,
        tp_size: int = 1,
        get_rng_state_tracker=None,
        tp_group=None,
        layer_number: int | None = None,
        attention_type: str = "self",
        softmax_scale: float | None = None,
        softmax_type: str = "vanilla",
        return_max_logit: bool = False,
        **extra,
    ):
        super().__init__()
        extra = {k: v for k, v in extra.items() if not (k.startswith("cp_") and v is None)}
        _refuse_unknown("DotProductAttention", extra)
        # with tensor parallelism each rank holds num_attention_heads / tp heads, as in TE
        self.tp_size = check_parallel("DotProductAttention", tp_group, tp_size, sequence_parallel)
        attn_mask_type = _check_mask_type("DotProductAttention", attn_mask_type)
        _refuse(
            "DotProductAttention",
            qkv_format=(qkv_format, FORMATS),
            attention_type=(attention_type, ("self", "cross")),
            softcap=(softcap, (0.0, 0)),
            softmax_type=(softmax_type, ("vanilla",)),
            return_max_logit=(return_max_logit, (False,)),
        )
        groups = _gqa_groups(num_attention_heads, num_gqa_groups, self.tp_size)
        self.num_gqa_groups_per_partition = groups // self.tp_size
        if not 0.0 <= attention_dropout < 1.0:
            raise ValueError(f"attention_dropout={attention_dropout}: must be in [0, 1)")
        self.num_attention_heads, self.num_gqa_groups = num_attention_heads, groups
        self.kv_channels, self.attention_dropout = kv_channels, attention_dropout
        self.qkv_format, self.attn_mask_type = qkv_format, attn_mask_type
        self.window_size = check_set_window_size(attn_mask_type, window_size)
        self.bottom_right_diagonal = bottom_right_diagonal
        self.softmax_scale = (
            softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(kv_channels)
        )

    def _call_options(self, attention_mask, qkv_format, attn_mask_type, window_size, softcap):
        """The forward's layout and mask (its arguments over the constructor's, as in TE); the
        refusals of what the reference does not model."""
        qkv_format = qkv_format or self.qkv_format
        mask = (
            self.attn_mask_type
            if attn_mask_type is None
            else _check_mask_type("DotProductAttention.forward", attn_mask_type)
        )
        _refuse(
            "DotProductAttention.forward",
            qkv_format=(qkv_format, FORMATS),
            attention_mask=(attention_mask, (None,)),
            softcap=(softcap, (None, 0.0, 0)),
        )
        window = check_set_window_size(
            mask, self.window_size if window_size is None else window_size
        )
        return qkv_format, mask, window

    def _check_heads(self, query_layer: torch.Tensor, key_layer: torch.Tensor) -> None:
        heads = self.num_attention_heads // self.tp_size
        if (
            query_layer.shape[-2] != heads
            or key_layer.shape[-2] != self.num_gqa_groups_per_partition
        ):
            raise ValueError(
                f"expected {heads} query heads and {self.num_gqa_groups_per_partition} key/value "
                f"groups, got query {tuple(query_layer.shape)} and key {tuple(key_layer.shape)}"
            )

    def forward(
        self,
        query_layer: torch.Tensor,
        key_layer: torch.Tensor,
        value_layer: torch.Tensor,
        attention_mask=None,
        qkv_format: str | None = None,
        attn_mask_type: str | None = None,
        window_size=None,
        bottom_right_diagonal: bool | None = None,
        softcap: float | None = None,
        **extra,
    ) -> torch.Tensor:
        _refuse_unknown(
            "DotProductAttention.forward", {k: v for k, v in extra.items() if v is not None}
        )
        qkv_format, mask, window = self._call_options(
            attention_mask, qkv_format, attn_mask_type, window_size, softcap
        )
        bottom_right = _bottom_right(
            mask,
            self.bottom_right_diagonal if bottom_right_diagonal is None else bottom_right_diagonal,
        )
        self._check_heads(query_layer, key_layer)
        q, k, v = (_to_bhsd(qkv_format, t) for t in (query_layer, key_layer, value_layer))
        repeat = self.num_attention_heads // self.num_gqa_groups
        if repeat > 1:
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        allowed, is_causal = _sdpa_mask(
            q.shape[-2], k.shape[-2], mask, window, bottom_right, q.device
        )
        context = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=allowed,
            dropout_p=self.attention_dropout if self.training else 0.0,
            is_causal=is_causal,
            scale=self.softmax_scale,
        )  # [B, A, S, D]
        return _from_bhsd(qkv_format, context)


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
