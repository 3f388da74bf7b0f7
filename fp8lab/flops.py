"""Parameter counts, FLOPs, MFU and time-to-train for decoder transformers.

FLOPs are summed matmul by matmul (a multiply-add is 2 FLOPs; norms, softmax and
element-wise work are not counted, as in the literature), for a batch of
``B`` sequences of ``S`` tokens, ``T = B * S``.

Attention comes in two conventions, named everywhere:

* ``causal=False`` -- the full S x S score matrix, as PaLM (Chowdhery et al. 2022,
  appendix B: ``6N + 12 L H Q T`` per token) and Megatron-LM (Narayanan et al. 2021,
  eq. 3) count it, and as ``torch.utils.flop_counter.FlopCounterMode`` counts
  ``scaled_dot_product_attention``;
* ``causal=True`` -- only the lower triangle, half of it, which is what causal
  FlashAttention-style kernels actually compute.

Training is forward + backward, the backward costing 2x the forward for every
matmul (model FLOPs, the PaLM definition behind MFU). Recompute adds forward
work that the hardware does but the model does not need (HFU): ``"full"``
re-runs each layer's forward, ``"selective"`` re-runs only the attention core
(Korthikanti et al. 2022). A FlashAttention backward recomputes the scores too:
``attention_backward_factor=2.5`` reproduces what FlopCounterMode charges for
SDPA's backward.

What FlopCounterMode does not see: Transformer Engine's GEMMs run through TE's own
extension, not ``aten.mm``, so a ``te.Linear`` counts 0 FLOPs (seen on an H200 with
TE 2.20.2, BF16 and FP8 alike); and in torch 2.13 on CPU, SDPA's CPU kernel is not
registered, so attention counts 0 there. TE models are counted with these
formulas, checked against the equal plain-PyTorch model.
"""

from __future__ import annotations

from dataclasses import dataclass

from fp8lab.config import TransformerConfig, require_positive_int

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Gemm:
    """One forward matrix product ``(M, K) @ (K, N)``, ``count`` times (e.g. per head)."""

    name: str
    m: int
    n: int
    k: int
    count: int = 1

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.count

    @property
    def intensity_bf16(self) -> float:
        """FLOP per byte with BF16 inputs and output, each read or written once."""
        return self.flops / (2 * self.count * (self.m * self.k + self.k * self.n + self.m * self.n))


def _check_batch(batch: int, seq: int) -> None:
    require_positive_int("batch", batch)
    require_positive_int("seq", seq)


# --- parameters ----------------------------------------------------------------------------------

def layer_parameters(cfg: TransformerConfig) -> dict[str, int]:
    """Parameters of one transformer layer, by part."""
    h, bias = cfg.hidden_size, int(cfg.bias)
    norm = 2 * h if cfg.normalization == "LayerNorm" else h
    qkv_out = h + 2 * cfg.kv_size
    return {
        "attention norm": norm,
        "qkv": h * qkv_out + bias * qkv_out,
        "attention output": h * h + bias * h,
        "mlp norm": norm,
        "fc1": h * cfg.fc1_out + bias * cfg.fc1_out,
        "fc2": cfg.ffn_hidden_size * h + bias * h,
    }


def parameter_count(cfg: TransformerConfig, include_embeddings: bool = True) -> int:
    """All parameters: L layers, plus embeddings, positions, final norm and an untied LM head when V is set."""
    total = cfg.num_layers * sum(layer_parameters(cfg).values())
    if cfg.vocab_size is None:
        return total
    h = cfg.hidden_size
    total += 2 * h if cfg.normalization == "LayerNorm" else h  # final norm
    if include_embeddings:
        total += cfg.vocab_size * h
        if cfg.position_embedding == "learned":
            total += cfg.max_seq_len * h
    if not cfg.tied_embeddings:
        total += cfg.vocab_size * h
    return total


# --- FLOPs ---------------------------------------------------------------------------------------

def layer_gemms(cfg: TransformerConfig, batch: int, seq: int) -> list[Gemm]:
    """The forward GEMMs of one layer, attention products included (full S x S)."""
    _check_batch(batch, seq)
    t, h, d = batch * seq, cfg.hidden_size, cfg.head_dim
    heads = batch * cfg.num_attention_heads
    return [
        Gemm("qkv", t, h + 2 * cfg.kv_size, h),
        Gemm("scores QK^T", seq, seq, d, heads),
        Gemm("context PV", seq, d, seq, heads),
        Gemm("attention output", t, h, h),
        Gemm("fc1", t, cfg.fc1_out, h),
        Gemm("fc2", t, h, cfg.ffn_hidden_size),
    ]


def attention_flops(cfg: TransformerConfig, batch: int, seq: int, causal: bool = False) -> int:
    """Forward FLOPs of QK^T and PV in one layer: ``4 B S^2 H``, halved when ``causal``."""
    full = sum(g.flops for g in layer_gemms(cfg, batch, seq) if g.name in ("scores QK^T", "context PV"))
    return full // 2 if causal else full


