"""A small GPT around any form of the book's transformer layer (see :mod:`fp8lab.layers`).

Token embeddings (learned positions or RoPE), L layers, a final norm and an LM head
(tied to the embeddings or not). Layers run in TE's ``[S, B, H]`` layout; the model takes
tokens ``[B, S]`` and returns logits ``[B, S, V]``.
"""

from __future__ import annotations

import torch
from torch import nn

from fp8lab import checks
from fp8lab.config import TransformerConfig, require_config
from fp8lab.devices import resolve_device
from fp8lab.layers import (
    build_layer,
    canonical_state_dict,
    load_canonical_state_dict,
    make_norm,
    resolve_dtype,
)
from fp8lab.rotary import rotary_angles

__all__ = ["GPT", "random_tokens"]


class GPT(nn.Module):
    """Token embeddings, L layers, a final norm and an LM head: ``tokens [B, S] -> logits [B, S,
    V]``.

    Layers are built by ``build_layer(form, cfg, te, **layer_kwargs)`` (any of
    :data:`fp8lab.layers.FORMS`),
    or by ``layer_factory(cfg)`` when given. Embeddings, final norm and LM head stay in PyTorch
    and in
    ``params_dtype``: FP8 is for the transformer layers.
    """

    # The token-range check waits for the device; a caller whose ids come from its own loader
    # (and a CUDA-graph capture, where waiting is not allowed) turns it off.
    check_tokens = True

    def __init__(
        self,
        cfg: TransformerConfig,
        layer_factory=None,
        *,
        form: str = "pytorch",
        te=None,
        params_dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        **layer_kwargs,
    ):
        super().__init__()
        require_config(cfg)
        if cfg.vocab_size is None:
            raise ValueError("cfg.vocab_size=None: a GPT needs a vocabulary")
        if layer_factory is not None and not callable(layer_factory):
            raise TypeError(f"layer_factory must be callable, not {type(layer_factory).__name__}")
        params_dtype, device = resolve_dtype(params_dtype), resolve_device(device)
        factory = {"dtype": params_dtype, "device": device}
        self.cfg = cfg
        if layer_factory is None:

            def layer_factory(c):
                return build_layer(
                    form, c, te, params_dtype=params_dtype, device=device, **layer_kwargs
                )

        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, **factory)
        self.pos = (
            nn.Embedding(cfg.max_seq_len, cfg.hidden_size, **factory)
            if cfg.position_embedding == "learned"
            else None
        )
        self.layers = nn.ModuleList(layer_factory(cfg) for _ in range(cfg.num_layers))
        self.final_norm = make_norm(cfg, **factory)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, **factory)
        if cfg.tied_embeddings:
            self.head.weight = self.embed.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """GPT-2's initialisation in every form: normal(0, 0.02) matrices and embeddings, zero
        biases, unit norms."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)) or type(module).__name__ == "Linear":
                nn.init.normal_(module.weight, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif type(module).__name__ in ("LayerNormLinear", "LayerNormMLP"):
                for name, parameter in module.named_parameters(recurse=False):
                    if parameter.dim() >= 2:
                        nn.init.normal_(parameter, std=std)
                    elif "layer_norm" not in name:
                        nn.init.zeros_(parameter)

    @torch.no_grad()
    def load_weights_from(self, other: GPT) -> None:
        """Copy every weight of ``other`` (same config, any layer form) into this model."""
        if not isinstance(other, GPT):
            raise TypeError(f"other must be a GPT, not {type(other).__name__}")
        if other.cfg != self.cfg:
            raise ValueError("load_weights_from needs a GPT with the same config")
        for name in ("embed", "pos", "final_norm", "head"):
            mine = getattr(self, name)
            if mine is not None:
                mine.load_state_dict(getattr(other, name).state_dict())
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            load_canonical_state_dict(mine, canonical_state_dict(theirs))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        checks.tensor("tokens", tokens, dims=2, floating=False)
        _, s = tokens.shape  # [B, S]
        if s > self.cfg.max_seq_len:
            raise ValueError(f"tokens has S={s}: exceeds cfg.max_seq_len={self.cfg.max_seq_len}")
        if tokens.device != self.embed.weight.device:
            raise ValueError(
                f"tokens are on {tokens.device} but the model is on {self.embed.weight.device}"
            )
        if (
            self.check_tokens and tokens.numel() and not torch.compiler.is_compiling()
        ):  # the range check syncs; compiled code skips it
            low, high = torch.aminmax(tokens)
            if low.item() < 0 or high.item() >= self.cfg.vocab_size:
                raise ValueError(
                    f"tokens hold ids in [{low.item()}, {high.item()}]: must be in "
                    f"[0, vocab_size={self.cfg.vocab_size})"
                )
        x = self.embed(tokens).transpose(0, 1)  # [B, S, H] -> [S, B, H]
        if self.pos is not None:
            x = x + self.pos(torch.arange(s, device=tokens.device))[:, None, :]
        rotary = (
            rotary_angles(s, self.cfg.head_dim, device=tokens.device)
            if self.cfg.position_embedding == "rope"
            else None
        )
        for layer in self.layers:
            x = layer(x, rotary=rotary) if rotary is not None else layer(x)
        return self.head(self.final_norm(x)).transpose(0, 1)  # [S, B, V] -> [B, S, V]


def random_tokens(
    cfg: TransformerConfig, batch: int, seq: int, seed: int = 0, device=None
) -> torch.Tensor:
    """Reproducible token ids ``[B, S]`` for a benchmark or a test."""
    require_config(cfg)
    if cfg.vocab_size is None:
        raise ValueError("cfg.vocab_size=None: tokens need a vocabulary")
    checks.integer("batch", batch)
    checks.integer("seq", seq)
    checks.integer("seed", seed, minimum=0)
    device = resolve_device(device)
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (batch, seq), generator=generator).to(device)
