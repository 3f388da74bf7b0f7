"""The model every layout trains, its data, its optimizer and one training step.

The model is a stack of ``te.TransformerLayer`` (``TransformerConfig.num_layers`` of them),
dropout off (so that every layout computes the same function and can be checked against one
GPU), causal attention, fused QKV in TE's non-interleaved order. The loss is the mean squared
error against a random target; the optimizer is TE's ``FusedAdam`` with FP32 master weights
(``torch.optim.AdamW`` on the CPU reference). How a layout wraps or shards this model is in
:mod:`fp8lab.parallel.layouts`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fp8lab import checks, recipes
from fp8lab.config import TransformerConfig
from fp8lab.parallel.process import Context


def config_of(args: dict) -> TransformerConfig:
    """The task's model shape (``args["model"]``, a :class:`TransformerConfig` as a dict)."""
    return TransformerConfig(**args["model"])


def dtype_of(ctx: Context) -> torch.dtype:
    """BF16 on GPUs; FP32 on the CPU reference (BF16 matmuls on CPUs are slow and not the point)."""
    return torch.bfloat16 if ctx.cuda else torch.float32


def fp8_recipe(ctx: Context, **changes):
    """The chapter's FP8 recipe: delayed scaling, TE's default on Hopper."""
    return recipes.make(ctx.recipes, "delayed", **changes)


def build_model(
    ctx: Context,
    cfg: TransformerConfig,
    *,
    device: str | None = None,
    seed: int = 1234,
    params_dtype: torch.dtype | None = None,
    **parallel,
) -> torch.nn.Sequential:
    """``cfg.num_layers`` ``te.TransformerLayer``s; the same weights on every rank (one seed).

    ``parallel`` is passed on to every layer: the tensor-parallel options a layout sets
    (:func:`fp8lab.parallel.layouts.tensor_parallel_model`). ``params_dtype`` overrides the
    lane's dtype (FP32 for the reference the checks measure distances from).
    """
    te = ctx.te
    torch.manual_seed(seed)
    kwargs = {
        "num_gqa_groups": cfg.groups,
        "kv_channels": cfg.head_dim,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "self_attn_mask_type": "causal",
        "bias": cfg.bias,
        "activation": cfg.activation,
        "normalization": cfg.normalization,
        "params_dtype": params_dtype or dtype_of(ctx),
        "fuse_qkv_params": True,
        "qkv_weight_interleaved": False,
        "device": device or ("cuda" if ctx.cuda else "cpu"),
        **parallel,
    }
    layers = [
        te.TransformerLayer(
            cfg.hidden_size,
            cfg.ffn_hidden_size,
            cfg.num_attention_heads,
            layer_number=i + 1,
            **kwargs,
        )
        for i in range(cfg.num_layers)
    ]
    return torch.nn.Sequential(*layers)


def initialize_meta_parameters(model: torch.nn.Module, device: torch.device) -> None:
    """Allocate and initialise parameters left on the ``meta`` device (the CPU reference has no
    ``reset_parameters``): norms 1, biases 0, weights N(0, 0.023)."""
    model.to_empty(device=device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            local = param.to_local() if hasattr(param, "to_local") else param
            if "norm_weight" in name:
                local.fill_(1.0)
            elif local.dim() == 1:
                local.zero_()
            else:
                local.normal_(0.0, 0.023)


def make_optimizer(ctx: Context, parameters, lr: float = 1e-4):
    """TE's FusedAdam with FP32 master weights on GPUs; AdamW on the CPU reference."""
    lr = checks.number("lr", lr, positive=True)
    parameters = list(parameters)
    if ctx.cuda:
        return ctx.te.optimizers.FusedAdam(
            parameters, lr=lr, master_weights=True, master_weight_dtype=torch.float32
        )
    return torch.optim.AdamW(parameters, lr=lr)


def batch_data(ctx: Context, cfg: TransformerConfig, seq: int, batch: int, seed: int = 7):
    """A global batch ``x, target`` of shape ``[S, B, H]``, the same on every rank."""
    generator = torch.Generator(device=ctx.device).manual_seed(seed)
    shape = (seq, batch, cfg.hidden_size)
    x = torch.randn(shape, generator=generator, device=ctx.device).to(dtype_of(ctx))
    target = torch.randn(shape, generator=generator, device=ctx.device)
    return x, target


def autocast_args(ctx: Context, precision: str, group, **recipe_changes) -> dict:
    """``te.autocast`` arguments: FP8 delayed scaling with amaxes reduced over ``group``."""
    if precision == "bf16":
        return {"enabled": False}
    return {
        "enabled": True,
        "recipe": fp8_recipe(ctx, **recipe_changes),
        "amax_reduction_group": group,
    }


def training_step(ctx, model, optimizer, x, target, fp8: dict, after_backward=None):
    """One step: forward under ``te.autocast(**fp8)``, MSE loss, backward, optimizer step."""

    def step():
        with ctx.te.autocast(**fp8):
            out = model(x)
        loss = F.mse_loss(out.float(), target)
        loss.backward()
        if after_backward is not None:
            after_backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step