def layer_flops(cfg: TransformerConfig, batch: int, seq: int, causal: bool = False) -> int:
    """Forward FLOPs of one layer."""
    dense = sum(g.flops for g in layer_gemms(cfg, batch, seq) if g.name not in ("scores QK^T", "context PV"))
    return dense + attention_flops(cfg, batch, seq, causal)


def lm_head_flops(cfg: TransformerConfig, batch: int, seq: int) -> int:
    """Forward FLOPs of the output projection to the vocabulary (0 without a vocabulary)."""
    _check_batch(batch, seq)
    return 0 if cfg.vocab_size is None else 2 * batch * seq * cfg.hidden_size * cfg.vocab_size


def forward_flops(cfg: TransformerConfig, batch: int, seq: int, causal: bool = False) -> int:
    """Forward FLOPs of the model: L layers and the LM head."""
    return cfg.num_layers * layer_flops(cfg, batch, seq, causal) + lm_head_flops(cfg, batch, seq)


def training_flops(cfg: TransformerConfig, batch: int, seq: int, causal: bool = False,
                   recompute: str = "none", attention_backward_factor: float = 2.0) -> float:
    """FLOPs of one training step (forward + backward, plus recompute).

    ``recompute="none"`` with the default factor gives *model* FLOPs, 3x the forward
    (use for MFU); other settings give *hardware* FLOPs (use for HFU).
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute={recompute!r}: must be one of {RECOMPUTE}")
    if attention_backward_factor <= 0:
        raise ValueError(f"attention_backward_factor={attention_backward_factor}: must be positive")
    per_layer_attention = attention_flops(cfg, batch, seq, causal)
    per_layer_dense = layer_flops(cfg, batch, seq, causal) - per_layer_attention
    layer = 3 * per_layer_dense + (1 + attention_backward_factor) * per_layer_attention
    if recompute == "full":
        layer += per_layer_dense + per_layer_attention
    elif recompute == "selective":
        layer += per_layer_attention
    return cfg.num_layers * layer + 3 * lm_head_flops(cfg, batch, seq)


def megatron_flops(cfg: TransformerConfig, batch: int, seq: int) -> float:
    """Narayanan et al. 2021, eq. 3: ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``.

    FLOPs of one iteration with full activation recomputation, for GPT models with
    F = 4H, multi-head attention (full S x S) and an LM head of V outputs.
    """
    b, s, l, h, v = batch, seq, cfg.num_layers, cfg.hidden_size, cfg.vocab_size or 0
    return 96 * b * s * l * h**2 * (1 + s / (6 * h) + v / (16 * l * h))


def palm_flops_per_token(n_params: float, layers: int, heads: int, head_dim: int, seq: int) -> float:
    """Chowdhery et al. 2022, appendix B: training FLOPs per token ``6N + 12 L H Q T``."""
    return 6 * n_params + 12 * layers * heads * head_dim * seq


# --- rates and time ------------------------------------------------------------------------------

def mfu(flops_per_step: float, step_time_s: float, peak_tflops: float, n_gpus: int = 1) -> float:
    """Utilisation: FLOPs per step over step time, over the peak of ``n_gpus`` GPUs.

    With model FLOPs (:func:`training_flops`, no recompute) this is MFU; with
    hardware FLOPs (recompute included) it is HFU.
    """
    for name, value in (("flops_per_step", flops_per_step), ("step_time_s", step_time_s),
                        ("peak_tflops", peak_tflops)):
        if value <= 0:
            raise ValueError(f"{name}={value}: must be positive")
    require_positive_int("n_gpus", n_gpus)
    return flops_per_step / step_time_s / (peak_tflops * 1e12 * n_gpus)


def tokens_per_s(batch: int, seq: int, step_time_s: float) -> float:
    _check_batch(batch, seq)
    if step_time_s <= 0:
        raise ValueError(f"step_time_s={step_time_s}: must be positive")
    return batch * seq / step_time_s


def step_time_s(batch: int, seq: int, tokens_per_second: float) -> float:
    _check_batch(batch, seq)
    if tokens_per_second <= 0:
        raise ValueError(f"tokens_per_second={tokens_per_second}: must be positive")
    return batch * seq / tokens_per_second


def time_to_train_s(tokens: float, n_params: float, n_gpus: int, tflops_per_gpu: float,
                    recompute: bool = False) -> float:
    """Seconds to train on ``tokens``: ``8TP/(nX)`` with full recompute, ``6TP/(nX)`` without.

    ``tflops_per_gpu`` is the achieved rate X of each of the n GPUs (Narayanan et al. 2021, sec. 5.1).
    """
    for name, value in (("tokens", tokens), ("n_params", n_params), ("tflops_per_gpu", tflops_per_gpu)):
        if value <= 0:
            raise ValueError(f"{name}={value}: must be positive")
    require_positive_int("n_gpus", n_gpus)
    return (8 if recompute else 6) * tokens * n_params / (n_gpus * tflops_per_gpu * 1e12)
