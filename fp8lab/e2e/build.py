"""Building one setting of chapter 09: its FP8 recipe, its model with the shared initial
weights, and its optimizer.

The PyTorch forms are ``fp8lab.models.GPT`` with plain layers (compiled where the setting
compiles); the TE forms are the same GPT with ``te.TransformerLayer`` layers. What trains is
the model with its loss (:class:`fp8lab.e2e.steps.WithLoss`), so that a captured or compiled
step holds the loss too.
"""

from __future__ import annotations

import torch

from fp8lab import recipes
from fp8lab.config import TransformerConfig
from fp8lab.e2e.settings import Plan, Setting
from fp8lab.e2e.steps import WithLoss, compile_torch
from fp8lab.models import GPT

NO_DROPOUT = {"hidden_dropout": 0.0, "attention_dropout": 0.0}


def fp8_recipe(recipe, setting: Setting):
    """The TE recipe object of ``setting`` (``recipe`` is TE's recipe module), or ``None``."""
    if setting.recipe is None:
        return None
    overrides = {}
    if setting.recipe == "delayed":
        overrides = {"amax_history_len": setting.amax_history_len,
                     "amax_compute_algo": setting.amax_compute_algo}
    return recipes.make(recipe, setting.recipe, **overrides)


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


def build_pytorch(
    cfg: TransformerConfig, plan: Plan, setting: Setting, reference, device, graphs=False
):
    """``(model, optimizer, what trains)`` in a PyTorch form, compiled where the setting
    compiles (with CUDA graphs, ``mode="reduce-overhead"``, where ``graphs``)."""
    model = GPT(cfg, form="pytorch", device=device, **NO_DROPOUT)
    model.load_weights_from(reference)
    optimizer = adamw(model, plan, device)
    trained = WithLoss(model)
    if setting.compile:
        trained = compile_torch(trained, reduce_overhead=graphs)
    return model, optimizer, trained


def build_te(cfg: TransformerConfig, plan: Plan, te, reference, device):
    """``(model, optimizer, what trains)`` with TE layers (BF16 or FP8 by the autocast the
    step runs under)."""
    model = GPT(cfg, form="te_layer", te=te, device=device, **NO_DROPOUT)
    model.load_weights_from(reference)
    return model, adamw(model, plan, device), WithLoss(model)
