"""Parameter counts, FLOPs, MFU and time-to-train for decoder transformers.

FLOPs are summed matmul by matmul (a multiply-add is 2 FLOPs; norms, softmax and
element-wise work are not counted, as in the literature), for a batch of B sequences
of S tokens.

Attention comes in two conventions, named everywhere:

* ``causal=False`` -- the full S x S score matrix, as PaLM (Chowdhery et al. 2022,
  appendix B: ``6N + 12 L H Q T`` per token) and Megatron-LM (Narayanan et al. 2021,
  eq. 3) count it, and as ``torch.utils.flop_counter.FlopCounterMode`` counts
  ``scaled_dot_product_attention``;
* ``causal=True`` -- only the lower triangle, half of it, which is what causal
  FlashAttention-style kernels actually compute (the convention of FlashAttention's
  benchmarks, Dao et al. 2022);
* a sliding window (``window_size``, Transformer Engine's ``(left, right)``) -- the exact
  number of query-key pairs inside the window, as FlashAttention-3's benchmark counts it
  (Shah et al. 2024). Without a window, causal is half the square: S^2/2 pairs per head,
  S/2 fewer than the S(S+1)/2 pairs a causal mask keeps (1/S relative).

Grouped-query attention (G key/value groups, G < A) does not change these FLOPs: every one
of the A query heads still scores against S keys; it only shrinks K, V and their traffic.
:func:`attention_core_flops` is the one count of attention's two products; every other
function here that counts attention calls it.

Training is forward + backward, the backward costing 2x the forward for every matmul
(model FLOPs, the PaLM definition behind MFU). Recompute, one vocabulary everywhere
(:data:`RECOMPUTE`), adds forward work that the hardware does but the model does not need
(HFU): ``"full"`` re-runs each layer's forward, ``"selective"`` re-runs only the attention
core (Korthikanti et al. 2022). A FlashAttention backward recomputes the scores too:
``attention_backward_factor=2.5`` reproduces what FlopCounterMode charges for SDPA's backward.

MFU has one door, :func:`mfu`: achieved model FLOP/s over the dense peak of the dtype the
GEMMs run in (the chapters name that dtype in every column header).

What FlopCounterMode does not see: Transformer Engine's GEMMs run through TE's own
extension, not ``aten.mm``, so a ``te.Linear`` counts 0 FLOPs (seen on an H200 with TE
2.20.2, BF16 and FP8 alike); and in torch 2.13 on CPU, SDPA's CPU kernel is not
registered, so attention counts 0 there. TE models are counted with these formulas,
checked against the equal plain-PyTorch model.
"""

from __future__ import annotations

from dataclasses import dataclass

from fp8lab import checks
from fp8lab.config import TransformerConfig, require_config

__all__ = [
    "ATTENTION_MASKS",
    "RECOMPUTE",
    "Gemm",
    "attended_pairs",
    "attention_core_flops",
    "attention_flops",
    "attention_window",
    "forward_flops",
    "layer_flops",
    "layer_gemms",
    "layer_parameters",
    "lm_head_flops",
    "megatron_flops",
    "mfu",
    "palm_flops_per_token",
    "parameter_count",
    "step_time_s",
    "time_to_train_s",
    "tokens_per_s",
    "total_training_flops",
    "training_flops",
]

RECOMPUTE = ("none", "selective", "full")
ATTENTION_MASKS = ("no_mask", "causal", "causal_bottom_right")
ATTENTION_GEMMS = ("scores QK^T", "context PV")


@dataclass(frozen=True)
class Gemm:
    """One forward matrix product ``(M, K) @ (K, N)``, ``count`` times (e.g. per head)."""

    name: str
    m: int
    n: int
    k: int
    count: int = 1

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise TypeError(f"name={self.name!r}: must be a string")
        for field in ("m", "n", "k", "count"):
            checks.integer(field, getattr(self, field))

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.count

    def intensity(self, input_bytes: int = 2, output_bytes: int = 2) -> float:
        """FLOP per byte with each input read once and the output written once."""
        checks.integer("input_bytes", input_bytes)
        checks.integer("output_bytes", output_bytes)
        moved = self.count * (
            input_bytes * (self.m * self.k + self.k * self.n) + output_bytes * self.m * self.n
        )
        return self.flops / moved

    @property
    def is_attention(self) -> bool:
        return self.name in ATTENTION_GEMMS


