"""Gradient accumulation: where the gradients of N micro-batches add up, and how the optimizer
gets them.

``StepOptions.grad_accumulation`` says where gradients add up: ``"param"`` in each parameter's
``.grad`` (autograd's default, in the parameter dtype: BF16 for BF16 weights); ``"fp32_buffer"``
in an FP32 ``main_grad`` per parameter, each micro-batch's ``.grad`` added into it and freed
(Megatron's path without fusion); ``"fused"`` the same buffer, but TE modules built with
``fuse_wgrad_accumulation=True`` accumulate their weight gradients straight into ``main_grad``
inside the weight-gradient GEMM (``weight.grad`` stays ``None``).

The ``main_grad`` lifecycle is handled here: allocated once, zeroed once per optimizer step,
accumulated over the micro-batches, then handed to the optimizer -- as ``param.decoupled_grad``
for an optimizer that reads it (TE's ``FusedAdam(..., use_decoupled_grad=True)``, whose
gradients may have another dtype than the parameters), or as ``param.grad`` for FP32
parameters; any other pairing raises, because an optimizer that reads ``.grad`` would silently
skip every weight whose gradient went to ``main_grad``. After the optimizer step the
``decoupled_grad`` references are dropped (:func:`after_optimizer_step`), so the gradients of one
step do not stay alive through the next step's forward and backward.

``StepOptions.cache_fp8_weights`` passes ``is_first_microbatch=True`` to the TE modules on the
first micro-batch and ``False`` on the others (:func:`first_microbatch_flag`).
"""

from __future__ import annotations

import contextlib
import inspect
import weakref

import torch

from fp8lab import checks
from fp8lab.training.state import GRAD_ACCUMULATION


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _is_quantized(tensor: torch.Tensor) -> bool:
    """An FP8 (or other quantized) parameter: TE's ``QuantizedTensor`` or the reference's mark."""
    return bool(getattr(tensor, "_fp8lab_quantized", False)) or any(
        cls.__name__ == "QuantizedTensor" for cls in type(tensor).__mro__
    )


def _takes_first_microbatch(module: torch.nn.Module) -> bool:
    try:
        return "is_first_microbatch" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False


_MICROBATCH_MODULES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _microbatch_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The outermost modules whose forward takes ``is_first_microbatch`` (TE modules; a
    ``TransformerLayer`` passes the flag on to its own); looked up once per model."""
    if model in _MICROBATCH_MODULES:
        return _MICROBATCH_MODULES[model]
    found: list[torch.nn.Module] = []

    def visit(module):
        if _takes_first_microbatch(module):
            found.append(module)
            return
        for child in module.children():
            visit(child)

    visit(model)
    _MICROBATCH_MODULES[model] = found
    return found


@contextlib.contextmanager
def first_microbatch_flag(model: torch.nn.Module, enabled: bool):
    """Yield a setter for the ``is_first_microbatch`` the model's TE modules receive.

    The flag reaches modules that the model calls without it (``GPT`` calls its layers with
    ``(x, rotary)``) through forward pre-hooks, removed again when the step ends.
    """
    current = {"value": None}
    handles = []
    if enabled:
        modules = _microbatch_modules(model)
        if not modules:
            raise ValueError(
                "cache_fp8_weights=True: the model has no module whose forward takes "
                "is_first_microbatch (Transformer Engine modules)"
            )

        def hook(module, args, kwargs):
            kwargs["is_first_microbatch"] = current["value"]
            return args, kwargs

        handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in modules]

    def set_flag(value):
        current["value"] = value

    try:
        yield set_flag
    finally:
        for handle in handles:
            handle.remove()


def fuses_wgrad(model: torch.nn.Module) -> bool:
    return any(getattr(m, "fuse_wgrad_accumulation", False) is True for m in model.modules())


def ensure_main_grads(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """Each parameter's FP32 ``main_grad`` (allocated the first time), zeroed for a new step."""
    buffers = []
    for p in params:
        buffer = getattr(p, "main_grad", None)
        if (
            not isinstance(buffer, torch.Tensor)
            or buffer.shape != p.shape
            or buffer.dtype != torch.float32
            or buffer.device != p.device
        ):
            buffer = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            p.main_grad = buffer
        buffers.append(buffer)
    torch._foreach_zero_(buffers)
    return buffers


def fold_into_main_grads(params: list[torch.nn.Parameter]) -> None:
    """Add every ``.grad`` into ``main_grad`` (FP32) and free it."""
    pairs = [(p.main_grad, p.grad) for p in params if p.grad is not None]
    if pairs:
        buffers, grads = zip(*pairs, strict=True)
        torch._foreach_add_(list(buffers), list(grads))
    for p in params:
        p.grad = None


