"""How large, and how many bytes: the largest model of a shape that fits a GPU, and what an
FSDP2 step moves with BF16 or FP8 weights.

:func:`largest_layers` solves for the parameter count instead of picking from presets: it keeps
a shape (widths, heads, vocabulary) and finds the most layers whose predicted training peak
(:func:`fp8lab.memory.estimate`) fits the GPU under the estimator's own policy
(:func:`fp8lab.memory.fitting_gpus`: peak plus the CUDA context within ``headroom`` of the
memory).

:func:`fsdp_gather_bytes` counts, per GPU and optimizer step, what FSDP2 moves over the wire
when every layer's weights are all-gathered for the forward and again for the backward
(``reshard_after_forward=True``) and the gradients are reduce-scattered, with a ring's
``(W - 1) / W`` of each tensor received per GPU. With FP8 weights (torchao's
``enable_fsdp_float8_all_gather``, or TE's ``Float8Tensor.fsdp_pre_all_gather``, which sends
only the FP8 data and builds the transpose after the gather) the gathers carry one byte per
parameter instead of two; the gradients stay 16- or 32-bit. Computed, not measured.
"""

from __future__ import annotations

from fp8lab import checks
from fp8lab.config import TransformerConfig, require_config

__all__ = ["fsdp_gather_bytes", "largest_layers"]

WEIGHT_BYTES = {"bf16": 2, "fp8": 1}
GRAD_BYTES = {"bf16": 2, "fp32": 4}


def largest_layers(
    cfg: TransformerConfig,
    seq: int,
    memory_bytes: float,
    *,
    precision: str = "bf16",
    headroom: float = 0.9,
    max_layers: int = 1024,
) -> TransformerConfig | None:
    """``cfg`` with the most layers (1 to ``max_layers``) whose one-sequence training step
    fits ``memory_bytes`` by the estimator's policy; ``None`` if one layer does not fit."""
    from fp8lab.memory import CUDA_CONTEXT, estimate

    require_config(cfg)
    checks.integer("seq", seq)
    memory_bytes = checks.number("memory_bytes", memory_bytes, positive=True)
    headroom = checks.number("headroom", headroom, positive=True, maximum=1.0)
    checks.integer("max_layers", max_layers)
    budget = headroom * memory_bytes - CUDA_CONTEXT

    def fits(layers: int) -> bool:
        shape = cfg.replace(num_layers=layers)
        return estimate(shape, 1, seq, precision=precision).peak_bytes <= budget

    if not fits(1):
        return None
    low, high = 1, max_layers + 1
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return cfg.replace(num_layers=low, name=f"{cfg.name}, {low} layers")


def fsdp_gather_bytes(
    n_params: int, world: int, weights: str = "bf16", grads: str = "bf16"
) -> dict[str, float]:
    """Bytes received per GPU per step by FSDP2 over ``world`` GPUs: ``"all-gather"`` (the
    forward's and the backward's), ``"reduce-scatter"`` (gradients) and ``"total"``.
    ``weights``: ``"bf16"`` or ``"fp8"`` (one byte; its per-tensor scales are ignored)."""
    checks.integer("n_params", n_params)
    checks.integer("world", world, minimum=2)
    weights = checks.choice("weights", weights, WEIGHT_BYTES)
    grads = checks.choice("grads", grads, GRAD_BYTES)
    share = (world - 1) / world
    gather = 2 * share * n_params * WEIGHT_BYTES[weights]
    scatter = share * n_params * GRAD_BYTES[grads]
    return {"all-gather": gather, "reduce-scatter": scatter, "total": gather + scatter}
