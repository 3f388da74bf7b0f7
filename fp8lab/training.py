"""The training loop the chapters share, and the seed-to-seed band every accuracy verdict stands on.

:func:`train_step` is one optimizer step over **N micro-batches** (gradient accumulation), the
step that chapters 06-09 time and train with:

* each micro-batch runs forward under BF16 autocast (on a GPU) and, with a recipe,
  ``te.autocast(recipe=...)``, then backward of ``loss / N``: the accumulated gradient is the
  gradient of the mean loss over the N micro-batches, as for one batch N times larger;
* ``StepOptions.cache_fp8_weights`` passes ``is_first_microbatch=True`` to the TE modules on the
  first micro-batch and ``False`` on the others (TE casts each weight to FP8 once per step and
  reuses the copy; without it, ``None``: a fresh cast every micro-batch);
* ``StepOptions.grad_accumulation`` says where gradients add up: ``"param"`` in each
  parameter's ``.grad`` (autograd's default, in the parameter dtype: BF16 for BF16 weights);
  ``"fp32_buffer"`` in an FP32 ``main_grad`` per parameter, each micro-batch's ``.grad`` added
  into it and freed (Megatron's path without fusion); ``"fused"`` the same buffer, but TE modules
  built with ``fuse_wgrad_accumulation=True`` accumulate their weight gradients straight into
  ``main_grad`` inside the weight-gradient GEMM (``weight.grad`` stays ``None``);
* the ``main_grad`` lifecycle is handled here: allocated once, zeroed once per optimizer step,
  accumulated over the micro-batches, then handed to the optimizer -- as
  ``param.decoupled_grad`` for an optimizer that reads it (TE's ``FusedAdam(...,
  use_decoupled_grad=True)``, whose gradients may have another dtype than the parameters), or as
  ``param.grad`` for FP32 parameters; any other pairing raises, because an optimizer that reads
  ``.grad`` would silently skip every weight whose gradient went to ``main_grad``;
* FP8 weights (a model built under ``te.quantized_model_init``) need an optimizer with FP32
  master weights, such as ``te.optimizers.FusedAdam(params, master_weights=True)``: it updates
  the master copy and writes the FP8 weight back, and that cast is timed as part of the step.

The step records its time on the device (CUDA events; all micro-batches, the hand-over and the
optimizer, and the optimizer alone) and the peak of ``torch.cuda.max_memory_allocated`` over the
step; :func:`time_step` repeats it into a :class:`fp8lab.speedometer.Timing`, and
:func:`training_state_bytes` counts the bytes of parameters, gradients, master weights and
optimizer states that a model and its optimizer hold, under :class:`fp8lab.parts.Part` names.

:func:`train` runs many steps and returns the loss of each: BF16 autocast on a GPU (FP32 on a
CPU, where BF16 matmuls are slow and not what the chapter is about), cross-entropy in FP32
(:func:`lm_loss`), any optimizer.

An FP8 run is judged against a **band**: the spread of the same BF16 run over several seeds
(:class:`SeedBand`). A gap to one BF16 run says nothing until it is compared with how much
BF16 differs from itself. (Introduced in chapter 03; the step with accumulation in chapter 06.)
"""

from __future__ import annotations

import contextlib
import inspect
import statistics
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fp8lab import checks
from fp8lab.parts import CACHE_WORKSPACES, Part

__all__ = [
    "CACHE_WORKSPACES",
    "GRAD_ACCUMULATION",
    "SeedBand",
    "StepOptions",
    "StepResult",
    "final_loss",
    "lm_loss",
    "optimizer_gradients",
    "seed_master_weights",
    "time_step",
    "train",
    "train_step",
    "training_state_bytes",
]

