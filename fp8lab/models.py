"""Model builders: the same pre-norm transformer layer, and a small GPT around it.

Tensors flow in Transformer Engine's default layout, ``[S, B, H]`` (sequence
first), so every form of the layer takes and returns the same shapes. The plain
PyTorch form here is the honest BF16 baseline of the book: fused
``F.scaled_dot_product_attention`` with the same causal mask and dropout that
``te.TransformerLayer`` uses by default, GeLU in its tanh form and SwiGLU with the
gate on the first half, as TE computes them.

``attention="math"`` writes attention out as explicit matmuls and a softmax
(slower, but every FLOP of it is visible to ``FlopCounterMode`` on any device).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fp8lab.config import TransformerConfig, require_positive_int

ATTENTION_IMPLS = ("sdpa", "math")


def make_norm(cfg: TransformerConfig, eps: float = 1e-5, **factory) -> nn.Module:
    if cfg.normalization == "LayerNorm":
        return nn.LayerNorm(cfg.hidden_size, eps=eps, **factory)
    return nn.RMSNorm(cfg.hidden_size, eps=eps, **factory)


def activation(x: torch.Tensor, kind: str) -> torch.Tensor:
    """TE's activations: GeLU (tanh approximation) and SwiGLU (SiLU on the first half, times the second)."""
    if kind == "gelu":
        return F.gelu(x, approximate="tanh")
    gate, value = x.chunk(2, dim=-1)
    return F.silu(gate) * value


