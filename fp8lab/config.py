"""One config type for every transformer in the book, with named presets.

Shapes follow one notation, the book's: B (micro-batch), S (sequence), H (hidden), F (MLP
hidden), L (layers), A (attention heads), D (head dimension), V (vocabulary), plus G for the
key/value groups of grouped-query attention; ``tp``/``dp``/``cp`` are parallel sizes. Field
names follow Transformer Engine's constructor arguments (``hidden_size``, ``ffn_hidden_size``,
``num_attention_heads``, ``num_gqa_groups``, ``kv_channels``), so a config passes straight
into ``te.TransformerLayer``.

D is ``hidden_size / num_attention_heads`` unless ``kv_channels`` sets it, as TE allows
(PaLM 540B: 48 heads of 256 at H = 18432, so A * D = 12288 != H).

Bad shapes fail at construction with a ``ValueError``/``TypeError`` naming the field and the
rule; :meth:`TransformerConfig.fp8_warnings` lists sizes that FP8 GEMMs will refuse (TE needs
GEMM dimensions divisible by 16 on Hopper).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fp8lab import checks

__all__ = [
    "ACTIVATIONS",
    "NORMALIZATIONS",
    "POSITION_EMBEDDINGS",
    "PRESETS",
    "TransformerConfig",
    "pad_vocab",
    "preset_config",
    "require_config",
]

ACTIVATIONS = ("gelu", "swiglu")
NORMALIZATIONS = ("LayerNorm", "RMSNorm")
POSITION_EMBEDDINGS = ("learned", "rope", "none")
FP8_ALIGNMENT = 16


@dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer: one layer's shape plus the model around it."""

    hidden_size: int  # H
    ffn_hidden_size: int  # F
    num_attention_heads: int  # A
    num_gqa_groups: int | None = None  # G (None: multi-head attention, G = A)
    num_layers: int = 1  # L
    vocab_size: int | None = None  # V (None: a bare stack of layers, no embeddings or head)
    kv_channels: int | None = None  # D (None: H / A)
    activation: str = "gelu"
    normalization: str = "LayerNorm"
    bias: bool = True
    tied_embeddings: bool = True
    position_embedding: str = "learned"
    max_seq_len: int = 2048
    name: str = "custom"

    def __post_init__(self):
        for field in (
            "hidden_size",
            "ffn_hidden_size",
            "num_attention_heads",
            "num_layers",
            "max_seq_len",
        ):
            checks.integer(field, getattr(self, field))
        for field in ("num_gqa_groups", "vocab_size", "kv_channels"):
            if getattr(self, field) is not None:
                checks.integer(field, getattr(self, field))
        for field in ("bias", "tied_embeddings"):
            checks.flag(field, getattr(self, field))
        checks.choice("activation", self.activation, ACTIVATIONS)
        checks.choice("normalization", self.normalization, NORMALIZATIONS)
        checks.choice("position_embedding", self.position_embedding, POSITION_EMBEDDINGS)
        if not isinstance(self.name, str):
            raise TypeError(f"name={self.name!r}: must be a string")
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must divide "
                f"hidden_size={self.hidden_size} (or set kv_channels)"
            )
        if self.num_attention_heads % self.groups:
            raise ValueError(
                f"num_gqa_groups={self.groups} must divide num_attention_heads="
                f"{self.num_attention_heads}"
            )
        if self.position_embedding == "rope" and self.head_dim % 2:
            raise ValueError(
                f"position_embedding='rope' needs an even head dimension D; D = {self.head_dim}"
            )

    @property
    def groups(self) -> int:
        """G: key/value heads (equal to A for multi-head attention)."""
        return self.num_gqa_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        """D: ``kv_channels`` when set, else H / A."""
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def q_size(self) -> int:
        """Width of Q and of the attention output: A * D (equal to H unless ``kv_channels`` says
        otherwise)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of K (and of V): G * D."""
        return self.groups * self.head_dim

    @property
    def qkv_size(self) -> int:
        """Output width of the fused QKV projection: A * D + 2 * G * D."""
        return self.q_size + 2 * self.kv_size

    @property
    def fc1_out(self) -> int:
        """Output width of the first MLP GEMM: F, or 2F for SwiGLU's gate and value."""
        return 2 * self.ffn_hidden_size if self.activation == "swiglu" else self.ffn_hidden_size

    def replace(self, **changes) -> TransformerConfig:
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"replace(): unknown field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    def fp8_warnings(self) -> list[str]:
        """Sizes that FP8 GEMMs reject (empty when every GEMM dimension is FP8-friendly)."""
        sizes = {
            "hidden_size": self.hidden_size,
            "ffn_hidden_size": self.ffn_hidden_size,
            "A * D (query width)": self.q_size,
            "G * D (key/value width)": self.kv_size,
        }
        if self.vocab_size is not None:
            sizes["vocab_size"] = self.vocab_size
        return [
            f"{name}={value} is not divisible by {FP8_ALIGNMENT}"
            for name, value in sizes.items()
            if value % FP8_ALIGNMENT
        ]


