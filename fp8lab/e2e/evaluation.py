"""The validation loss of chapter 09's runs.

:func:`evaluate` runs under ``torch.no_grad()``. Besides saving the activations, that keeps the
validation batches out of the FP8 scale updates: Transformer Engine rolls a delayed-scaling
recipe's amax history and recomputes its scales when its ``autocast`` exits, and only when
gradients are enabled. The forward casts still write their amaxes into the history's current
slot, which the next training step's update reads with its own; against a history of 1,024
steps reduced by "max", that changes the next scales only if validation's activations exceed
every recent training step's, which this book's runs do not check.
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
    recipe), without gradients: no scale is updated (TE updates only on leaving an autocast
    with gradients on), though the forward's amaxes land in the current slot of the history,
    which the next training step's update then reads (negligible against a long history).
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
