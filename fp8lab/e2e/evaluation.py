"""The validation loss of chapter 09's runs.

:func:`evaluate` runs under ``torch.no_grad()``. Besides saving the activations, that keeps the
validation batches out of the FP8 scaling state: Transformer Engine updates a delayed-scaling
recipe's amax history when its ``autocast`` exits, and only when gradients are enabled, so
forwards without gradients leave the history (and with it the scales of the next training
steps) as training left it. Validation then measures the model without changing the run.
"""

from __future__ import annotations

import torch

from fp8lab import checks
from fp8lab.training import lm_loss
from fp8lab.training.state import check_model_and_optimizer, check_te_and_recipe


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches, te=None, fp8_recipe=None) -> float:
    """Mean next-token loss over ``batches`` (``(inputs, targets)`` pairs), in the precision the
    model trains in (BF16 autocast on a GPU, and ``te.autocast(recipe=fp8_recipe)`` with a
    recipe), without gradients: the FP8 amax history is not rolled (see the module docstring).
    The model is put in eval mode and back."""
    check_model_and_optimizer(model, None, optional=True)
    check_te_and_recipe(te, fp8_recipe)
    if not isinstance(batches, (list, tuple)) or not batches:
        raise TypeError(f"batches={checks.show(batches)}: must be a non-empty list of pairs")
    if not all(isinstance(b, (list, tuple)) and len(b) == 2 for b in batches):
        raise TypeError("batches: every batch must be an (inputs, targets) pair")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = torch.zeros((), device=device, dtype=torch.float64), 0
    for inputs, targets in batches:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            if fp8_recipe is not None:
                with te.autocast(enabled=True, recipe=fp8_recipe):
                    logits = model(inputs)
            else:
                logits = model(inputs)
        total += lm_loss(logits, targets).double() * targets.numel()
        count += targets.numel()
    model.train(was_training)
    return (total / count).item()
