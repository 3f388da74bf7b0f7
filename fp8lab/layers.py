"""One pre-norm transformer layer in four forms, from plain PyTorch to ``te.TransformerLayer``.

==================  =====================================================================
form                what computes it
==================  =====================================================================
``pytorch``         ``nn.LayerNorm``/``nn.RMSNorm``, ``nn.Linear``, fused
                    ``F.scaled_dot_product_attention`` -- the honest BF16 baseline
``te_linear``       the same, with the four projections swapped for ``te.Linear``
                    (FP8 GEMMs under ``te.autocast``; norms, activation and attention unchanged)
``te_modules``      TE's fused modules: ``LayerNormLinear`` (norm + QKV), ``DotProductAttention``,
                    ``Linear`` (output projection), ``LayerNormMLP`` (norm + FC1 + activation + FC2)
``te_layer``        one ``te.TransformerLayer``
==================  =====================================================================

Every form takes and returns ``[S, B, H]`` (TE's default layout, sequence first), applies the
same causal mask and the same dropout (TE's defaults: causal, 0.1 after attention and MLP and
on the attention probabilities), and computes the same function: :func:`canonical_state_dict`
and :func:`load_canonical_state_dict` move weights between forms under one set of names
(``input_norm``, ``qkv``, ``proj``, ``mlp_norm``, ``fc1``, ``fc2``; QKV rows ordered as all
query heads, then keys, then values -- TE's order with ``qkv_weight_interleaved=False``).

Rotary embeddings follow TE's convention: ``rotary`` is a tensor of angles ``[S, 1, 1, D]``
(:func:`fp8lab.rotary.rotary_angles`), rotated "half against half".
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fp8lab import checks
from fp8lab.config import TransformerConfig, require_config
from fp8lab.devices import resolve_device
from fp8lab.rotary import apply_rotary, rotary_angles  # noqa: F401 (also imported from here)

__all__ = [
    "ATTENTION_IMPLS",
    "CANONICAL_NAMES",
    "FORMS",
    "FORM_LABELS",
    "PlainTransformerLayer",
    "TEModulesLayer",
    "TETransformerLayer",
    "activation",
    "build_layer",
    "canonical_state_dict",
    "load_canonical_state_dict",
    "make_norm",
    "resolve_dtype",
    "te_linear",
    "torch_linear",
]

FORMS = ("pytorch", "te_linear", "te_modules", "te_layer")
FORM_LABELS = {
    "pytorch": "PyTorch (nn.Linear + SDPA)",
    "te_linear": "PyTorch + te.Linear",
    "te_modules": "TE fused modules",
    "te_layer": "te.TransformerLayer",
}
ATTENTION_IMPLS = ("sdpa", "math")
CANONICAL_NAMES = (
    "input_norm.weight",
    "input_norm.bias",
    "qkv.weight",
    "qkv.bias",
    "proj.weight",
    "proj.bias",
    "mlp_norm.weight",
    "mlp_norm.bias",
    "fc1.weight",
    "fc1.bias",
    "fc2.weight",
    "fc2.bias",
)


def make_norm(cfg: TransformerConfig, eps: float = 1e-5, **factory) -> nn.Module:
    """The config's norm (``nn.LayerNorm`` or ``nn.RMSNorm``) over H."""
    require_config(cfg)
    eps = checks.number("eps", eps, positive=True)
    if cfg.normalization == "LayerNorm":
        return nn.LayerNorm(cfg.hidden_size, eps=eps, **factory)
    return nn.RMSNorm(cfg.hidden_size, eps=eps, **factory)


def activation(x: torch.Tensor, kind: str) -> torch.Tensor:
    """TE's activations: GeLU (tanh approximation) and SwiGLU (SiLU on the first half, times the
    second)."""
    if kind == "gelu":
        return F.gelu(x, approximate="tanh")
    gate, value = x.chunk(2, dim=-1)
    return F.silu(gate) * value


def resolve_dtype(params_dtype) -> torch.dtype:
    """A floating-point ``torch.dtype`` for parameters."""
    if not isinstance(params_dtype, torch.dtype):
        raise TypeError(
            f"params_dtype={params_dtype!r}: must be a torch dtype such as torch.bfloat16"
        )
    if not params_dtype.is_floating_point:
        raise TypeError(f"params_dtype={params_dtype}: must be a floating-point dtype")
    return params_dtype


def _check_dropout(**probabilities: float) -> None:
    for name, p in probabilities.items():
        checks.probability(name, p)