def require_config(value, name: str = "cfg") -> TransformerConfig:
    """``value`` if it is a :class:`TransformerConfig`; a clear ``TypeError`` otherwise (a preset
    name,
    a dict or ``None`` are common mistakes)."""
    if isinstance(value, TransformerConfig):
        return value
    hint = " (use fp8lab.config.preset_config(name) for a preset)" if isinstance(value, str) else ""
    raise TypeError(f"{name} must be a TransformerConfig, not {type(value).__name__}{hint}")


def pad_vocab(vocab_size: int, multiple: int = 128) -> int:
    """Round ``vocab_size`` up to a multiple (64 or 128 keeps the LM-head GEMM tile- and
    FP8-friendly)."""
    checks.integer("vocab_size", vocab_size)
    checks.integer("multiple", multiple)
    return -(-vocab_size // multiple) * multiple


# One row per preset: H F A G L V D as in TransformerConfig, then activation, normalization,
# bias, tied embeddings, position embedding and max_seq_len S; "-" is None (G: multi-head
# attention, V: no embeddings, D: H / A).
# PaLM (Chowdhery et al. 2022, table 1): 48 heads of 256 (kv_channels) at d_model 18432, one shared
# K/V head, SwiGLU with F = 4 d_model, no biases, shared input/output embeddings, RoPE, V = 256k.
_PRESET_TABLE = """
name         H      F      A   G  L    V       D    act     norm       bias  tied  pos      S
gpt2-small   768    3072   12  -  12   50257   -    gelu    LayerNorm  yes   yes   learned  1024
gpt2-medium  1024   4096   16  -  24   50257   -    gelu    LayerNorm  yes   yes   learned  1024
te-tutorial  4096   16384  32  -  1    -       -    gelu    LayerNorm  yes   yes   learned  2048
llama-1b     2048   8192   32  8  16   128256  -    swiglu  RMSNorm    no    yes   rope     8192
llama3-8b    4096   14336  32  8  32   128256  -    swiglu  RMSNorm    no    no    rope     8192
gpt3-175b    12288  49152  96  -  96   50257   -    gelu    LayerNorm  yes   yes   learned  2048
palm-540b    18432  73728  48  1  118  256000  256  swiglu  LayerNorm  no    yes   rope     2048
"""


def _parse_presets(table: str) -> dict[str, TransformerConfig]:
    """The configs of :data:`_PRESET_TABLE`, by name."""

    def number(cell: str) -> int | None:
        return None if cell == "-" else int(cell)

    presets = {}
    for line in table.strip().splitlines()[1:]:
        name, h, f, a, g, layers, v, d, act, norm, bias, tied, position, seq = line.split()
        presets[name] = TransformerConfig(
            int(h),
            int(f),
            int(a),
            num_gqa_groups=number(g),
            num_layers=int(layers),
            vocab_size=number(v),
            kv_channels=number(d),
            activation=act,
            normalization=norm,
            bias=bias == "yes",
            tied_embeddings=tied == "yes",
            position_embedding=position,
            max_seq_len=int(seq),
            name=name,
        )
    return presets


PRESETS: dict[str, TransformerConfig] = _parse_presets(_PRESET_TABLE)


def preset_config(name: str) -> TransformerConfig:
    """A named preset (``gpt2-small``, ``te-tutorial``, ``llama3-8b``, ``palm-540b`` ...)."""
    if not isinstance(name, str):
        raise TypeError(f"name={name!r}: must be a preset name string")
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"name={name!r}: unknown preset; choose one of {', '.join(PRESETS)}"
        ) from None
