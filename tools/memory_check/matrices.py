"""The configurations measured: models, parameter layouts, the tune, held-out and fits matrices.

``tune`` is the matrix the estimator's constants may be tuned on; ``heldout`` (other model
shapes, sequence lengths and micro-batches) never is; ``FITS`` lists the configurations whose
largest micro-batch is searched. :func:`toy` shrinks any of them to run in seconds on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fp8lab import memory
from fp8lab.config import TransformerConfig


def _gpt(name, h, f, a, layers, vocab) -> TransformerConfig:
    """GPT-style: GeLU, multi-head attention, learned positions, LayerNorm, biases, tied head."""
    return TransformerConfig(
        h, f, a, num_layers=layers, vocab_size=vocab, max_seq_len=4096, name=name
    )


def _llama(name, h, f, a, g, layers, vocab) -> TransformerConfig:
    """Llama-style: SwiGLU, grouped-query attention, RoPE, RMSNorm, no biases, untied head."""
    return TransformerConfig(
        h,
        f,
        a,
        num_gqa_groups=g,
        num_layers=layers,
        vocab_size=vocab,
        activation="swiglu",
        normalization="RMSNorm",
        bias=False,
        tied_embeddings=False,
        position_embedding="rope",
        max_seq_len=4096,
        name=name,
    )


MODELS = {
    # tune: the configurations constants may be fitted on
    "gpt-350m": _gpt("gpt-350m", 1024, 4096, 16, 24, 50304),
    "llama-530m": _llama("llama-530m", 1024, 2816, 16, 4, 24, 128256),
    # held out: other widths, depths, head dimensions and vocabularies
    "gpt-760m": _gpt("gpt-760m", 1536, 6144, 16, 24, 50304),
    "llama-850m": _llama("llama-850m", 2048, 5632, 16, 4, 16, 32000),
    # held out, second matrix: small vocabularies, so that the peak leaves the cross-entropy
    "gpt-480m-v1k": _gpt("gpt-480m-v1k", 1280, 5120, 20, 24, 1024),
    "llama-620m-v4k": _llama("llama-620m-v4k", 1536, 4096, 12, 4, 24, 4096),
}


@dataclass(frozen=True)
class Config:
    """One measured configuration: a model, a micro-batch shape, a parameter layout, a compute
    precision, a recompute mode and the micro-batches per step."""

    model: str
    seq: int
    batch: int
    weights: str
    precision: str
    recompute: str = "none"
    accumulation: int = 1

    @property
    def cfg(self) -> TransformerConfig:
        return MODELS[self.model]

    def predict(self) -> memory.MemoryEstimate:
        return memory.estimate(
            self.cfg,
            self.batch,
            self.seq,
            precision=self.precision,
            weights=self.weights,
            recompute=self.recompute,
            accumulation=self.accumulation,
        )


# Every parameter layout with the compute precisions it is used with.
LAYOUTS = (
    ("bf16", "bf16"),
    ("bf16", "fp8-delayed"),
    ("fp32-autocast", "bf16"),
    ("fp32-autocast", "fp8-delayed"),
    ("fp32-autocast", "fp8-current"),
    ("bf16-master", "bf16"),
    ("bf16-master", "fp8-delayed"),
    ("bf16-master", "fp8-current"),
    ("bf16-master", "fp8-block"),
    ("fp8-master", "fp8-delayed"),
    ("fp8-master", "fp8-current"),
)


def _matrix(models, shapes, extras) -> list[Config]:
    """Every layout for each model, the (S, B) shapes taken in turn, plus ``extras``."""
    configs = []
    for model in models:
        for index, (weights, precision) in enumerate(LAYOUTS):
            seq, batch = shapes[index % len(shapes)]
            configs.append(Config(model, seq, batch, weights, precision))
    return configs + list(extras)


MATRICES = {
    "tune": _matrix(
        ("gpt-350m", "llama-530m"),
        shapes=((2048, 4), (1024, 8), (4096, 2), (2048, 2)),
        extras=(
            Config("gpt-350m", 2048, 4, "bf16-master", "bf16", "full"),
            Config("gpt-350m", 2048, 4, "bf16-master", "fp8-delayed", "selective"),
            Config("llama-530m", 2048, 4, "bf16", "fp8-delayed", "full"),
            Config("llama-530m", 2048, 2, "bf16-master", "bf16", "none", accumulation=2),
            Config("gpt-350m", 1024, 4, "fp32-autocast", "bf16", "none", accumulation=2),
        ),
    ),
    "heldout": _matrix(
        ("gpt-760m", "llama-850m"),
        shapes=((1024, 6), (2048, 3), (4096, 1), (2048, 2)),
        extras=(
            Config("gpt-760m", 2048, 3, "bf16-master", "fp8-delayed", "full"),
            Config("gpt-760m", 4096, 2, "fp32-autocast", "bf16", "full"),
            Config("llama-850m", 2048, 3, "bf16-master", "bf16", "full"),
            Config("llama-850m", 2048, 3, "fp8-master", "fp8-delayed", "selective"),
            Config("llama-850m", 1024, 3, "bf16", "bf16", "none", accumulation=3),
            Config("gpt-760m", 2048, 2, "bf16-master", "fp8-current", "none", accumulation=2),
        ),
    ),
}
# Held out, second matrix: configurations whose predicted peak is not the cross-entropy spike
# but the optimizer step (few tokens: the first step creates the states beside the gradients)
# or a layer's backward (small vocabularies; full recompute under FP8). Their predictions were
# committed (--predict-only) before any of them was measured.
_G, _L = "gpt-480m-v1k", "llama-620m-v4k"
MATRICES["heldout2"] = [
    Config(_G, 512, 1, "bf16", "bf16"),
    Config(_G, 512, 1, "fp32-autocast", "bf16"),
    Config(_G, 512, 1, "bf16-master", "bf16"),
    Config(_G, 512, 1, "bf16-master", "fp8-delayed"),
    Config(_G, 512, 1, "fp8-master", "fp8-delayed"),
    Config(_G, 2048, 4, "bf16-master", "bf16"),
    Config(_G, 2048, 4, "bf16-master", "fp8-delayed"),
    Config(_G, 2048, 4, "bf16-master", "fp8-block"),
    Config(_G, 4096, 4, "bf16-master", "fp8-delayed", "full"),
    Config(_G, 4096, 4, "fp8-master", "fp8-current", "full"),
    Config(_G, 1024, 8, "fp32-autocast", "fp8-delayed"),
    Config(_G, 1024, 4, "bf16-master", "fp8-delayed", "none", accumulation=2),
    Config(_L, 512, 1, "bf16", "bf16"),
    Config(_L, 512, 1, "bf16-master", "bf16"),
    Config(_L, 512, 1, "fp8-master", "fp8-current"),
    Config(_L, 4096, 4, "bf16-master", "fp8-delayed", "full"),
    Config(_L, 4096, 4, "fp8-master", "fp8-delayed", "full"),
    Config(_L, 4096, 8, "bf16", "fp8-delayed", "full"),
    Config(_L, 1024, 4, "bf16-master", "fp8-delayed", "none", accumulation=2),
    Config(_L, 2048, 4, "bf16-master", "bf16"),  # a cross-entropy peak, for comparison
]
# The "fits?" check: the largest micro-batch that runs, against the estimator's
FITS = (
    Config("llama-850m", 4096, 0, "bf16-master", "bf16"),
    Config("llama-850m", 4096, 0, "bf16-master", "fp8-delayed"),
    Config("llama-850m", 4096, 0, "fp8-master", "fp8-delayed"),
    Config("gpt-760m", 4096, 0, "bf16", "bf16"),
    Config("gpt-760m", 4096, 0, "fp32-autocast", "bf16", "full"),
)
FITS_EXTRA_TRIES = 4  # above the prediction, how many larger micro-batches to try at most
# The estimator's FP8 compute precisions, by their names in fp8lab.recipes.
RECIPES = {"fp8-delayed": "delayed", "fp8-current": "current", "fp8-block": "block"}


def toy(config: Config) -> Config:
    """The configuration at a size that runs in seconds on a CPU (``--dry-run``)."""
    cfg = config.cfg
    small = cfg.replace(
        hidden_size=64,
        ffn_hidden_size=128 if cfg.activation == "gelu" else 96,
        num_attention_heads=4,
        num_gqa_groups=None if cfg.num_gqa_groups is None else 2,
        num_layers=2,
        vocab_size=256,
        max_seq_len=128,
        name=cfg.name + "-toy",
    )
    MODELS[small.name] = small
    return replace(config, model=small.name, seq=min(config.seq, 64), batch=min(config.batch, 2))

