"""What a layer saves for its backward, and what its backward allocates for a moment.

The saved tensors are those TE 2.20's ``LayerNormLinear``, ``DotProductAttention`` (cuDNN fused
attention: no S x S term), ``Linear`` and ``LayerNormMLP`` save, which reproduce Korthikanti et
al. 2022's ``34 s b h`` per layer in BF16 (``5 a s^2 b`` more with unfused attention); tensor and
sequence parallelism as in that paper. Under FP8 (``module/linear.py``) a saved GEMM input keeps
only its column-wise FP8 copy.
"""

from __future__ import annotations

from fp8lab import checks
from fp8lab.config import TransformerConfig, require_config
from fp8lab.flops import RECOMPUTE
from fp8lab.memory.constants import (
    BLOCK_SCALE_BYTES_PER_ELEMENT,
    BLOCK_SCALING_UNEXPLAINED_BYTES_PER_ELEMENT,
    NORM_STATS_BYTES,
)
from fp8lab.memory.spec import StepSpec, require_seq
from fp8lab.parts import Saved

__all__ = [
    "MODULE_PARAMS",
    "MODULE_PARAMS_AFTER",
    "MODULE_SAVED",
    "backward_transients",
    "korthikanti_activations",
    "saved_per_layer",
]

# Saved tensors each TE module frees when its backward ends, in the order the backward reaches
# the modules (TE frees a module's saved tensors together).
MODULE_SAVED = {
    "mlp": (
        Saved.MLP_NORM_INPUT,
        Saved.FC1_INPUT,
        Saved.FC1_OUTPUT,
        Saved.FC2_INPUT,
        Saved.MLP_DROPOUT_MASK,
    ),
    "proj": (Saved.PROJ_INPUT_FP8, Saved.ATTN_DROPOUT_MASK),
    "attention": (Saved.QKV, Saved.ATTN_OUTPUT, Saved.SCORES),
    "qkv": (Saved.ATTN_NORM_INPUT, Saved.QKV_INPUT, Saved.QKV_INPUT_FP8_ROWWISE),
}
# Weight gradients each module writes while its largest transient is alive, and those written
# after it (keys of fp8lab.flops.layer_parameters).
MODULE_PARAMS = {
    "mlp": ("mlp norm", "fc2"),
    "proj": ("attention output",),
    "attention": (),
    "qkv": ("attention norm", "qkv"),
}
MODULE_PARAMS_AFTER = {"mlp": ("fc1",), "proj": (), "attention": (), "qkv": ()}



