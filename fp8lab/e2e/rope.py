"""A CPU stand-in for ``te.RotaryPositionEmbedding``, which fp8lab's CPU reference lacks.

TE's module (``transformer_engine/pytorch/attention/rope.py``, about lines 18-105 in TE 2.20.2)
takes the head dimension D and a ``rotary_base``, and its ``forward(max_seq_len)`` returns the
angles ``[S, 1, 1, D]`` that ``te.TransformerLayer(..., rotary_pos_emb=...)`` rotates the
queries and keys by, channels "half against half". It places its frequencies on the current
CUDA device, so it cannot run without a GPU; this stand-in gives the same angles
(:func:`fp8lab.rotary.rotary_angles`) on any device. Where TE runs, the chapter uses TE's.
"""

from __future__ import annotations

import torch

from fp8lab import checks
from fp8lab.rotary import rotary_angles


class RotaryStandIn(torch.nn.Module):
    """``RotaryStandIn(dim, rotary_base=10000.0)(max_seq_len)`` -> angles ``[S, 1, 1, dim]``."""

    def __init__(self, dim: int, rotary_base: float = 10000.0):
        super().__init__()
        self.dim = checks.integer("dim", dim)
        self.rotary_base = checks.number("rotary_base", rotary_base, positive=True)

    def forward(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        checks.integer("offset", offset, minimum=0)
        angles = rotary_angles(max_seq_len + offset, self.dim, self.rotary_base)
        return angles[offset:]