def _shape(cfg, batch, seq) -> TransformerConfig:
    require_config(cfg)
    checks.integer("batch", batch)
    checks.integer("seq", seq)
    return cfg


# --- parameters ----------------------------------------------------------------------------------


def layer_parameters(cfg: TransformerConfig) -> dict[str, int]:
    """Parameters of one transformer layer, by part."""
    require_config(cfg)
    h, bias = cfg.hidden_size, int(cfg.bias)
    norm = 2 * h if cfg.normalization == "LayerNorm" else h
    return {
        "attention norm": norm,
        "qkv": h * cfg.qkv_size + bias * cfg.qkv_size,
        "attention output": cfg.q_size * h + bias * h,
        "mlp norm": norm,
        "fc1": h * cfg.fc1_out + bias * cfg.fc1_out,
        "fc2": cfg.ffn_hidden_size * h + bias * h,
    }


def parameter_count(cfg: TransformerConfig, include_embeddings: bool = True) -> int:
    """All parameters: L layers, plus embeddings, positions, final norm and an untied LM head when V
    is set."""
    require_config(cfg)
    checks.flag("include_embeddings", include_embeddings)
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
    """The forward GEMMs of one layer, attention products included (full S x S).

    The weight GEMMs see ``tokens = B * S`` rows; the attention products run per head.
    """
    _shape(cfg, batch, seq)
    tokens, h, d = batch * seq, cfg.hidden_size, cfg.head_dim
    heads = batch * cfg.num_attention_heads
    return [
        Gemm("qkv", tokens, cfg.qkv_size, h),
        Gemm("scores QK^T", seq, seq, d, heads),
        Gemm("context PV", seq, d, seq, heads),
        Gemm("attention output", tokens, h, cfg.q_size),
        Gemm("fc1", tokens, cfg.fc1_out, h),
        Gemm("fc2", tokens, h, cfg.ffn_hidden_size),
    ]


# --- the attention core ---------------------------------------------------------------------------


def attention_window(mask: str = "no_mask", window_size=None) -> tuple[int, int]:
    """The sliding window ``(left, right)`` of a self-attention mask, as TE reads it.

    Query i attends to keys ``i - left .. i + right`` (inclusive); -1 means no limit on that
    side. ``None`` means no window: ``(-1, -1)`` without a mask, ``(-1, 0)`` for the causal
    masks (TE's ``check_set_window_size``). A causal mask needs ``right = 0`` (``(-1, -1)`` is read
    as no window); without a mask both sides are -1 or both are >= 0. Where TE warns and
    rewrites a window, this refuses it. For self-attention (S_q = S_kv) ``causal`` and
    ``causal_bottom_right`` are the same mask.
    """
    checks.choice("mask", mask, ATTENTION_MASKS)
    causal = mask != "no_mask"
    if window_size is None:
        return (-1, 0) if causal else (-1, -1)
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"window_size={window_size!r}: must be None or a pair (left, right)")
    left = checks.integer("window_size[0]", window_size[0], minimum=-1)
    right = checks.integer("window_size[1]", window_size[1], minimum=-1)
    if causal:
        if (left, right) == (-1, -1):
            return (-1, 0)
        if right != 0:
            raise ValueError(
                f"window_size={tuple(window_size)}: mask={mask!r} needs (-1, 0) or (left >= 0, 0)"
            )
    elif (left == -1) != (right == -1):
        raise ValueError(
            f"window_size={tuple(window_size)}: mask='no_mask' needs (-1, -1) or (left >= 0, "
            "right >= 0)"
        )
    return (left, right)


def _window_is_sliding(left: int, right: int, causal: bool) -> bool:
    return left >= 0 or (not causal and right >= 0)


def attended_pairs(seq: int, mask: str = "no_mask", window_size=None) -> int:
    """Query-key pairs one head of self-attention scores: ``S^2`` without a mask, ``S(S+1)/2``
    with a causal one, and the exact count inside a sliding window (computed in closed form).
    """
    checks.integer("seq", seq)
    left, right = attention_window(mask, window_size)
    left = seq if left == -1 else min(left, seq)  # [S, S]: row i sees keys max(0, i - left) ..
    right = seq if right == -1 else min(right, seq)  # .. min(S - 1, i + right)
    rows_below_cap = max(0, seq - right)  # rows with i + right <= S - 1
    upper = (
        rows_below_cap * (rows_below_cap - 1) // 2
        + rows_below_cap * right
        + (seq - rows_below_cap) * (seq - 1)
    )
    rows_past_left = max(0, seq - left)  # rows with i - left >= 0
    lower = rows_past_left * (rows_past_left - 1) // 2
    return upper - lower + seq


