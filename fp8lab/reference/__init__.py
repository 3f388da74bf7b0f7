"""A CPU reference of the part of ``transformer_engine.pytorch`` (TE 2.20) that the book uses.

Plain PyTorch with real FP8 casts (``torch.float8_e4m3fn`` / ``torch.float8_e5m2``) and
TE's scaling rules, so every chapter runs without a GPU, and so a reader can see what TE
does to a tensor. It is returned by :func:`fp8lab.import_te` only where TE cannot run.

Where each piece comes from in TE:

==============================  ===========================================================
reference                       Transformer Engine 2.20
==============================  ===========================================================
``recipe``                      ``transformer_engine/common/recipe/__init__.py``
``quantization``                ``pytorch/quantization.py`` (autocast, model init, delayed
                                scaling update), ``common/recipe/*.cu(h)`` (scales), the
                                cast kernels (saturation, rounding)
``modules``                     ``pytorch/module/{linear,layernorm,rmsnorm,layernorm_linear,
                                layernorm_mlp}.py``
``attention``                   ``pytorch/attention/dot_product_attention``,
                                ``pytorch/attention/multi_head_attention.py``
``transformer``                 ``pytorch/transformer.py``
==============================  ===========================================================

Parity with TE 2.20.2, measured on an H200 (``tests/test_reference_parity.py``, results in
``tests/gpu_results/reference_parity_h200.json``): FP8 bytes of per-tensor casts identical; the
delayed-scaling amax history and scales of a ``Linear`` identical after 10 steps; ``Linear`` and
``LayerNormLinear`` within 0.2% (outputs and gradients) in BF16, delayed and current scaling;
``LayerNormMLP`` under current scaling within 0.6% (output) and 0.8% (gradients), because the
reference takes the activation's amax from its FP32 values while quantizing the 16-bit result,
as TE's fused activation kernel does. Still further off: ``LayerNormMLP`` with SwiGLU under
delayed scaling (2.6%), whose FP8 scale for the FC2 input differs from TE's by about 1% for a
reason not yet found, and ``TransformerLayer`` weight gradients (4.5%), which TE itself moves
by the same 4.4% when its input changes by one ulp in 0.1% of the elements.

Not modelled (each raises ``NotImplementedError``): tensor/sequence parallelism over more
than one rank, FP8 attention (``fp8_dpa``/``fp8_mha``), NVFP4 training, CUDA graphs,
calibration, attention masks other than ``causal``/``no_mask``, and other TE modules.
"""

import torch.utils.checkpoint as _torch_checkpoint

from fp8lab.reference import recipe
from fp8lab.reference.attention import DotProductAttention
from fp8lab.reference.modules import LayerNorm, LayerNormLinear, LayerNormMLP, Linear, RMSNorm
from fp8lab.reference.quantization import (STATE, assert_dim_for_fp8_exec, autocast, fp8_autocast, fp8_model_init,
                                           get_default_recipe, is_fp8_available, quantize_mxfp8, quantize_nvfp4,
                                           quantized_model_init)
from fp8lab.reference.transformer import TransformerLayer

__version__ = "2.20 (fp8lab CPU reference)"


class _Phase:
    """Checkpoint phases: the first pass notes the autocast state, the recompute restores it."""

    def __init__(self, phase, shared):
        self.phase, self.shared, self.saved = phase, shared, None

    def __enter__(self):
        self.saved = (STATE.checkpoint_phase, STATE.enabled, STATE.recipe)
        if self.phase == "forward":
            self.shared["autocast"] = (STATE.enabled, STATE.recipe)
            STATE.checkpoint_first_metas = None
        else:
            STATE.enabled, STATE.recipe = self.shared["autocast"]
            STATE.recompute_first_metas = self.shared.get("first_metas")
        STATE.checkpoint_phase = self.phase

    def __exit__(self, *exc):
        if self.phase == "forward":
            self.shared["first_metas"] = STATE.checkpoint_first_metas
        STATE.checkpoint_phase, STATE.enabled, STATE.recipe = self.saved


def checkpoint(function, *args, distribute_saved_activations: bool = False, get_rng_state_tracker=None,
               tp_group=None, use_reentrant: bool = True, **kwargs):
    """``te.checkpoint``: recompute ``function`` in the backward instead of saving its activations.

    As in TE, delayed-scaling scales of the first pass are reused by the recompute and no amax
    is recorded twice.
    """
    if distribute_saved_activations:
        raise NotImplementedError("distribute_saved_activations needs tensor parallelism: use Transformer Engine")
    shared: dict = {}
    return _torch_checkpoint.checkpoint(function, *args, use_reentrant=False,
                                        context_fn=lambda: (_Phase("forward", shared), _Phase("recompute", shared)),
                                        **kwargs)


def is_bf16_available() -> bool:
    return True


def is_mxfp8_available(return_reason: bool = False):
    reason = "MXFP8 needs a Blackwell GPU; the CPU reference emulates its numerics only"
    return (True, reason) if return_reason else True


def is_fp8_block_scaling_available(return_reason: bool = False):
    return (True, "") if return_reason else True


__all__ = ["DotProductAttention", "LayerNorm", "LayerNormLinear", "LayerNormMLP", "Linear", "RMSNorm",
           "TransformerLayer", "assert_dim_for_fp8_exec", "autocast", "checkpoint", "fp8_autocast", "fp8_model_init",
           "get_default_recipe", "is_bf16_available", "is_fp8_available", "is_fp8_block_scaling_available",
           "is_mxfp8_available", "quantize_mxfp8", "quantize_nvfp4", "quantized_model_init", "recipe"]