def _check_te_layer(cfg, causal, fuse_wgrad_accumulation, hidden_dropout, attention_dropout):
    require_config(cfg)
    checks.flag("causal", causal)
    checks.flag("fuse_wgrad_accumulation", fuse_wgrad_accumulation)
    _check_dropout(hidden_dropout=hidden_dropout, attention_dropout=attention_dropout)


def _reshape_heads(q, k, v, cfg: TransformerConfig):
    s, b = q.shape[:2]  # [S, B, heads * D] -> [S, B, heads, D]
    return (
        q.reshape(s, b, cfg.num_attention_heads, cfg.head_dim),
        k.reshape(s, b, cfg.groups, cfg.head_dim),
        v.reshape(s, b, cfg.groups, cfg.head_dim),
    )


def _check_input(x, cfg: TransformerConfig) -> tuple[int, int, int]:
    """A layer's input: a floating tensor ``[S, B, H]``."""
    checks.tensor("x", x, dims=3, floating=True)
    if x.shape[-1] != cfg.hidden_size:
        raise ValueError(
            f"x has shape {tuple(x.shape)}: the last dimension must be "
            f"hidden_size={cfg.hidden_size} "
            "(layers take [S, B, H])"
        )
    return tuple(x.shape)


def torch_linear(
    in_features: int, out_features: int, bias: bool, dtype=None, device=None
) -> nn.Module:
    device = resolve_device(device)
    return nn.Linear(in_features, out_features, bias=bias, dtype=dtype, device=device)


def te_linear(te):
    """A ``linear`` factory that builds ``te.Linear`` (FP8 GEMMs under ``te.autocast``) in place of
    ``nn.Linear``."""

    def make(in_features: int, out_features: int, bias: bool, dtype=None, device=None) -> nn.Module:
        device = resolve_device(device)
        return te.Linear(
            in_features,
            out_features,
            bias=bias,
            params_dtype=dtype,
            **({"device": device} if device is not None else {}),
        )

    return make


class PlainTransformerLayer(nn.Module):
    """Forms ``pytorch`` and ``te_linear``: ``x + Attn(Norm(x))``, then ``+ MLP(Norm(.))``, in plain
    PyTorch.

    ``linear`` builds the four projections (``nn.Linear`` by default; :func:`te_linear` swaps in
    ``te.Linear``). ``attention="math"`` writes attention out as matmuls and a softmax, so that
    ``FlopCounterMode`` sees every FLOP of it on any device.
    """

    def __init__(
        self,
        cfg: TransformerConfig,
        *,
        hidden_dropout: float = 0.1,
        attention_dropout: float = 0.1,
        causal: bool = True,
        attention: str = "sdpa",
        params_dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        linear=None,
    ):
        super().__init__()
        require_config(cfg)
        checks.choice("attention", attention, ATTENTION_IMPLS)
        checks.flag("causal", causal)
        _check_dropout(hidden_dropout=hidden_dropout, attention_dropout=attention_dropout)
        factory = {"dtype": resolve_dtype(params_dtype), "device": resolve_device(device)}
        h = cfg.hidden_size
        linear = linear or torch_linear
        self.cfg, self.causal, self.attention = cfg, causal, attention
        self.hidden_dropout, self.attention_dropout = hidden_dropout, attention_dropout
        self.input_norm = make_norm(cfg, **factory)
        self.qkv = linear(h, cfg.qkv_size, cfg.bias, **factory)
        self.proj = linear(cfg.q_size, h, cfg.bias, **factory)
        self.mlp_norm = make_norm(cfg, **factory)
        self.fc1 = linear(h, cfg.fc1_out, cfg.bias, **factory)
        self.fc2 = linear(cfg.ffn_hidden_size, h, cfg.bias, **factory)

    def _attention(self, q, k, v):
        """``q: [B, A, S, D]``, ``k, v: [B, G, S, D]`` -> ``[B, A, S, D]``."""
        dropout = self.attention_dropout if self.training else 0.0
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(
                q,
                k,
                v,
                dropout_p=dropout,
                is_causal=self.causal,
                enable_gqa=k.shape[1] != q.shape[1],
            )
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if self.causal:
            s = q.shape[-2]
            mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        probs = F.dropout(scores.softmax(dim=-1), dropout, self.training)
        return probs @ v

    def forward(self, x: torch.Tensor, rotary: torch.Tensor | None = None) -> torch.Tensor:
        s, b, _ = _check_input(x, self.cfg)
        cfg = self.cfg
        q, k, v = _reshape_heads(
            *self.qkv(self.input_norm(x)).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1), cfg
        )
        if rotary is not None:
            q, k = apply_rotary(q, rotary), apply_rotary(k, rotary)
        context = self._attention(*(t.permute(1, 2, 0, 3) for t in (q, k, v)))  # [B, heads, S, D]
        context = context.permute(2, 0, 1, 3).reshape(s, b, cfg.q_size)  # [S, B, A * D]
        x = x + F.dropout(self.proj(context), self.hidden_dropout, self.training)
        mlp = self.fc2(activation(self.fc1(self.mlp_norm(x)), cfg.activation))
        return x + F.dropout(mlp, self.hidden_dropout, self.training)


