"""Bytes of one MoE feed-forward layer in training: arithmetic only (no torch, no TE).

The layer of chapter 10: a router ``[H, E]`` in FP32, then per expert ``fc1`` ``[F, H]``, an
element-wise activation and ``fc2`` ``[H, F]`` as two ``GroupedLinear`` modules. ``T`` tokens
go to ``k`` experts each, which makes ``R`` permuted rows (``T * k``, more when each expert's
rows are padded to a multiple of 16 for FP8).

What is held between the forward and the backward, read off TE 2.20.2's source:

* ``GroupedLinear`` saves, per GEMM, its input and its weight as the GEMMs of the backward
  need them (``module/grouped_linear.py``, ~lines 900-935): in FP8 the input's columnwise
  copy only (1 byte per value, for the weight gradient) and the quantized weight with both
  its rowwise and columnwise copies (2 bytes per value on Hopper); in BF16 the input itself
  (2 bytes) and no copy of the weight;
* block scaling adds one FP32 scale per 128 values of an activation copy and per 128 x 128
  tile of a weight copy;
* the activation keeps its BF16 input (``fc1``'s output) for its backward;
* ``moe_unpermute`` with ``merging_probs`` keeps its input (``fc2``'s output, BF16) for the
  gradient of the router weights; the router keeps its logits and probabilities (FP32) and
  the permutation its ``row_id_map`` (int32, ``[T, 2E + 1]``).

Not counted: the layer's input (owned by the caller), allocator rounding, and workspaces
(cuBLAS, TE's split-quantize buffers), which a measured peak includes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fp8lab import checks

__all__ = ["RECIPES", "MoEShape", "moe_layer_bytes", "padded_rows"]

RECIPES = ("bf16", "delayed", "current", "block")
BLOCK = 128


@dataclass(frozen=True)
class MoEShape:
    """``T`` tokens of width ``H``, ``E`` experts of hidden size ``F``, top-``k`` routing."""

    T: int
    H: int
    F: int
    E: int
    k: int

    def __post_init__(self):
        for name in ("T", "H", "F", "E", "k"):
            checks.integer(name, getattr(self, name))
        if self.k > self.E:
            raise ValueError(f"k={self.k}: must be <= E={self.E}")


def padded_rows(tokens_per_expert, align: int = 16) -> int:
    """Rows after padding each expert's count up to a multiple of ``align``."""
    checks.integer("align", align)
    if isinstance(tokens_per_expert, (str, bytes)) or not hasattr(tokens_per_expert, "__iter__"):
        raise TypeError(f"tokens_per_expert={checks.show(tokens_per_expert)}: must be a "
                        "sequence of token counts, one per expert")
    counts = [checks.integer("tokens_per_expert[i]", n, minimum=0) for n in tokens_per_expert]
    return sum(math.ceil(n / align) * align for n in counts)


def _block_scales(rows: int, cols: int) -> int:
    return math.ceil(rows / BLOCK) * cols * 4  # 1x128 blocks along the rows, FP32 scales


def moe_layer_bytes(shape: MoEShape, recipe: str, rows: int | None = None,
                    param_bytes: int = 2) -> dict[str, int]:
    """The layer's bytes by part: ``parameters``, ``gradients``, ``fp8 weight copies`` and
    ``saved activations`` (held from forward to backward), for ``recipe`` (``"bf16"``,
    ``"delayed"``, ``"current"`` or ``"block"``) and ``rows`` permuted rows (default
    ``T * k``, no padding)."""
    if not isinstance(shape, MoEShape):
        raise TypeError(f"shape: must be a MoEShape, not {type(shape).__name__}")
    checks.choice("recipe", recipe, RECIPES)
    checks.integer("param_bytes", param_bytes)
    T, H, F, E, k = shape.T, shape.H, shape.F, shape.E, shape.k
    R = T * k if rows is None else checks.integer("rows", rows, minimum=T * k)
    expert_values = E * 2 * H * F
    router = H * E * 4  # the router stays in FP32
    parts = {"parameters": expert_values * param_bytes + router}
    parts["gradients"] = parts["parameters"]
    fp8 = recipe != "bf16"
    copies = 2 * expert_values if fp8 else 0
    if recipe == "block":  # rowwise and columnwise 128x128 tiles of each weight
        tiles = E * 2 * math.ceil(H / BLOCK) * math.ceil(F / BLOCK)
        copies += 2 * tiles * 4
    parts["fp8 weight copies"] = copies
    gemm_inputs = R * H + R * F  # fc1's input, fc2's input (the activation's output)
    saved = gemm_inputs * (1 if fp8 else 2)
    if recipe == "block":
        saved += _block_scales(R, H) + _block_scales(R, F)
    saved += R * F * 2  # fc1's output, for the activation's backward
    saved += R * H * 2  # fc2's output, for the router weights' gradient in unpermute
    saved += T * E * 4 * 2 + T * (2 * E + 1) * 4  # logits, probabilities, row_id_map
    parts["saved activations"] = saved
    return parts
