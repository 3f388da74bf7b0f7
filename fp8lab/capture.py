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


def _check_arguments(model, forward_and_loss, module_types, max_elements) -> tuple[type, ...]:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if not callable(forward_and_loss):
        raise TypeError(f"forward_and_loss must be callable, not {type(forward_and_loss).__name__}")
    checks.integer("max_elements", max_elements)
    if isinstance(module_types, (str, bytes, type)) or not isinstance(module_types, Iterable):
        raise TypeError(
            f"module_types={module_types!r}: must be a non-empty sequence of classes, "
            f"not {type(module_types).__name__}"
        )
    module_types = tuple(module_types)
    if not module_types or not all(isinstance(t, type) for t in module_types):
        raise TypeError(f"module_types={module_types!r}: must be a non-empty sequence of classes")
    return module_types


class _Keeper:
    """Detached CPU copies of captured tensors, subsampled to ``max_elements`` keeping the amax."""

    def __init__(self, max_elements: int):
        self.max_elements = max_elements
        self.generator = torch.Generator().manual_seed(0)
        self.captured: dict[str, torch.Tensor] = {}

    def __call__(self, name: str, tensor: torch.Tensor) -> None:
        flat = tensor.detach().float().flatten().cpu()
        if flat.numel() > self.max_elements:
            keep_at = torch.randperm(flat.numel(), generator=self.generator)[: self.max_elements]
            largest = flat.abs().argmax()
            if not (keep_at == largest).any():
                keep_at[0] = largest  # the amax survives the subsample
            flat = flat[keep_at]
        self.captured[name] = flat


def _output_tensor(output):
    """The tensor a module returned (TE modules may return ``(out, bias)``)."""
    if isinstance(output, (tuple, list)) and output:
        output = output[0]
    return output if isinstance(output, torch.Tensor) else None


def _hook_module(name: str, module: nn.Module, keep: _Keeper):
    """Record the module's input on the forward, and the gradient of its output on the backward.

    The output gradient is taken with a hook on the output tensor itself: a module backward hook
    would also fire (with a warning) where no input requires a gradient.
    """

    def on_forward(mod, inputs, output):
        keep(f"{name}.activation", inputs[0])
        out = _output_tensor(output)
        if out is not None and out.requires_grad:
            out.register_hook(lambda grad: keep(f"{name}.output gradient", grad))

    return module.register_forward_hook(on_forward)


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
    module_types = _check_arguments(model, forward_and_loss, module_types, max_elements)
    keep = _Keeper(max_elements)
    targets = [
        (name, module) for name, module in model.named_modules() if isinstance(module, module_types)
    ]
    if not targets:
        raise ValueError(f"model has no modules of types {[t.__name__ for t in module_types]}")
    handles = [_hook_module(name, module, keep) for name, module in targets]
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
    return keep.captured


def _check_captured(captured) -> None:
    if not isinstance(captured, dict):
        raise TypeError(
            f"captured must be the dict capture_step returns, not {type(captured).__name__}"
        )
    for name, tensor in captured.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"captured must map names to tensors (as capture_step returns), not "
                f"{type(name).__name__} to {type(tensor).__name__}"
            )


def of_kind(captured: dict[str, torch.Tensor], kind: str) -> dict[str, torch.Tensor]:
    """The captured tensors of one kind, each on its own: ``{"layers.0.fc1": ..., ...}``.

    An FP8 recipe scales each of these separately (one amax per tensor), so per-tensor
    questions must be asked of these, not of :func:`by_kind`'s concatenation.
    """
    _check_captured(captured)
    checks.choice("kind", kind, KINDS)
    suffix = "." + kind
    return {name[: -len(suffix)]: t for name, t in captured.items() if name.endswith(suffix)}


def by_kind(captured: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """All captured tensors of each kind, concatenated: ``{"activation": ..., "weight": ...}``.

    For histograms of a kind across the model; one scale for such a concatenation is *not*
    what a per-tensor recipe does (see :func:`of_kind`).
    """
    _check_captured(captured)
    return {
        kind: torch.cat([t for n, t in captured.items() if n.endswith("." + kind)])
        for kind in KINDS
        if any(n.endswith("." + kind) for n in captured)
    }
