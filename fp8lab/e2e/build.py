"""Building one setting of chapter 09: its FP8 recipe, its model with the shared initial
weights, and its optimizer.

The PyTorch forms are ``fp8lab.models.GPT`` with plain layers (converted to torchao's FP8
training where the setting says so, compiled where it compiles); the TE forms are the same GPT
with ``te.TransformerLayer`` layers. The FP8-weights form holds FP8 parameters (built under
``te.quantized_model_init``) and trains them with TE's ``FusedAdam(master_weights=True)``,
whose FP32 master weights are seeded with the exact initial weights
(:func:`fp8lab.training.seed_master_weights`), not with their FP8 roundings.
"""

from __future__ import annotations

import torch

from fp8lab.config import TransformerConfig
from fp8lab.e2e.settings import Plan, Setting
from fp8lab.models import GPT
from fp8lab.training import seed_master_weights

NO_DROPOUT = {"hidden_dropout": 0.0, "attention_dropout": 0.0}


def fp8_recipe(recipe, setting: Setting, fp8_attention: bool):
    """The TE recipe object of ``setting`` (``recipe`` is TE's recipe module), or ``None``."""
    if setting.recipe == "delayed":
        if fp8_attention:
            return recipe.DelayedScaling(fp8_dpa=True, fp8_mha=True)
        return recipe.DelayedScaling()
    if setting.recipe == "current":
        return recipe.Float8CurrentScaling()
    if setting.recipe == "block":
        return recipe.Float8BlockScaling()
    return None


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay on matrices and embeddings, none on norms and biases."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def adamw(model: torch.nn.Module, plan: Plan, device: torch.device) -> torch.optim.Optimizer:
    """The plan's AdamW (fused on a GPU)."""
    return torch.optim.AdamW(
        param_groups(model, plan.weight_decay),
        lr=plan.lr,
        betas=plan.betas,
        eps=plan.eps,
        fused=device.type == "cuda",
    )


def build_pytorch(cfg: TransformerConfig, plan: Plan, setting: Setting, reference, device):
    """``(model, optimizer, what trains)`` in a PyTorch form: torchao's FP8 training where the
    setting names a torchao recipe (the LM head stays BF16), compiled where it compiles."""
    model = GPT(cfg, form="pytorch", device=device, **NO_DROPOUT)
    model.load_weights_from(reference)
    if setting.torchao is not None:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(
            model,
            config=Float8LinearConfig.from_recipe_name(setting.torchao),
            module_filter_fn=lambda module, fqn: fqn != "head",  # LM head stays BF16
        )
    optimizer = adamw(model, plan, device)
    return model, optimizer, torch.compile(model) if setting.compile else model


def build_te(cfg: TransformerConfig, plan: Plan, te, reference, device, recipe, fp8_weights):
    """``(model, optimizer, what trains)`` with TE layers; with ``fp8_weights``, FP8 parameters
    (BF16 where TE keeps no FP8 copy) and FP32 masters in the optimizer seeded with the exact
    initial weights."""
    twin = GPT(cfg, form="te_layer", te=te, device=device, **NO_DROPOUT)
    twin.load_weights_from(reference)
    if not fp8_weights:
        return twin, adamw(twin, plan, device), twin
    with te.quantized_model_init(enabled=True, recipe=recipe):
        model = GPT(
            cfg, form="te_layer", te=te, params_dtype=torch.bfloat16, device=device, **NO_DROPOUT
        )
    model.load_weights_from(twin)
    optimizer = te.optimizers.FusedAdam(
        param_groups(model, plan.weight_decay),
        lr=plan.lr,
        betas=plan.betas,
        eps=plan.eps,
        master_weights=True,
    )
    seed_master_weights(optimizer, model, source=twin)
    del twin
    return model, optimizer, model
