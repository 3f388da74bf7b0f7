"""What a training step is told and what it reports, and what a model and its optimizer hold.

:class:`StepOptions` says how :func:`fp8lab.training.train_step` turns N micro-batches into one
optimizer step, :class:`StepResult` what one step measured. :func:`training_state_bytes` counts
the bytes of parameters, gradients, master weights and optimizer states under
:class:`fp8lab.parts.Part` names, and :func:`seed_master_weights` sets an optimizer's FP32
master weights to exact values (FP8 weights, chapter 06). The argument checks the step and the
loop share live here too.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch

from fp8lab import checks
from fp8lab.parts import CACHE_WORKSPACES, Part

GRAD_ACCUMULATION = ("param", "fp32_buffer", "fused")


@dataclass(frozen=True)
class StepOptions:
    """How :func:`train_step` turns N micro-batches into one optimizer step.

    ``cache_fp8_weights``: ``is_first_microbatch=True`` on the first micro-batch and ``False`` on
    the rest (TE keeps the FP8 weight copy of the first for the others, and keeps it between
    steps); ``False`` leaves it ``None`` (a fresh cast every micro-batch).
    ``grad_accumulation``: ``"param"``, ``"fp32_buffer"`` or ``"fused"`` (see the module
    docstring); ``"fused"`` needs TE modules built with ``fuse_wgrad_accumulation=True``, and
    those modules need ``"fused"``.
    ``bf16_autocast``: ``torch.autocast`` to BF16 around the forward; ``None`` means on a GPU only.
    ``max_grad_norm``: clip the gradients the optimizer reads to this global L2 norm (``None``: no
    clipping; the norm is then not computed either).
    ``refresh_fp8_weights``: after the optimizer step, mark the cached transposes of FP8 weights
    (``te.quantized_model_init``) stale, so that TE rebuilds them from the new data before the
    backward's data-gradient GEMM reads them. TE 2.20's ``FusedAdam`` writes the FP8 data of
    delayed-scaling weights in place and leaves their transpose as it was (measured on an H200
    in chapter 06); without this, every backward uses the weights of the first step. Parameters
    that are not FP8 tensors are untouched.
    """

    cache_fp8_weights: bool = False
    grad_accumulation: str = "param"
    bf16_autocast: bool | None = None
    max_grad_norm: float | None = None
    refresh_fp8_weights: bool = True

    def __post_init__(self):
        checks.flag("cache_fp8_weights", self.cache_fp8_weights)
        checks.flag("refresh_fp8_weights", self.refresh_fp8_weights)
        checks.choice("grad_accumulation", self.grad_accumulation, GRAD_ACCUMULATION)
        if self.bf16_autocast is not None:
            checks.flag("bf16_autocast", self.bf16_autocast)
        if self.max_grad_norm is not None:
            checks.number("max_grad_norm", self.max_grad_norm, positive=True)


@dataclass(frozen=True)
class StepResult:
    """What one :func:`train_step` measured.

    ``loss``: mean loss over the micro-batches; ``step_ms``: the whole step on the device
    (zeroing, every forward and backward, the hand-over to the optimizer, clipping and the
    optimizer step, master -> FP8 casts included); ``optimizer_ms``: the optimizer step alone;
    ``peak_memory_bytes``: ``torch.cuda.max_memory_allocated`` over the step (``None`` on a CPU);
    ``grad_norm``: the global gradient norm before clipping (``None`` without clipping).
    """

    loss: float
    micro_batches: int
    step_ms: float
    optimizer_ms: float
    peak_memory_bytes: int | None = None
    grad_norm: float | None = None

    def __post_init__(self):
        if isinstance(self.loss, bool) or not isinstance(self.loss, (int, float)):
            raise TypeError(f"loss={self.loss!r}: must be a number")
        checks.integer("micro_batches", self.micro_batches)
        checks.number("step_ms", self.step_ms, non_negative=True)
        checks.number("optimizer_ms", self.optimizer_ms, non_negative=True)
        if self.optimizer_ms > self.step_ms:
            raise ValueError(
                f"optimizer_ms={self.optimizer_ms} exceeds step_ms={self.step_ms}: the optimizer "
                "is part of the step"
            )
        if self.peak_memory_bytes is not None:
            checks.integer("peak_memory_bytes", self.peak_memory_bytes, minimum=0)

    @property
    def micro_batch_ms(self) -> float:
        """Step time per micro-batch."""
        return self.step_ms / self.micro_batches


def check_model_and_optimizer(model, optimizer, optional: bool = False) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if optional and optimizer is None:
        return
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer, not {type(optimizer).__name__}"
        )


def check_te_and_recipe(te, fp8_recipe) -> None:
    """``te`` is the Transformer Engine module and ``fp8_recipe`` a recipe object (both from
    :func:`fp8lab.import_te`, the recipe built from its second value); a swapped pair, or the
    recipe module given where a recipe belongs, raises ``TypeError`` saying which is which."""
    if fp8_recipe is not None and te is None:
        raise ValueError("fp8_recipe needs te= (the module returned by fp8lab.import_te())")
    rule = (
        "te= takes the Transformer Engine module (first value of fp8lab.import_te()), "
        "fp8_recipe= a recipe object such as recipe.DelayedScaling() (built from its second)"
    )
    if te is not None and not callable(getattr(te, "autocast", None)):
        raise TypeError(f"te={checks.show(te)} has no autocast: it is not the TE module; {rule}")
    if isinstance(fp8_recipe, types.ModuleType):
        raise TypeError(f"fp8_recipe={checks.show(fp8_recipe)} is a module, not a recipe; {rule}")


def seed_master_weights(
    optimizer: torch.optim.Optimizer, model: torch.nn.Module, source: torch.nn.Module | None = None
) -> int:
    """Set the FP32 master weights of ``model``'s parameters in ``optimizer`` to exact values.

    A model built under ``te.quantized_model_init`` holds FP8 weights, and an optimizer that
    creates its master weights from them starts from FP8-rounded values. TE's answer is
    ``preserve_high_precision_init_val=True`` and this pattern, used here: initialise the
    parameter's optimizer state, then ``set_scaled_state(param, "master_param", values)``.
    ``source``: a model with the same parameter names and shapes (say the BF16 twin whose weights
    were copied in), else each parameter's ``get_high_precision_init_val()`` (then cleared).
    Needs an optimizer with master weights and TE's state methods (``te.optimizers.FusedAdam(...,
    master_weights=True)``). Returns how many parameters were set.
    """
    check_model_and_optimizer(model, optimizer)
    if not getattr(optimizer, "master_weights", False) or not all(
        callable(getattr(optimizer, name, None))
        for name in ("initialize_state", "set_scaled_state")
    ):
        raise ValueError(
            "optimizer must keep master weights: te.optimizers.FusedAdam(..., master_weights=True)"
        )
    if source is not None and not isinstance(source, torch.nn.Module):
        raise TypeError(f"source must be a torch.nn.Module, not {type(source).__name__}")
    sources = dict(source.named_parameters()) if source is not None else {}
    owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
    count = 0
    for name, p in model.named_parameters():
        if id(p) not in owned:
            continue
        if source is not None:
            if name not in sources or sources[name].shape != p.shape:
                raise ValueError(f"source has no parameter {name!r} of shape {tuple(p.shape)}")
            values = sources[name].detach()
        else:
            getter = getattr(p, "get_high_precision_init_val", None)
            values = getter() if callable(getter) else None
            if values is None:
                continue
        if "master_param" not in optimizer.state[p]:
            optimizer.initialize_state(p, False)
        optimizer.set_scaled_state(p, "master_param", values.to(p.device, torch.float32))
        if source is None:
            p.clear_high_precision_init_val()
        count += 1
    return count


def _storage_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The tensors that hold ``tensor``'s bytes: an FP8 tensor's data and transpose (TE), or
    itself."""
    if hasattr(tensor, "get_data_tensors"):
        parts = tensor.get_data_tensors()
        parts = parts if isinstance(parts, (tuple, list)) else (parts,)
        return [t for t in parts if isinstance(t, torch.Tensor)]
    return [tensor]


