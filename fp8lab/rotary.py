"""Rotary position embeddings (RoPE) in Transformer Engine's convention.

Angles are a tensor ``[S, 1, 1, D]`` (what ``te.RotaryPositionEmbedding`` returns), and a head's
channels are rotated "half against half": the first half of D against the second. Every layer
form of :mod:`fp8lab.layers` and the model of :mod:`fp8lab.models` take these angles.
"""

from __future__ import annotations

import torch

from fp8lab import checks
from fp8lab.devices import resolve_device

__all__ = ["apply_rotary", "rotary_angles"]


def rotary_angles(seq: int, head_dim: int, base: float = 10000.0, device=None) -> torch.Tensor:
    """RoPE angles ``[S, 1, 1, D]`` in TE's layout (what ``te.RotaryPositionEmbedding`` returns)."""
    checks.integer("seq", seq)
    if checks.integer("head_dim", head_dim) % 2:
        raise ValueError(f"head_dim={head_dim}: RoPE rotates pairs of channels, so D must be even")
    base = checks.number("base", base, positive=True)
    device = resolve_device(device)
    inverse = 1.0 / base ** (
        torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    )
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inverse)
    return torch.cat([angles, angles], dim=-1)[:, None, None, :]


def apply_rotary(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate ``x: [S, B, heads, D]`` by position, first half of D against the second."""
    checks.tensor("x", x, dims=4, floating=True)
    checks.tensor("angles", angles, dims=4, floating=True)
    if angles.shape[0] != x.shape[0] or angles.shape[-1] != x.shape[-1]:
        raise ValueError(
            f"angles {tuple(angles.shape)} do not fit x {tuple(x.shape)}: need [S, 1, 1, D]"
        )
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return (x.float() * angles.cos() + rotated.float() * angles.sin()).to(x.dtype)