def attention_core_flops(
    batch: int,
    heads: int,
    seq: int,
    head_dim: int,
    *,
    mask: str = "no_mask",
    window_size=None,
    groups: int | None = None,
    backward: bool = False,
    backward_factor: float = 2.0,
) -> float:
    """FLOPs of one attention core, ``softmax(Q K^T) V``, for B sequences of S tokens and A heads.

    Forward: ``4 B A D`` times the pairs scored -- ``S^2`` without a mask; ``S^2 / 2`` for a
    causal mask without a window (the half-square convention); the exact pairs of
    :func:`attended_pairs` with a sliding window. ``groups`` (G key/value heads) is checked
    but changes nothing (see the module notes). ``backward=True`` adds the backward,
    ``backward_factor`` times the forward: 2 counts model FLOPs (two products per forward
    product); 2.5 adds the recomputed scores of a FlashAttention backward.
    """
    checks.integer("batch", batch)
    checks.integer("heads", heads)
    checks.integer("seq", seq)
    checks.integer("head_dim", head_dim)
    if groups is not None and heads % checks.integer("groups", groups):
        raise ValueError(f"groups={groups}: must divide heads={heads}")
    checks.flag("backward", backward)
    factor = checks.number("backward_factor", backward_factor, positive=True)
    left, right = attention_window(mask, window_size)
    causal = mask != "no_mask"
    if _window_is_sliding(left, right, causal):
        pairs = attended_pairs(seq, mask, window_size)
        forward = 4 * batch * heads * head_dim * pairs
    else:
        forward = 4 * batch * heads * head_dim * seq * seq
        forward = forward // 2 if causal else forward
    return forward * (1 + factor) if backward else forward


def attention_flops(
    cfg: TransformerConfig, batch: int, seq: int, causal: bool = False, window_size=None
) -> int:
    """Forward FLOPs of QK^T and PV in one layer: ``4 B S^2 A D``, halved when ``causal``.

    :func:`attention_core_flops` with the config's A, D and G (a ``window_size`` counts the pairs
    inside the window).
    """
    _shape(cfg, batch, seq)
    checks.flag("causal", causal)
    return attention_core_flops(
        batch,
        cfg.num_attention_heads,
        seq,
        cfg.head_dim,
        mask="causal" if causal else "no_mask",
        window_size=window_size,
        groups=cfg.groups,
    )


def layer_flops(cfg: TransformerConfig, batch: int, seq: int, causal: bool = False) -> int:
    """Forward FLOPs of one layer."""
    dense = sum(g.flops for g in layer_gemms(cfg, batch, seq) if not g.is_attention)
    return dense + attention_flops(cfg, batch, seq, causal)


def lm_head_flops(cfg: TransformerConfig, batch: int, seq: int) -> int:
    """Forward FLOPs of the output projection to the vocabulary (0 without a vocabulary)."""
    _shape(cfg, batch, seq)
    return 0 if cfg.vocab_size is None else 2 * batch * seq * cfg.hidden_size * cfg.vocab_size


def forward_flops(cfg: TransformerConfig, batch: int, seq: int, causal: bool = False) -> int:
    """Forward FLOPs of the model: L layers and the LM head."""
    require_config(cfg)
    return cfg.num_layers * layer_flops(cfg, batch, seq, causal) + lm_head_flops(cfg, batch, seq)


def training_flops(
    cfg: TransformerConfig,
    batch: int,
    seq: int,
    causal: bool = False,
    recompute: str = "none",
    attention_backward_factor: float = 2.0,
) -> float:
    """FLOPs of one training step (forward + backward, plus recompute).

    ``recompute="none"`` with the default factor gives *model* FLOPs, 3x the forward
    (use for MFU); other settings give *hardware* FLOPs (use for HFU).
    """
    require_config(cfg)
    checks.choice("recompute", recompute, RECOMPUTE)
    factor = checks.number("attention_backward_factor", attention_backward_factor, positive=True)
    per_layer_attention = attention_flops(cfg, batch, seq, causal)
    per_layer_dense = layer_flops(cfg, batch, seq, causal) - per_layer_attention
    layer = 3 * per_layer_dense + (1 + factor) * per_layer_attention
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
    _shape(cfg, batch, seq)
    b, s, layers, h, v = batch, seq, cfg.num_layers, cfg.hidden_size, cfg.vocab_size or 0
    return 96 * b * s * layers * h**2 * (1 + s / (6 * h) + v / (16 * layers * h))


