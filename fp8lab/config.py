"""One config type for every transformer in the book, with named presets.

Shapes follow one notation: B (micro-batch), S (sequence), H (hidden),
F (MLP hidden), L (layers), A (attention heads), G (key/value groups for GQA),
V (vocabulary). Field names follow Transformer Engine's constructor arguments
(``hidden_size``, ``ffn_hidden_size``, ``num_attention_heads``, ``num_gqa_groups``),
so a config passes straight into ``te.TransformerLayer``.

Bad shapes fail at construction with a ``ValueError`` naming the field and the
rule; :meth:`TransformerConfig.fp8_warnings` lists sizes that FP8 GEMMs will
refuse or pad (TE needs the GEMM dimensions divisible by 16 on Hopper).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

ACTIVATIONS = ("gelu", "swiglu")
NORMALIZATIONS = ("LayerNorm", "RMSNorm")
POSITION_EMBEDDINGS = ("learned", "rope", "none")
FP8_ALIGNMENT = 16


def require_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name}={value}: must be a positive integer")


@dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer: one layer's shape plus the model around it."""

    hidden_size: int                      # H
    ffn_hidden_size: int                  # F
    num_attention_heads: int              # A
    num_gqa_groups: int | None = None     # G (None: MHA, G = A)
    num_layers: int = 1                   # L
    vocab_size: int | None = None         # V (None: a bare stack of layers, no embeddings or head)
    activation: str = "gelu"
    normalization: str = "LayerNorm"
    bias: bool = True
    tied_embeddings: bool = True
    position_embedding: str = "learned"
    max_seq_len: int = 2048
    name: str = "custom"

    def __post_init__(self):
        for field in ("hidden_size", "ffn_hidden_size", "num_attention_heads", "num_layers", "max_seq_len"):
            require_positive_int(field, getattr(self, field))
        if self.num_gqa_groups is not None:
            require_positive_int("num_gqa_groups", self.num_gqa_groups)
        if self.vocab_size is not None:
            require_positive_int("vocab_size", self.vocab_size)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} must divide "
                             f"hidden_size={self.hidden_size}")
        if self.num_attention_heads % self.groups:
            raise ValueError(f"num_gqa_groups={self.groups} must divide num_attention_heads="
                             f"{self.num_attention_heads}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r}: must be one of {ACTIVATIONS}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization={self.normalization!r}: must be one of {NORMALIZATIONS}")
        if self.position_embedding not in POSITION_EMBEDDINGS:
            raise ValueError(f"position_embedding={self.position_embedding!r}: must be one of {POSITION_EMBEDDINGS}")
        if self.position_embedding == "rope" and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head dimension; hidden_size/num_attention_heads = {self.head_dim}")

    @property
    def groups(self) -> int:
        """G: key/value heads (equal to A for multi-head attention)."""
        return self.num_gqa_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_size(self) -> int:
        """Width of K (and of V): G * head_dim."""
        return self.groups * self.head_dim

    @property
    def fc1_out(self) -> int:
        """Output width of the first MLP GEMM: F, or 2F for SwiGLU's gate and value."""
        return 2 * self.ffn_hidden_size if self.activation == "swiglu" else self.ffn_hidden_size

    def replace(self, **changes) -> "TransformerConfig":
        return dataclasses.replace(self, **changes)

    def fp8_warnings(self) -> list[str]:
        """Sizes that FP8 GEMMs reject or pad (empty when every GEMM dimension is FP8-friendly)."""
        sizes = {"hidden_size": self.hidden_size, "ffn_hidden_size": self.ffn_hidden_size,
                 "kv size (G * head_dim)": self.kv_size}
        if self.vocab_size is not None:
            sizes["vocab_size"] = self.vocab_size
        return [f"{name}={value} is not divisible by {FP8_ALIGNMENT}" for name, value in sizes.items()
                if value % FP8_ALIGNMENT]


def pad_vocab(vocab_size: int, multiple: int = 128) -> int:
    """Round ``vocab_size`` up to a multiple (64 or 128 keeps the LM-head GEMM tile- and FP8-friendly)."""
    require_positive_int("vocab_size", vocab_size)
    require_positive_int("multiple", multiple)
    return -(-vocab_size // multiple) * multiple


PRESETS: dict[str, TransformerConfig] = {
    "gpt2-small": TransformerConfig(768, 3072, 12, num_layers=12, vocab_size=50257, max_seq_len=1024,
                                    name="gpt2-small"),
    "gpt2-medium": TransformerConfig(1024, 4096, 16, num_layers=24, vocab_size=50257, max_seq_len=1024,
                                     name="gpt2-medium"),
    "te-tutorial": TransformerConfig(4096, 16384, 32, num_layers=1, name="te-tutorial"),
    "llama-1b": TransformerConfig(2048, 8192, 32, num_gqa_groups=8, num_layers=16, vocab_size=128256,
                                  activation="swiglu", normalization="RMSNorm", bias=False,
                                  tied_embeddings=True, position_embedding="rope", max_seq_len=8192,
                                  name="llama-1b"),
    "llama3-8b": TransformerConfig(4096, 14336, 32, num_gqa_groups=8, num_layers=32, vocab_size=128256,
                                   activation="swiglu", normalization="RMSNorm", bias=False,
                                   tied_embeddings=False, position_embedding="rope", max_seq_len=8192,
                                   name="llama3-8b"),
    "gpt3-175b": TransformerConfig(12288, 49152, 96, num_layers=96, vocab_size=50257, max_seq_len=2048,
                                   name="gpt3-175b"),
}


def preset_config(name: str) -> TransformerConfig:
    """A named preset (``gpt2-small``, ``te-tutorial``, ``llama3-8b`` ...)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}") from None
