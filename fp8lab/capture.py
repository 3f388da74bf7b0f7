"""Capture the tensors an FP8 cast would see in one training step: weights, activations, gradients.

For every module of the given types (``torch.nn.Linear`` by default; TE's ``Linear`` and
friends work too), one forward and backward records the GEMM input (activation), the
weight, the gradient arriving at the module's output, and the weight's gradient. The
tensors are detached copies on the CPU, named ``"<module>.<kind>"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from fp8lab import checks

__all__ = ["KINDS", "by_kind", "capture_step", "of_kind"]

KINDS = ("activation", "weight", "output gradient", "weight gradient")


def capture_step(
    model: nn.Module,
    forward_and_loss: Callable[[], torch.Tensor],
    module_types: Iterable[type] = (nn.Linear,),
    max_elements: int = 1 << 16,
) -> dict[str, torch.Tensor]:
    """Run ``forward_and_loss()`` and its backward; return the captured tensors.

    ``max_elements`` keeps a random subsample of larger tensors (histograms do not need all).
    The subsample always holds the tensor's largest magnitude, so its amax -- what a per-tensor
    FP8 scale is computed from -- is the whole tensor's.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if not callable(forward_and_loss):
        raise TypeError(f"forward_and_loss must be callable, not {type(forward_and_loss).__name__}")
    checks.integer("max_elements", max_elements)
    module_types = tuple(module_types)
    if not module_types or not all(isinstance(t, type) for t in module_types):
        raise TypeError(f"module_types={module_types!r}: must be a non-empty sequence of classes")
    captured: dict[str, torch.Tensor] = {}
    generator = torch.Generator().manual_seed(0)

    def keep(name: str, tensor: torch.Tensor) -> None:
        flat = tensor.detach().float().flatten().cpu()
        if flat.numel() > max_elements:
            keep_at = torch.randperm(flat.numel(), generator=generator)[:max_elements]
            largest = flat.abs().argmax()
            if not (keep_at == largest).any():
                keep_at[0] = largest  # the amax survives the subsample
            flat = flat[keep_at]
        captured[name] = flat

    handles = []
    targets = [
        (name, module) for name, module in model.named_modules() if isinstance(module, module_types)
    ]
    if not targets:
        raise ValueError(f"model has no modules of types {[t.__name__ for t in module_types]}")
    for name, module in targets:
        handles.append(
            module.register_forward_hook(
                lambda mod, inputs, output, name=name: keep(f"{name}.activation", inputs[0])
            )
        )
        handles.append(
            module.register_full_backward_hook(
                lambda mod, grad_in, grad_out, name=name: keep(
                    f"{name}.output gradient", grad_out[0]
                )
            )
        )
    try:
        loss = forward_and_loss()
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    for name, module in targets:
        weight = getattr(module, "weight", None)
        if weight is not None:
            keep(f"{name}.weight", weight)
            if weight.grad is not None:
                keep(f"{name}.weight gradient", weight.grad)
    return captured


def of_kind(captured: dict[str, torch.Tensor], kind: str) -> dict[str, torch.Tensor]:
    """The captured tensors of one kind, each on its own: ``{"layers.0.fc1": ..., ...}``.

    An FP8 recipe scales each of these separately (one amax per tensor), so per-tensor
    questions must be asked of these, not of :func:`by_kind`'s concatenation.
    """
    checks.choice("kind", kind, KINDS)
    suffix = "." + kind
    return {name[: -len(suffix)]: t for name, t in captured.items() if name.endswith(suffix)}


def by_kind(captured: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """All captured tensors of each kind, concatenated: ``{"activation": ..., "weight": ...}``.

    For histograms of a kind across the model; one scale for such a concatenation is *not*
    what a per-tensor recipe does (see :func:`of_kind`).
    """
    if not isinstance(captured, dict):
        raise TypeError(
            f"captured must be the dict capture_step returns, not {type(captured).__name__}"
        )
    return {
        kind: torch.cat([t for n, t in captured.items() if n.endswith("." + kind)])
        for kind in KINDS
        if any(n.endswith("." + kind) for n in captured)
    }