def palm_flops_per_token(
    n_params: float, layers: int, heads: int, head_dim: int, seq: int
) -> float:
    """Chowdhery et al. 2022, appendix B: training FLOPs per token ``6N + 12 L H Q T``."""
    n_params = checks.number("n_params", n_params, positive=True)
    for name, value in (("layers", layers), ("heads", heads), ("head_dim", head_dim), ("seq", seq)):
        checks.integer(name, value)
    return 6 * n_params + 12 * layers * heads * head_dim * seq


def total_training_flops(n_params: float, tokens: float, recompute: str = "none") -> float:
    """FLOPs of a whole training run: ``6 N D`` (``8 N D`` with full recompute), N parameters, D
    tokens.

    The per-token rule of Kaplan et al. 2020 and Narayanan et al. 2021 (sec. 5.1); it leaves out
    attention's S-dependent term. ``"selective"`` recompute has no N-D form: count it per step
    with :func:`training_flops`.
    """
    n_params = checks.number("n_params", n_params, positive=True)
    tokens = checks.number("tokens", tokens, positive=True)
    checks.choice("recompute", recompute, RECOMPUTE)
    if recompute == "selective":
        raise ValueError(
            "recompute='selective': has no 6ND/8ND form (it depends on S and the attention "
            "shape); use training_flops(cfg, B, S, recompute='selective') per step"
        )
    return (8 if recompute == "full" else 6) * n_params * tokens


# --- rates and time ------------------------------------------------------------------------------


def mfu(flops_per_step: float, step_time_s: float, peak_tflops: float, n_gpus: int = 1) -> float:
    """Utilisation: FLOPs per step over step time, over the peak of ``n_gpus`` GPUs.

    With model FLOPs (:func:`training_flops`, no recompute) this is MFU; with hardware
    FLOPs (recompute included) it is HFU. Above 1 is refused: the peak is not a peak for
    this dtype, or the FLOPs are over-counted.
    """
    flops_value = checks.number("flops_per_step", flops_per_step, positive=True)
    seconds = checks.number("step_time_s", step_time_s, positive=True)
    peak = checks.number("peak_tflops", peak_tflops, positive=True)
    checks.integer("n_gpus", n_gpus)
    utilisation = flops_value / seconds / (peak * 1e12 * n_gpus)
    if utilisation > 1.0:
        raise ValueError(
            f"utilisation {utilisation:.3f} > 1: peak_tflops={peak} is below the achieved "
            f"{flops_value / seconds / 1e12 / n_gpus:.1f} TFLOP/s per GPU; use the dense peak of "
            "the dtype the GEMMs run in, and model FLOPs"
        )
    return utilisation


def tokens_per_s(batch: int, seq: int, step_time_s: float) -> float:
    """Tokens processed per second: ``B * S / step time``."""
    checks.integer("batch", batch)
    checks.integer("seq", seq)
    return batch * seq / checks.number("step_time_s", step_time_s, positive=True)


def step_time_s(batch: int, seq: int, tokens_per_second: float) -> float:
    """The step time that ``tokens_per_second`` implies for a step of B x S tokens."""
    checks.integer("batch", batch)
    checks.integer("seq", seq)
    return batch * seq / checks.number("tokens_per_second", tokens_per_second, positive=True)


def time_to_train_s(
    tokens: float, n_params: float, n_gpus: int, tflops_per_gpu: float, recompute: str = "none"
) -> float:
    """Seconds to train on ``tokens``: :func:`total_training_flops` over ``n_gpus *
    tflops_per_gpu``.

    ``tflops_per_gpu`` is the achieved rate X of each of the n GPUs (Narayanan et al. 2021,
    sec. 5.1: ``8TP/(nX)`` with full recompute, ``6TP/(nX)`` without).
    """
    total = total_training_flops(n_params, tokens, recompute)
    checks.integer("n_gpus", n_gpus)
    rate = checks.number("tflops_per_gpu", tflops_per_gpu, positive=True)
    return total / (n_gpus * rate * 1e12)