def korthikanti_activations(
    cfg: TransformerConfig,
    batch: int,
    seq: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> float:
    """Korthikanti et al. 2022, table 2: activation bytes of one layer (16-bit, unfused attention).

    none: ``sbh(10 + 24/t + 5as/(ht))``; sequence parallel: ``sbh/t (34 + 5as/h)``;
    selective: drops the ``5as/h`` term; full: ``2sbh`` (``2sbh/t`` with sequence parallel).
    """
    require_config(cfg)
    checks.integer("batch", batch)
    require_seq(cfg, seq)
    checks.integer("tp", tp)
    checks.flag("sequence_parallel", sequence_parallel)
    checks.choice("recompute", recompute, RECOMPUTE)
    s, b, h, a = seq, batch, cfg.hidden_size, cfg.num_attention_heads
    if recompute == "full":
        return 2 * s * b * h / (tp if sequence_parallel else 1)
    quadratic = 0 if recompute == "selective" else 5 * a * s / h
    if sequence_parallel:
        return s * b * h / tp * (34 + quadratic)
    return s * b * h * (10 + 24 / tp + quadratic / tp)


def saved_per_layer(spec: StepSpec) -> dict[str, float]:
    """Bytes each layer saves for its backward, for every name of :class:`Saved` (0 where absent).

    TE's modules save FP8 copies of their GEMM inputs under FP8 (only the column-wise copy the
    weight gradient needs, module/linear.py), the BF16 tensors otherwise. Under selective
    recompute (``checkpoint_core_attention``) the attention keeps its inputs and recomputes its
    output and softmax statistics; the output projection still saves its input.
    """
    cfg, tokens, seq, tp = spec.cfg, spec.tokens, spec.seq, spec.layout.tp
    h, f = cfg.hidden_size, cfg.ffn_hidden_size
    element, fp8, recompute = spec.element, spec.fp8, spec.recompute
    block = BLOCK_SCALE_BYTES_PER_ELEMENT + BLOCK_SCALING_UNEXPLAINED_BYTES_PER_ELEMENT
    fp8_byte = 1 + (block if spec.compute == "fp8-block" else 0)
    rep = spec.rep  # replicated parts are split only by sequence parallelism
    gemm_input = fp8_byte if fp8 else element
    stats = NORM_STATS_BYTES[cfg.normalization] * tokens / rep
    mask = tokens * h / rep if spec.hidden_dropout > 0 else 0.0  # one byte per element
    softmax_stats = 4 * tokens * cfg.num_attention_heads / tp  # FP32 log-sum-exp per row
    attention_output = element * tokens * cfg.q_size / tp
    if recompute == "selective":  # recomputed; the BF16 output projection saves it anyway
        attention_output = 0.0 if fp8 else attention_output
        softmax_stats = 0.0
    unfused = not spec.flash_attention and recompute != "selective"
    scores = 5 * cfg.num_attention_heads if unfused else 0.0
    # Under sequence parallelism (comm_buffers) TE 2.20's LayerNormLinear quantizes the norm
    # output row-wise only, since per-tensor FP8 is all-gathered row-wise
    # (layernorm_linear.py: supports_only_rowwise_all_gather), and saves that copy for the
    # backward's gather: one FP8 byte per element, not a column-wise copy beside a row-wise one.
    rowwise_only = spec.sp_buffers and spec.compute in ("fp8-delayed", "fp8-current")
    qkv_rowwise = tokens * h / rep if fp8 and not rowwise_only else 0.0
    return {
        Saved.ATTN_NORM_INPUT: element * tokens * h / rep + stats,
        Saved.QKV_INPUT: gemm_input * tokens * h / rep,
        Saved.QKV_INPUT_FP8_ROWWISE: qkv_rowwise,
        Saved.QKV: element * tokens * cfg.qkv_size / tp,
        Saved.ATTN_OUTPUT: attention_output + softmax_stats,
        Saved.ATTN_DROPOUT_MASK: mask,
        Saved.PROJ_INPUT_FP8: fp8_byte * tokens * cfg.q_size / tp if fp8 else 0.0,
        Saved.SCORES: scores * seq * tokens / tp,
        Saved.MLP_NORM_INPUT: element * tokens * h / rep + stats,
        Saved.FC1_INPUT: gemm_input * tokens * h / rep,
        Saved.FC1_OUTPUT: element * tokens * cfg.fc1_out / tp,
        Saved.FC2_INPUT: gemm_input * tokens * f / tp,
        Saved.MLP_DROPOUT_MASK: mask,
    }


def backward_transients(
    cfg: TransformerConfig, tokens: int, element: int, fp8: bool, tp: int
) -> dict[str, float]:
    """Bytes a layer's backward allocates for a moment, module by module (TE 2.20 on Hopper).

    The MLP's is the largest: the gradient of the activation output and, under FP8, row- and
    column-wise FP8 copies of the gradient entering FC1 (a gated activation also materialises
    that gradient in 16 bits first); FC2's weight gradient exists then, FC1's comes after
    (:data:`MODULE_PARAMS`). These terms follow TE's kernels; their sizes were checked against
    measured peaks of stacks of ``te.TransformerLayer`` on an H200.
    """
    require_config(cfg)
    checks.integer("tokens", tokens)
    checks.integer("element", element)
    checks.flag("fp8", fp8)
    checks.integer("tp", tp)
    h, f, fc1 = cfg.hidden_size, cfg.ffn_hidden_size / tp, cfg.fc1_out / tp
    qkv = cfg.qkv_size / tp
    gated = cfg.activation == "swiglu"
    if fp8:
        mlp = element * tokens * f + (element * tokens * fc1 if gated else 0) + 2 * tokens * fc1
    else:
        mlp = element * tokens * fc1 + element * tokens * h
    quant = 2 if fp8 else 0  # row- and column-wise FP8 copies of a gradient
    return {
        "mlp": mlp,
        "proj": element * tokens * h + quant * tokens * h,
        "attention": element * tokens * h + element * tokens * qkv,
        "qkv": element * tokens * qkv + quant * tokens * qkv + element * tokens * h,
    }