GRAD_ACCUMULATION = ("param", "fp32_buffer", "fused")


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy in FP32: ``logits [B, S, V]`` against ``targets [B, S]``."""
    checks.tensor("logits", logits, dims=3, floating=True)
    checks.tensor("targets", targets, dims=2, floating=False)
    if logits.shape[:2] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)}: B and S must match"
        )
    return F.cross_entropy(
        logits.float().flatten(0, 1), targets.flatten()
    )  # [B*S, V] against [B*S]


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


def _check_model_and_optimizer(model, optimizer, optional: bool = False) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if optional and optimizer is None:
        return
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer, not {type(optimizer).__name__}"
        )


def _trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
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
def _first_microbatch_flag(model: torch.nn.Module, enabled: bool):
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


def _fuses_wgrad(model: torch.nn.Module) -> bool:
    return any(getattr(m, "fuse_wgrad_accumulation", False) is True for m in model.modules())


def _ensure_main_grads(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
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


def _fold_into_main_grads(params: list[torch.nn.Parameter]) -> None:
    """Add every ``.grad`` into ``main_grad`` (FP32) and free it."""
    pairs = [(p.main_grad, p.grad) for p in params if p.grad is not None]
    if pairs:
        buffers, grads = zip(*pairs, strict=True)
        torch._foreach_add_(list(buffers), list(grads))
    for p in params:
        p.grad = None


def _hand_to_optimizer(
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


def _check_micro_batches(micro_batches) -> list:
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


def train_step(
    model: torch.nn.Module,
    micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer | None,
    *,
    te=None,
    fp8_recipe=None,
    options: StepOptions | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = None,
    measure_peak: bool = True,
) -> StepResult:
    """One optimizer step over ``micro_batches`` (N pairs of ``(inputs, targets)``).

    With ``optimizer=None`` the step stops after the micro-batches: the accumulated gradients
    stay where the optimizer would read them (:func:`optimizer_gradients`), the weights unchanged.

    ``te`` and ``fp8_recipe`` (from :func:`fp8lab.import_te`) run each forward under
    ``te.autocast(recipe=fp8_recipe)``; ``options`` is a :class:`StepOptions`; ``loss_fn(output,
    targets)`` returns a scalar (default :func:`lm_loss`: the model returns logits ``[B, S, V]``).
    The model's weights change once, after the last micro-batch. Returns a :class:`StepResult`;
    the host waits for the device once, at the end (to read the loss and the timers).
    ``measure_peak`` resets CUDA's peak-memory counter at the start of the step and reads it at
    the end; ``False`` leaves the counter alone (a caller measuring a whole run) and reports
    ``None``.

    Example (chapter 06)::

        options = StepOptions(cache_fp8_weights=True, grad_accumulation="fused")
        optimizer = te.optimizers.FusedAdam(model.parameters(), lr=3e-4,
                                            master_weights=True, use_decoupled_grad=True)
        result = train_step(model, [(x0, y0), (x1, y1)], optimizer, te=te,
                            fp8_recipe=recipe.DelayedScaling(), options=options)
    """
    _check_model_and_optimizer(model, optimizer, optional=True)
    micro_batches = _check_micro_batches(micro_batches)
    options = StepOptions() if options is None else options
    if not isinstance(options, StepOptions):
        raise TypeError(f"options must be a training.StepOptions, not {type(options).__name__}")
    if fp8_recipe is not None and te is None:
        raise ValueError("fp8_recipe needs te= (the module returned by fp8lab.import_te())")
    loss_fn = lm_loss if loss_fn is None else loss_fn
    checks.flag("measure_peak", measure_peak)
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, not {type(loss_fn).__name__}")
    params = _trainable(model)
    if not params:
        raise ValueError("model has no parameter that requires a gradient")
    mode = options.grad_accumulation
    fused_modules = _fuses_wgrad(model)
    if (mode == "fused") != fused_modules:
        raise ValueError(
            f"grad_accumulation={mode!r} but the model "
            + (
                "has TE modules built with fuse_wgrad_accumulation=True: use 'fused'"
                if fused_modules
                else "has no module built with fuse_wgrad_accumulation=True"
            )
        )
    device = params[0].device
    cuda = device.type == "cuda"
    bf16 = cuda if options.bf16_autocast is None else options.bf16_autocast
    count = len(micro_batches)

    if cuda:
        if measure_peak:
            torch.cuda.reset_peak_memory_stats(device)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        events[0].record()
    else:
        clock = [time.perf_counter()]
    for p in params:
        p.grad = None
    if mode != "param":
        _ensure_main_grads(params)
    total = torch.zeros((), dtype=torch.float32, device=device)
    with _first_microbatch_flag(model, options.cache_fp8_weights) as set_first:
        for index, (inputs, targets) in enumerate(micro_batches):
            set_first(index == 0)
            fp8 = (
                te.autocast(enabled=True, recipe=fp8_recipe)
                if fp8_recipe is not None
                else contextlib.nullcontext()
            )
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16), fp8:
                output = model(inputs)
            loss = loss_fn(output, targets)
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                raise TypeError("loss_fn must return a scalar tensor")
            (loss / count).backward()
            total += loss.detach().float()
            if mode != "param":
                _fold_into_main_grads(params)
    grads = (
        _hand_to_optimizer(params, optimizer, mode)
        if optimizer is not None
        else [p.grad if mode == "param" else p.main_grad for p in params]
    )
    grads = [g for g in grads if g is not None]
    grad_norm = None
    if options.max_grad_norm is not None and grads:
        norm = torch.nn.utils.get_total_norm(grads, error_if_nonfinite=False)
        torch._foreach_mul_(grads, (options.max_grad_norm / (norm + 1e-6)).clamp(max=1.0))
        grad_norm = norm
    if cuda:
        events[1].record()
    else:
        clock.append(time.perf_counter())
    if optimizer is not None:
        optimizer.step()
        if options.refresh_fp8_weights:
            for p in params:
                reset = getattr(p, "_reset_caches", None)  # TE's Float8Tensor: transpose now stale
                if callable(reset):
                    reset()
    if cuda:
        events[2].record()
        events[2].synchronize()
        step_ms = events[0].elapsed_time(events[2])
        optimizer_ms = min(events[1].elapsed_time(events[2]), step_ms)
        peak = int(torch.cuda.max_memory_allocated(device)) if measure_peak else None
    else:
        clock.append(time.perf_counter())
        step_ms, optimizer_ms = (clock[2] - clock[0]) * 1e3, (clock[2] - clock[1]) * 1e3
        peak = None
    if optimizer is None:
        optimizer_ms = 0.0
    return StepResult(
        loss=float(total.item()) / count,
        micro_batches=count,
        step_ms=step_ms,
        optimizer_ms=optimizer_ms,
        peak_memory_bytes=peak,
        grad_norm=None if grad_norm is None else float(grad_norm.item()),
    )


def time_step(
    model: torch.nn.Module,
    micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    *,
    te=None,
    fp8_recipe=None,
    options: StepOptions | None = None,
    loss_fn=None,
    warmup: int = 3,
    iters: int = 10,
    label: str = "step",
):
    """Repeat :func:`train_step` on the same micro-batches; return a
    :class:`fp8lab.speedometer.Timing` of the step times (median, spread), with the peak memory
    over the timed steps and, in ``extra``, the median optimizer time and the step count N.

    The model trains while it is timed (the weights change every step), as it would in a run.
    """
    from fp8lab.speedometer import Timing

    checks.integer("warmup", warmup, minimum=0)
    checks.integer("iters", iters)
    if not isinstance(label, str):
        raise TypeError(f"label={label!r}: must be a string")
    kwargs = {"te": te, "fp8_recipe": fp8_recipe, "options": options, "loss_fn": loss_fn}
    for _ in range(warmup):
        train_step(model, micro_batches, optimizer, **kwargs)
    results = [train_step(model, micro_batches, optimizer, **kwargs) for _ in range(iters)]
    peaks = [r.peak_memory_bytes for r in results if r.peak_memory_bytes is not None]
    return Timing(
        label=label,
        times_ms=tuple(r.step_ms for r in results),
        device=str(next(model.parameters()).device),
        mode="step",
        warmup=warmup,
        grads_zeroed=True,
        peak_memory_bytes=max(peaks) if peaks else None,
        extra={
            "optimizer_ms": statistics.median(r.optimizer_ms for r in results),
            "micro_batches": results[0].micro_batches,
            "loss": results[-1].loss,
        },
    )


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
    _check_model_and_optimizer(model, optimizer)
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


def train(
    model: torch.nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    *,
    te=None,
    fp8_recipe=None,
    bf16_autocast: bool | None = None,
    on_step: Callable[[torch.nn.Module, int], None] | None = None,
    micro_batches: int = 1,
    options: StepOptions | None = None,
    loss_fn=None,
) -> np.ndarray:
    """Train ``model`` on ``batches``; return the loss of each optimizer step as a NumPy array.

    Every ``micro_batches`` consecutive batches make one step of :func:`train_step` (a last
    incomplete group is dropped). ``te`` and ``fp8_recipe`` (from :func:`fp8lab.import_te`) run
    the forward under ``te.autocast(recipe=fp8_recipe)``; without a recipe the TE modules run in
    high precision. ``bf16_autocast`` (or ``options.bf16_autocast``) defaults to True on a GPU and
    False on a CPU. ``on_step(model, step)`` is called after each optimizer step (to log scales,
    say). CUDA's peak-memory counter is left alone, so a caller can read the peak of a whole run.
    """
    _check_model_and_optimizer(model, optimizer)
    if fp8_recipe is not None and te is None:
        raise ValueError("fp8_recipe needs te= (the module returned by fp8lab.import_te())")
    if on_step is not None and not callable(on_step):
        raise TypeError(f"on_step must be callable, not {type(on_step).__name__}")
    checks.integer("micro_batches", micro_batches)
    if bf16_autocast is not None:
        checks.flag("bf16_autocast", bf16_autocast)
    if options is None:
        options = StepOptions(bf16_autocast=bf16_autocast)
    elif not isinstance(options, StepOptions):
        raise TypeError(f"options must be a training.StepOptions, not {type(options).__name__}")
    elif bf16_autocast is not None:
        raise ValueError("give bf16_autocast in options= (StepOptions), not both")
    losses = []
    group: list = []
    for index, batch in enumerate(batches):
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise TypeError(f"batches[{index}] must be an (inputs, targets) pair")
        group.append(batch)
        if len(group) < micro_batches:
            continue
        result = train_step(
            model,
            group,
            optimizer,
            te=te,
            fp8_recipe=fp8_recipe,
            options=options,
            loss_fn=loss_fn,
            measure_peak=False,  # a caller may be measuring the peak of the whole run
        )
        group = []
        losses.append(result.loss)
        if on_step is not None:
            on_step(model, len(losses) - 1)
    if not losses:
        raise ValueError("batches: no batch to train on")
    return np.array(losses)


def final_loss(losses: Sequence[float], tail: float = 0.1) -> float:
    """The mean loss over the last ``tail`` share of a run (at least one step); NaN if any is
    NaN."""
    if not isinstance(losses, (list, tuple, np.ndarray)):
        raise TypeError(f"losses must be a sequence of numbers, not {type(losses).__name__}")
    try:
        values = np.asarray(losses, dtype=float)
    except (TypeError, ValueError):
        raise TypeError("losses must be a sequence of numbers") from None
    if values.ndim != 1 or values.size == 0:
        raise ValueError("losses: must be a non-empty 1-D sequence")
    tail = checks.number("tail", tail, positive=True, maximum=1.0)
    count = max(1, int(round(values.size * tail)))
    return float(values[-count:].mean())


@dataclass(frozen=True)
class SeedBand:
    """The final losses of one setting over several seeds: the noise floor of an accuracy
    verdict."""

    finals: tuple[float, ...]

    def __post_init__(self):
        if not isinstance(self.finals, tuple):
            raise TypeError(f"finals={self.finals!r}: must be a tuple of final losses")
        if len(self.finals) < 2:
            raise ValueError(f"finals: a band needs at least two seeds, got {len(self.finals)}")
        for value in self.finals:
            checks.number("finals[i]", value)

    @classmethod
    def from_runs(cls, runs: Sequence[Sequence[float]], tail: float = 0.1) -> SeedBand:
        return cls(tuple(final_loss(run, tail) for run in runs))

    @property
    def low(self) -> float:
        return min(self.finals)

    @property
    def high(self) -> float:
        return max(self.finals)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.finals)

    @property
    def width(self) -> float:
        return self.high - self.low

    def verdict(self, value: float) -> str:
        """``"inside"`` the band, or ``"above"`` / ``"below"`` it, with the distance in band
        widths."""
        value = checks.number("value", value)
        if self.low <= value <= self.high:
            return "inside"
        side, gap = (
            ("above", value - self.high) if value > self.high else ("below", self.low - value)
        )
        widths = gap / self.width if self.width > 0 else float("inf")
        return f"{side} by {gap:.4f} ({widths:.1f} band widths)"

    def __str__(self) -> str:
        return (
            f"{self.low:.4f}-{self.high:.4f} over {len(self.finals)} seeds (mean {self.mean:.4f})"
        )