class TEModulesLayer(nn.Module):
    """Form ``te_modules``: the layer assembled from TE's fused modules.

    ``LayerNormLinear`` fuses the input norm with the QKV projection (under FP8 the norm writes
    FP8 directly), ``DotProductAttention`` picks a fused attention kernel (FlashAttention or
    cuDNN), and ``LayerNormMLP`` runs norm, FC1, activation and FC2 with the casts fused in.
    """

    def __init__(
        self,
        cfg: TransformerConfig,
        te,
        *,
        hidden_dropout: float = 0.1,
        attention_dropout: float = 0.1,
        causal: bool = True,
        params_dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        fuse_wgrad_accumulation: bool = False,
    ):
        super().__init__()
        _check_te_layer(cfg, causal, fuse_wgrad_accumulation, hidden_dropout, attention_dropout)
        h = cfg.hidden_size
        device = resolve_device(device)
        common = {
            "params_dtype": resolve_dtype(params_dtype),
            "fuse_wgrad_accumulation": fuse_wgrad_accumulation,
            **({"device": device} if device is not None else {}),
        }
        self.cfg, self.hidden_dropout = cfg, hidden_dropout
        self.qkv = te.LayerNormLinear(
            h, cfg.qkv_size, bias=cfg.bias, normalization=cfg.normalization, **common
        )
        self.attention = te.DotProductAttention(
            cfg.num_attention_heads,
            cfg.head_dim,
            num_gqa_groups=cfg.groups,
            attention_dropout=attention_dropout,
            qkv_format="sbhd",
            attn_mask_type="causal" if causal else "no_mask",
        )
        self.proj = te.Linear(cfg.q_size, h, bias=cfg.bias, **common)
        self.mlp = te.LayerNormMLP(
            h,
            cfg.ffn_hidden_size,
            bias=cfg.bias,
            normalization=cfg.normalization,
            activation=cfg.activation,
            **common,
        )

    def forward(self, x: torch.Tensor, rotary: torch.Tensor | None = None) -> torch.Tensor:
        _check_input(x, self.cfg)
        q_size, kv = self.cfg.q_size, self.cfg.kv_size
        q, k, v = _reshape_heads(*self.qkv(x).split([q_size, kv, kv], dim=-1), self.cfg)
        if rotary is not None:
            q, k = apply_rotary(q, rotary), apply_rotary(k, rotary)
        x = x + F.dropout(self.proj(self.attention(q, k, v)), self.hidden_dropout, self.training)
        return x + F.dropout(self.mlp(x), self.hidden_dropout, self.training)


class TETransformerLayer(nn.Module):
    """Form ``te_layer``: one ``te.TransformerLayer``, called with the book's ``(x, rotary)``
    signature.

    QKV is one fused parameter (``fuse_qkv_params=True``, which ``fuse_wgrad_accumulation``
    requires)
    with rows in the canonical order (``qkv_weight_interleaved=False``).
    """

    def __init__(
        self,
        cfg: TransformerConfig,
        te,
        *,
        hidden_dropout: float = 0.1,
        attention_dropout: float = 0.1,
        causal: bool = True,
        params_dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        fuse_wgrad_accumulation: bool = False,
    ):
        super().__init__()
        _check_te_layer(cfg, causal, fuse_wgrad_accumulation, hidden_dropout, attention_dropout)
        device = resolve_device(device)
        self.cfg = cfg
        self.layer = te.TransformerLayer(
            cfg.hidden_size,
            cfg.ffn_hidden_size,
            cfg.num_attention_heads,
            num_gqa_groups=cfg.groups,
            kv_channels=cfg.head_dim,
            hidden_dropout=hidden_dropout,
            attention_dropout=attention_dropout,
            self_attn_mask_type="causal" if causal else "no_mask",
            bias=cfg.bias,
            activation=cfg.activation,
            normalization=cfg.normalization,
            params_dtype=resolve_dtype(params_dtype),
            fuse_qkv_params=True,
            qkv_weight_interleaved=False,
            fuse_wgrad_accumulation=fuse_wgrad_accumulation,
            **({"device": device} if device is not None else {}),
        )

    def forward(self, x: torch.Tensor, rotary: torch.Tensor | None = None) -> torch.Tensor:
        _check_input(x, self.cfg)
        return self.layer(x, rotary_pos_emb=rotary)