def hand_to_optimizer(
    params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, mode: str
) -> list[torch.Tensor]:
    """Point the optimizer at the accumulated gradients; return them (for clipping)."""
    decoupled = bool(getattr(optimizer, "use_decoupled_grad", False))
    grads = []
    for p in params:
        grad = p.grad if mode == "param" else p.main_grad
        if grad is None:
            continue
        if decoupled:
            p.decoupled_grad = grad
        elif mode != "param":
            if p.dtype != torch.float32 or _is_quantized(p):
                raise ValueError(
                    f"grad_accumulation={mode!r} keeps FP32 gradients in main_grad, which a "
                    f"{p.dtype} parameter cannot hold as .grad: use an optimizer that reads "
                    "decoupled gradients (te.optimizers.FusedAdam(..., use_decoupled_grad=True))"
                    " or FP32 parameters"
                )
            p.grad = grad
        grads.append(grad)
    return grads


def optimizer_gradients(model: torch.nn.Module, grad_accumulation: str = "param") -> dict:
    """The gradients the optimizer reads after :func:`train_step`, by parameter name, as FP32
    copies: ``main_grad`` for ``"fp32_buffer"``/``"fused"``, ``.grad`` for ``"param"``."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    checks.choice("grad_accumulation", grad_accumulation, GRAD_ACCUMULATION)
    out = {}
    for name, p in model.named_parameters():
        grad = p.grad if grad_accumulation == "param" else getattr(p, "main_grad", None)
        if grad is not None:
            out[name] = grad.detach().float().clone()
    if not out:
        raise ValueError(
            f"grad_accumulation={grad_accumulation!r}: the model holds no such gradients; "
            "run train_step with the same grad_accumulation first"
        )
    return out


def check_micro_batches(micro_batches) -> list:
    if not isinstance(micro_batches, (list, tuple)):
        raise TypeError(
            "micro_batches must be a list of (inputs, targets) pairs, not "
            f"{type(micro_batches).__name__}"
        )
    if not micro_batches:
        raise ValueError("micro_batches: a step needs at least one (inputs, targets) pair")
    for index, batch in enumerate(micro_batches):
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise TypeError(f"micro_batches[{index}] must be an (inputs, targets) pair")
    return list(micro_batches)


def check_accumulation(model: torch.nn.Module, mode: str) -> None:
    """``"fused"`` exactly when the model has TE modules built with
    ``fuse_wgrad_accumulation=True`` (they write into ``main_grad`` and nowhere else)."""
    fused_modules = fuses_wgrad(model)
    if (mode == "fused") != fused_modules:
        raise ValueError(
            f"grad_accumulation={mode!r} but the model "
            + (
                "has TE modules built with fuse_wgrad_accumulation=True: use 'fused'"
                if fused_modules
                else "has no module built with fuse_wgrad_accumulation=True"
            )
        )


def zero_gradients(params: list[torch.nn.Parameter], mode: str) -> None:
    """Free ``.grad`` and, outside ``"param"``, zero the FP32 ``main_grad`` (allocated once)."""
    for p in params:
        p.grad = None
    if mode != "param":
        ensure_main_grads(params)


def after_backward(params: list[torch.nn.Parameter], mode: str) -> None:
    """Outside ``"param"``, move this micro-batch's ``.grad`` into ``main_grad``."""
    if mode != "param":
        fold_into_main_grads(params)


def gradients_for_optimizer(
    params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer | None, mode: str
) -> list[torch.Tensor]:
    """Hand the accumulated gradients to ``optimizer`` (none: leave them where they are) and
    return them, for clipping."""
    if optimizer is not None:
        return hand_to_optimizer(params, optimizer, mode)
    grads = [p.grad if mode == "param" else p.main_grad for p in params]
    return [g for g in grads if g is not None]


def clip_gradients(grads: list[torch.Tensor], max_grad_norm: float | None):
    """Scale ``grads`` in place to a global L2 norm of at most ``max_grad_norm``; return the
    norm before clipping (a device tensor), or ``None`` without clipping."""
    if max_grad_norm is None or not grads:
        return None
    norm = torch.nn.utils.get_total_norm(grads, error_if_nonfinite=False)
    torch._foreach_mul_(grads, (max_grad_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


def after_optimizer_step(params: list[torch.nn.Parameter], refresh_fp8_weights: bool) -> None:
    """Mark FP8 weights' cached transposes stale (``refresh_fp8_weights``, see
    :class:`~fp8lab.training.state.StepOptions`) and drop every ``decoupled_grad``: the optimizer
    has read it, and a reference kept would hold the step's gradients through the next one."""
    for p in params:
        if refresh_fp8_weights:
            reset = getattr(p, "_reset_caches", None)  # TE's Float8Tensor: transpose now stale
            if callable(reset):
                reset()
        if getattr(p, "decoupled_grad", None) is not None:
            p.decoupled_grad = None