def rotary_tables(seq: int, head_dim: int, base: float = 10000.0, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``[S, 1, 1, D]`` for rotary position embeddings (rotate-half layout)."""
    inverse = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inverse)
    angles = torch.cat([angles, angles], dim=-1)[:, None, None, :]
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x: [S, B, heads, D]`` by position."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def torch_linear(in_features: int, out_features: int, bias: bool, dtype=None, device=None) -> nn.Module:
    return nn.Linear(in_features, out_features, bias=bias, dtype=dtype, device=device)


def te_linear(te):
    """A ``linear`` factory that builds ``te.Linear`` (FP8 GEMMs under ``te.autocast``) in place of ``nn.Linear``."""
    def make(in_features: int, out_features: int, bias: bool, dtype=None, device=None) -> nn.Module:
        return te.Linear(in_features, out_features, bias=bias, params_dtype=dtype,
                         **({"device": device} if device is not None else {}))
    return make


class PlainTransformerLayer(nn.Module):
    """Pre-norm transformer layer in plain PyTorch: ``x + Attn(Norm(x))``, then ``+ MLP(Norm(.))``.

    ``linear`` builds the four projections (``nn.Linear`` by default; :func:`te_linear` swaps in
    ``te.Linear``). Parameter names mirror the TE forms (``qkv``, ``proj``, ``fc1``, ``fc2``).
    """

    def __init__(self, cfg: TransformerConfig, *, hidden_dropout: float = 0.1, attention_dropout: float = 0.1,
                 causal: bool = True, attention: str = "sdpa", params_dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, linear=None):
        super().__init__()
        if attention not in ATTENTION_IMPLS:
            raise ValueError(f"attention={attention!r}: must be one of {ATTENTION_IMPLS}")
        for name, p in (("hidden_dropout", hidden_dropout), ("attention_dropout", attention_dropout)):
            if not 0.0 <= p < 1.0:
                raise ValueError(f"{name}={p}: must be in [0, 1)")
        factory = {"dtype": params_dtype, "device": device}
        h = cfg.hidden_size
        linear = linear or torch_linear
        self.cfg, self.causal, self.attention = cfg, causal, attention
        self.hidden_dropout, self.attention_dropout = hidden_dropout, attention_dropout
        self.input_norm = make_norm(cfg, **factory)
        self.qkv = linear(h, h + 2 * cfg.kv_size, cfg.bias, **factory)
        self.proj = linear(h, h, cfg.bias, **factory)
        self.mlp_norm = make_norm(cfg, **factory)
        self.fc1 = linear(h, cfg.fc1_out, cfg.bias, **factory)
        self.fc2 = linear(cfg.ffn_hidden_size, h, cfg.bias, **factory)

    def _attention(self, q, k, v):
        """``q: [B, A, S, D]``, ``k, v: [B, G, S, D]`` -> ``[B, A, S, D]``."""
        dropout = self.attention_dropout if self.training else 0.0
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=self.causal,
                                                  enable_gqa=k.shape[1] != q.shape[1])
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if self.causal:
            s = q.shape[-2]
            mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        probs = F.dropout(scores.softmax(dim=-1), dropout, self.training)
        return probs @ v

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        s, b, h = x.shape
        cfg = self.cfg
        q, k, v = self.qkv(self.input_norm(x)).split([h, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.reshape(s, b, cfg.num_attention_heads, cfg.head_dim)
        k = k.reshape(s, b, cfg.groups, cfg.head_dim)
        v = v.reshape(s, b, cfg.groups, cfg.head_dim)
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        context = self._attention(*(t.permute(1, 2, 0, 3) for t in (q, k, v)))
        context = context.permute(2, 0, 1, 3).reshape(s, b, h)
        x = x + F.dropout(self.proj(context), self.hidden_dropout, self.training)
        mlp = self.fc2(activation(self.fc1(self.mlp_norm(x)), cfg.activation))
        return x + F.dropout(mlp, self.hidden_dropout, self.training)


class GPT(nn.Module):
    """Token embeddings, L layers, a final norm and an LM head: ``tokens [B, S] -> logits [B, S, V]``.

    ``layer_factory(cfg)`` builds each layer (any of the book's forms taking and returning ``[S, B, H]``).
    """

    def __init__(self, cfg: TransformerConfig, layer_factory=None, *, params_dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, **layer_kwargs):
        super().__init__()
        if cfg.vocab_size is None:
            raise ValueError("GPT needs cfg.vocab_size")
        factory = {"dtype": params_dtype, "device": device}
        self.cfg = cfg
        layer_factory = layer_factory or (lambda c: PlainTransformerLayer(c, params_dtype=params_dtype,
                                                                          device=device, **layer_kwargs))
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, **factory)
        self.pos = (nn.Embedding(cfg.max_seq_len, cfg.hidden_size, **factory)
                    if cfg.position_embedding == "learned" else None)
        self.layers = nn.ModuleList(layer_factory(cfg) for _ in range(cfg.num_layers))
        self.final_norm = make_norm(cfg, **factory)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, **factory)
        if cfg.tied_embeddings:
            self.head.weight = self.embed.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """GPT-2's initialisation: normal(0, 0.02) weights and embeddings, zero biases, unit norms."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)) or type(module).__name__ == "Linear":
                nn.init.normal_(module.weight, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b, s = tokens.shape
        if s > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {s} exceeds cfg.max_seq_len={self.cfg.max_seq_len}")
        x = self.embed(tokens).transpose(0, 1)  # [S, B, H]
        if self.pos is not None:
            x = x + self.pos(torch.arange(s, device=tokens.device))[:, None, :]
        rotary = (rotary_tables(s, self.cfg.head_dim, device=tokens.device)
                  if self.cfg.position_embedding == "rope" else None)
        for layer in self.layers:
            x = layer(x, rotary=rotary) if rotary is not None else layer(x)
        return self.head(self.final_norm(x)).transpose(0, 1)


def random_tokens(cfg: TransformerConfig, batch: int, seq: int, seed: int = 0, device=None) -> torch.Tensor:
    """Reproducible token ids ``[B, S]`` for a benchmark or a test."""
    require_positive_int("batch", batch)
    require_positive_int("seq", seq)
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (batch, seq), generator=generator).to(device)