def build_layer(form: str, cfg: TransformerConfig, te=None, **kwargs) -> nn.Module:
    """The layer of ``cfg`` in one of :data:`FORMS`; ``te`` (from ``fp8lab.import_te()``) for the TE
    forms.

    ``kwargs``: ``hidden_dropout``, ``attention_dropout``, ``causal``, ``params_dtype``, ``device``;
    ``attention`` for the PyTorch forms, ``fuse_wgrad_accumulation`` for the two fused TE forms.
    """
    checks.choice("form", form, FORMS)
    require_config(cfg)
    if form != "pytorch" and te is None:
        raise ValueError(f"form={form!r} needs te= (the module returned by fp8lab.import_te())")
    if form == "pytorch":
        return PlainTransformerLayer(cfg, **kwargs)
    if form == "te_linear":
        return PlainTransformerLayer(cfg, linear=te_linear(te), **kwargs)
    if "attention" in kwargs:
        raise ValueError(
            f"attention= applies to the PyTorch forms only; form {form!r} uses TE's attention"
        )
    return (TEModulesLayer if form == "te_modules" else TETransformerLayer)(cfg, te, **kwargs)


def _names(layer: nn.Module) -> dict[str, str]:
    """Canonical name -> the layer's own parameter name."""
    if isinstance(layer, PlainTransformerLayer):
        return {name: name for name in CANONICAL_NAMES}
    if isinstance(layer, TEModulesLayer):
        qkv, proj, mlp = "qkv.", "proj.", "mlp."
    elif isinstance(layer, TETransformerLayer):
        qkv, proj, mlp = (
            "layer.self_attention.layernorm_qkv.",
            "layer.self_attention.proj.",
            "layer.layernorm_mlp.",
        )
    else:
        raise TypeError(f"{type(layer).__name__} is not one of the book's layer forms")
    prefixes = {
        "input_norm": qkv + "layer_norm_",
        "qkv": qkv,
        "proj": proj,
        "mlp_norm": mlp + "layer_norm_",
        "fc1": mlp + "fc1_",
        "fc2": mlp + "fc2_",
    }
    return {
        canonical: prefixes[canonical.split(".")[0]] + canonical.split(".")[1]
        for canonical in CANONICAL_NAMES
    }


def canonical_state_dict(layer: nn.Module, grad: bool = False) -> dict[str, torch.Tensor]:
    """The layer's weights (or, with ``grad=True``, their FP32 gradients) under the canonical names,
    as copies."""
    names = _names(layer)
    checks.flag("grad", grad)
    own = dict(layer.named_parameters())
    state = {}
    for canonical, name in names.items():
        if name not in own:
            continue
        if grad and own[name].grad is None:
            raise ValueError(f"{canonical} has no gradient: run a backward pass first")
        state[canonical] = (own[name].grad.float() if grad else own[name].detach()).clone()
    return state


@torch.no_grad()
def load_canonical_state_dict(layer: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy canonical weights into a layer of any form; the set of names and the shapes must match
    exactly."""
    mapping = _names(layer)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise TypeError(
            f"state must be a dict of canonical names to tensors, not {type(state).__name__}"
        )
    own = dict(layer.named_parameters())
    names = {canonical: name for canonical, name in mapping.items() if name in own}
    if set(state) != set(names):
        raise ValueError(
            f"state names {sorted(map(str, set(state) ^ set(names)))} do not match this "
            f"{type(layer).__name__} (expected {sorted(names)})"
        )
    for canonical, name in names.items():
        if state[canonical].shape != own[name].shape:
            raise ValueError(
                f"{canonical}: shape {tuple(state[canonical].shape)} does not fit "
                f"{type(layer).__name__} ({tuple(own[name].shape)})"
            )
        own[name].copy_(state[canonical])