def training_state_bytes(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, int]:
    """Bytes the model and its optimizer hold now, by part, under :class:`fp8lab.parts.Part`
    names: parameters (an FP8 weight's data and transpose), gradients (``.grad`` and
    ``main_grad``), master weights (the optimizer's ``master_param``), optimizer states (every
    other tensor of its state), and the FP8 weight copies that TE modules keep between steps when
    ``is_first_microbatch`` is used. A tensor shared by two names counts once."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer, not {type(optimizer).__name__}"
        )
    seen: set[tuple[str, int]] = set()
    parts = {
        Part.PARAMETERS: 0,
        Part.GRADIENTS: 0,
        Part.MASTER_WEIGHTS: 0,
        Part.OPTIMIZER_STATES: 0,
        CACHE_WORKSPACES: 0,
    }

    def add(part: str, tensor) -> None:
        if not isinstance(tensor, torch.Tensor):
            return
        for t in _storage_tensors(tensor):
            if t.device.type == "meta" or t.numel() == 0:
                continue
            key = (str(t.device), t.untyped_storage().data_ptr())
            if key not in seen:
                seen.add(key)
                parts[part] += t.untyped_storage().nbytes()

    params = list(model.parameters())
    for p in params:
        add(Part.PARAMETERS, p)
    for p in params:
        add(Part.GRADIENTS, p.grad)
        add(Part.GRADIENTS, getattr(p, "main_grad", None))
        add(Part.GRADIENTS, getattr(p, "decoupled_grad", None))
    if optimizer is not None:
        for state in optimizer.state.values():
            for name, value in state.items():
                add(Part.MASTER_WEIGHTS if name == "master_param" else Part.OPTIMIZER_STATES, value)
    for module in model.modules():
        for cache in ("_fp8_workspaces", "_weight_cache"):
            for value in getattr(module, cache, {}).values():
                add(CACHE_WORKSPACES, value)
    return parts
