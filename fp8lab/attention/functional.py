"""One attention problem, its mask, and the plain-PyTorch attention the backends are checked
against.

:class:`AttentionShape` names a problem in the book's notation (B, S, A, D and G key/value
groups, a mask in TE's names, a sliding window, dropout), counts its FLOPs through
:mod:`fp8lab.flops` and makes its inputs in TE's ``bshd`` layout. :func:`explicit_attention` is
the "standard" attention written out (matmuls, a mask and a softmax: the full score matrix is
stored), the FP32 yardstick of chapter 05's accuracy checks and its memory-hungry baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fp8lab import checks, flops
from fp8lab.devices import resolve_device

__all__ = ["AttentionShape", "explicit_attention", "window_mask"]


@dataclass(frozen=True)
class AttentionShape:
    """One attention problem: B sequences of S tokens, A query heads of size D, G key/value
    groups, a mask (TE's names), an optional sliding window and the attention dropout."""

    batch: int
    seq: int
    heads: int
    head_dim: int
    groups: int | None = None
    mask: str = "causal"
    window_size: tuple[int, int] | None = None
    dropout: float = 0.0

    def __post_init__(self):
        for name in ("batch", "seq", "heads", "head_dim"):
            checks.integer(name, getattr(self, name))
        if self.groups is not None and self.heads % checks.integer("groups", self.groups):
            raise ValueError(f"groups={self.groups}: must divide heads={self.heads}")
        window = flops.attention_window(self.mask, self.window_size)
        if self.window_size is not None:
            object.__setattr__(self, "window_size", window)
        checks.probability("dropout", self.dropout)

    @property
    def kv_groups(self) -> int:
        """G: the key/value heads (A without GQA)."""
        return self.groups or self.heads

    @property
    def sliding(self) -> bool:
        left, right = flops.attention_window(self.mask, self.window_size)
        return left >= 0 or (self.mask == "no_mask" and right >= 0)

    @property
    def label(self) -> str:
        kind = "MHA" if self.kv_groups == self.heads else "MQA" if self.kv_groups == 1 else "GQA"
        mask = self.mask
        if self.sliding:
            left, right = self.window_size
            mask = (
                f"causal window {left}" if self.mask != "no_mask" else f"window ({left}, {right})"
            )
        return (
            f"B={self.batch} S={self.seq} A={self.heads} G={self.kv_groups} ({kind}) "
            f"D={self.head_dim} {mask}"
        )

    def flops(self, backward: bool = True, backward_factor: float = 2.0) -> float:
        """:func:`fp8lab.flops.attention_core_flops` of this shape (forward + backward by
        default, model FLOPs)."""
        return flops.attention_core_flops(
            self.batch,
            self.heads,
            self.seq,
            self.head_dim,
            mask=self.mask,
            window_size=self.window_size,
            groups=self.kv_groups,
            backward=backward,
            backward_factor=backward_factor,
        )

    def make_inputs(self, device=None, dtype=torch.bfloat16, seed: int = 0):
        """``q [B, S, A, D]``, ``k, v [B, S, G, D]`` (TE's ``bshd``), normal, requiring grad,
        on ``device`` (the GPU where there is one)."""
        checks.integer("seed", seed, minimum=0)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype={dtype!r}: must be a floating-point torch dtype")
        device = resolve_device(device, default=True)
        generator = torch.Generator(device=device).manual_seed(seed)
        shapes = [
            (self.batch, self.seq, h, self.head_dim) for h in (self.heads,) + (self.kv_groups,) * 2
        ]
        return tuple(
            torch.randn(shape, generator=generator, device=device, dtype=dtype).requires_grad_()
            for shape in shapes
        )


def window_mask(seq: int, mask: str = "causal", window_size=None, device=None) -> torch.Tensor:
    """``[S, S]`` booleans, True where query i may attend to key j (self-attention, TE's window
    rule via :func:`fp8lab.flops.attention_window`)."""
    checks.integer("seq", seq)
    left, right = flops.attention_window(mask, window_size)
    device = resolve_device(device)
    query = torch.arange(seq, device=device)[:, None]
    key = torch.arange(seq, device=device)[None, :]
    allowed = torch.ones(seq, seq, dtype=torch.bool, device=device)
    if right >= 0:
        allowed &= key <= query + right
    if left >= 0:
        allowed &= key >= query - left
    return allowed


def _check_qkv(q, k, v) -> None:
    """``q [B, S, A, D]`` and ``k, v [B, S, G, D]`` with G dividing A, floating point, of one
    dtype and on one device; else a ``ValueError``/``TypeError`` naming the tensor."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        checks.tensor(name, t, dims=4, floating=True)
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(
                f"{name} has dtype {t.dtype} and q {q.dtype}: q, k and v must share one dtype"
            )
        if t.device != q.device:
            raise ValueError(
                f"{name} is on {t.device} and q on {q.device}: q, k and v must be on one device"
            )
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: need q [B, S, A, D] "
            "and k, v [B, S, G, D]"
        )
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"k has {k.shape[2]} heads: must divide the {q.shape[2]} query heads")


def _check_call(q, k, v, dropout_p, training) -> None:
    _check_qkv(q, k, v)
    checks.probability("dropout_p", dropout_p)
    checks.flag("training", training)


def explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: str = "causal",
    window_size=None,
    dropout_p: float = 0.0,
    training: bool = True,
) -> torch.Tensor:
    """Standard attention, written out: ``softmax(mask(Q K^T / sqrt(D))) V`` in the inputs' dtype.

    ``q [B, S, A, D]``, ``k, v [B, S, G, D]`` (G groups are repeated to A heads); returns
    ``[B, S, A, D]``. The full ``[B, A, S, S]`` score matrix is materialised, as in nanoGPT's
    non-flash path; masked scores are set to -inf before the softmax.
    """
    _check_call(q, k, v, dropout_p, training)
    repeat = q.shape[2] // k.shape[2]
    q_, k_, v_ = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, S, D]
    if repeat > 1:
        k_, v_ = k_.repeat_interleave(repeat, dim=1), v_.repeat_interleave(repeat, dim=1)
    scores = (q_ @ k_.transpose(-2, -1)) * (1.0 / q.shape[-1] ** 0.5)  # [B, A, S, S]
    if mask != "no_mask" or window_size is not None:
        allowed = window_mask(q.shape[1], mask, window_size, device=q.device)
        if not bool(allowed.all()):
            scores = scores.masked_fill(~allowed, float("-inf"))
    probs = F.dropout(scores.softmax(dim=-1), dropout_p, training)
    return (probs @ v_).transpose(1, 2)  # [B, A, S, D] -> [B, S, A, D]

