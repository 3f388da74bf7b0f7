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
``optimizers``                  ``pytorch/optimizers/fused_adam.py`` (a CPU stand-in for
                                ``FusedAdam``, master weights and FP8 parameters included)
``offload``                     ``pytorch/cpu_offload.py`` (``get_cpu_offload_context``: its
                                checks; tensors stay in host memory, where they already are)
==============================  ===========================================================

Parity with TE 2.20.2, measured on an H200 (``tests/test_reference_parity.py``, results in
``tests/gpu_results/reference_parity_h200.json``; five input draws, medians): FP8 bytes of
per-tensor casts and the scales themselves bit-identical; the delayed-scaling amax history and
scales of a ``Linear`` bit-identical after 10 steps; ``Linear`` and ``LayerNormLinear`` within
0.2% (outputs and gradients) in BF16, delayed and current scaling; ``LayerNormMLP`` (SwiGLU,
RMSNorm) within 0.45% (outputs) and 0.65% (gradients); ``TransformerLayer`` outputs within 0.25%,
input gradients 0.35%, parameter gradients 1.7%, except the QKV weight and its norm's gamma
(3.7-4.4%), which TE itself moves by 4.2-4.7% between its two forward accumulation modes or
when one BF16 ulp is added to 0.1% of the input: an E5M2 gradient whose amax moves by one ulp
is rounded differently everywhere.

Two details decide parity at this level. Scales are ``fp8_max / amax`` rounded once in FP32
(:func:`quantization.divide`): with a BF16 amax, the exact quotient can put a fixed share of
BF16 values exactly on ties between two FP8 values (a normal sample with amax 4.59375 in E5M2:
about 0.6%), and a scale one ulp off rounds all of them the other way. And the reference
accumulates FP8 GEMMs in FP32, which TE does in the backward but, on Hopper, not in the forward
by default (``use_split_accumulator=False``: cuBLAS fast accumulation); the two forward modes
differ by up to 2.8% in a ``LayerNormMLP`` output, so the parity tests compare against TE with
FP32 forward accumulation and report the default beside it.

Tensor and sequence parallelism (``tp_group``, ``parallel_mode``, ``set_parallel_mode``,
``sequence_parallel``) run on ``torch.distributed`` (:mod:`fp8lab.reference.parallel`), and
``autocast(amax_reduction_group=...)`` reduces delayed-scaling amaxes across ranks as TE does.

Not modelled (each raises ``NotImplementedError``): context parallelism, Userbuffers, FP8
attention (``fp8_dpa``/``fp8_mha``), NVFP4 training, CUDA graphs, calibration, padding and
arbitrary attention masks (``causal``, ``causal_bottom_right`` and ``no_mask`` are modelled,
with sliding windows), and other TE modules.
"""

import torch.utils.checkpoint as _torch_checkpoint

from fp8lab.reference import optimizers, recipe
from fp8lab.reference.attention import DotProductAttention
from fp8lab.reference.modules import LayerNorm, LayerNormLinear, LayerNormMLP, Linear, RMSNorm
from fp8lab.reference.offload import get_cpu_offload_context
from fp8lab.reference.quantization import (
    STATE,
    assert_dim_for_fp8_exec,
    autocast,
    fp8_autocast,
    fp8_model_init,
    get_default_recipe,
    is_fp8_available,
    quantize_mxfp8,
    quantize_nvfp4,
    quantized_model_init,
)
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


def checkpoint(
    function,
    *args,
    distribute_saved_activations: bool = False,
    get_rng_state_tracker=None,
    tp_group=None,
    use_reentrant: bool = True,
    **kwargs,
):
    """``te.checkpoint``: recompute ``function`` in the backward instead of saving its activations.

    As in TE, delayed-scaling scales of the first pass are reused by the recompute and no amax
    is recorded twice.
    """
    if distribute_saved_activations:
        raise NotImplementedError(
            "distribute_saved_activations needs tensor parallelism: use Transformer Engine"
        )
    shared: dict = {}
    return _torch_checkpoint.checkpoint(
        function,
        *args,
        use_reentrant=False,
        context_fn=lambda: (_Phase("forward", shared), _Phase("recompute", shared)),
        **kwargs,
    )


def initialize_ub(*args, **kwargs):
    """``te.initialize_ub``: Userbuffers, communication overlapped with GEMM chunks over NVLink."""
    raise NotImplementedError(
        "Userbuffers (initialize_ub, ub_tp_comm_overlap) are not modelled by the CPU reference: "
        "they overlap GPU kernels; use Transformer Engine on GPUs"
    )


def destroy_ub() -> None:
    """``te.destroy_ub``: nothing to free in the reference."""


def is_bf16_available() -> bool:
    return True


def is_mxfp8_available(return_reason: bool = False):
    reason = "MXFP8 needs a Blackwell GPU; the CPU reference emulates its numerics only"
    return (True, reason) if return_reason else True


def is_fp8_block_scaling_available(return_reason: bool = False):
    return (True, "") if return_reason else True


__all__ = [
    "DotProductAttention",
    "LayerNorm",
    "LayerNormLinear",
    "LayerNormMLP",
    "Linear",
    "RMSNorm",
    "TransformerLayer",
    "assert_dim_for_fp8_exec",
    "autocast",
    "checkpoint",
    "destroy_ub",
    "fp8_autocast",
    "fp8_model_init",
    "get_cpu_offload_context",
    "get_default_recipe",
    "initialize_ub",
    "is_bf16_available",
    "is_fp8_available",
    "is_fp8_block_scaling_available",
    "is_mxfp8_available",
    "optimizers",
    "quantize_mxfp8",
    "quantize_nvfp4",
    "quantized_model_init",
    "recipe",
]
