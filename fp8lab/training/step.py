"""One optimizer step over N micro-batches (gradient accumulation): the step that chapters 06-09
time and train with.

Each micro-batch runs forward under BF16 autocast (on a GPU) and, with a recipe,
``te.autocast(recipe=...)``, then backward of ``loss / N``: the accumulated gradient is the
gradient of the mean loss over the N micro-batches, as for one batch N times larger. Then the
gradients go to the optimizer (:mod:`fp8lab.training.accumulation` says where they add up and
how they are handed over), are clipped, the optimizer steps, and its gradient references are
dropped.

FP8 weights (a model built under ``te.quantized_model_init``) need an optimizer with FP32
master weights, such as ``te.optimizers.FusedAdam(params, master_weights=True)``: it updates the
master copy and writes the FP8 weight back, and that cast is timed as part of the step. The
step records its time on the device (the book's one clock, :class:`fp8lab.speedometer.Clock`,
with a mark at the hand-over to the optimizer) and its peak memory; :func:`time_step` repeats
it into a :class:`fp8lab.speedometer.Timing`.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from fp8lab import checks
from fp8lab.speedometer import Clock, Timing
from fp8lab.training import accumulation as grads_of
from fp8lab.training.loss import lm_loss
from fp8lab.training.state import (
    StepOptions,
    StepResult,
    check_model_and_optimizer,
    check_te_and_recipe,
)


@dataclass
class _Setup:
    """A checked step: the trainable parameters, the options, and the loss and precision
    contexts of each micro-batch."""

    micro_batches: list
    params: list
    options: StepOptions
    loss_fn: Callable
    te: object
    fp8_recipe: object
    measure_peak: bool

    @property
    def device(self) -> torch.device:
        return self.params[0].device

    def peak(self) -> int | None:
        """CUDA's peak allocation since :func:`_prepare` reset it (None when not measured)."""
        return int(torch.cuda.max_memory_allocated(self.device)) if self.measure_peak else None

    @contextlib.contextmanager
    def autocast(self):
        """BF16 autocast (by default on a GPU only), and TE's FP8 autocast with a recipe."""
        bf16 = self.options.bf16_autocast
        bf16 = self.device.type == "cuda" if bf16 is None else bf16
        fp8 = (
            self.te.autocast(enabled=True, recipe=self.fp8_recipe)
            if self.fp8_recipe is not None
            else contextlib.nullcontext()
        )
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16), fp8:
            yield

    def loss(self, output, targets) -> torch.Tensor:
        loss = self.loss_fn(output, targets)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise TypeError("loss_fn must return a scalar tensor")
        return loss


def _prepare(model, micro_batches, optimizer, te, fp8_recipe, options, loss_fn, peak) -> _Setup:
    check_model_and_optimizer(model, optimizer, optional=True)
    micro_batches = grads_of.check_micro_batches(micro_batches)
    options = StepOptions() if options is None else options
    if not isinstance(options, StepOptions):
        raise TypeError(f"options must be a training.StepOptions, not {type(options).__name__}")
    check_te_and_recipe(te, fp8_recipe)
    loss_fn = lm_loss if loss_fn is None else loss_fn
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, not {type(loss_fn).__name__}")
    params = grads_of.trainable(model)
    if not params:
        raise ValueError("model has no parameter that requires a gradient")
    grads_of.check_accumulation(model, options.grad_accumulation)
    peak = checks.flag("measure_peak", peak) and params[0].device.type == "cuda"
    if peak:
        torch.cuda.reset_peak_memory_stats(params[0].device)
    return _Setup(micro_batches, params, options, loss_fn, te, fp8_recipe, peak)


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
    """One optimizer step over ``micro_batches`` (N ``(inputs, targets)`` pairs); returns a
    :class:`StepResult`. ``te``/``fp8_recipe`` (from :func:`fp8lab.import_te`) run each forward
    under ``te.autocast(recipe=fp8_recipe)``; ``loss_fn(output, targets)`` returns a scalar
    (default :func:`lm_loss` on logits ``[B, S, V]``). With ``optimizer=None`` the step stops
    before the optimizer: the gradients stay where it would read them
    (:func:`optimizer_gradients`). The host waits for the device once, at the end.
    ``measure_peak=False`` leaves CUDA's peak counter alone (a caller measuring a whole run).

    Example (chapter 06)::

        options = StepOptions(cache_fp8_weights=True, grad_accumulation="fused")
        optimizer = te.optimizers.FusedAdam(model.parameters(), lr=3e-4,
                                            master_weights=True, use_decoupled_grad=True)
        result = train_step(model, [(x0, y0), (x1, y1)], optimizer, te=te,
                            fp8_recipe=recipe.DelayedScaling(), options=options)
    """
    step = _prepare(model, micro_batches, optimizer, te, fp8_recipe, options, loss_fn,
                    measure_peak)
    params, options, count = step.params, step.options, len(step.micro_batches)
    mode = options.grad_accumulation
    clock = Clock(step.device)
    grads_of.zero_gradients(params, mode)
    total = torch.zeros((), dtype=torch.float32, device=step.device)
    with grads_of.first_microbatch_flag(model, options.cache_fp8_weights) as set_first:
        for index, (inputs, targets) in enumerate(step.micro_batches):
            set_first(index == 0)
            with step.autocast():
                output = model(inputs)
            loss = step.loss(output, targets)
            (loss / count).backward()
            total += loss.detach().float()
            grads_of.after_backward(params, mode)
    grads = grads_of.gradients_for_optimizer(params, optimizer, mode)
    grad_norm = grads_of.clip_gradients(grads, options.max_grad_norm)
    clock.mark()  # the hand-over to the optimizer
    if optimizer is not None:
        optimizer.step()
        grads_of.after_optimizer_step(params, options.refresh_fp8_weights)
    clock.mark()
    before_ms, optimizer_ms = clock.read()
    return StepResult(
        loss=float(total.item()) / count,
        micro_batches=count,
        step_ms=before_ms + optimizer_ms,
        optimizer_ms=optimizer_ms if optimizer is not None else 0.0,
        peak_memory_bytes=step.peak(),
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
) -> Timing:
    """Repeat :func:`train_step` on the same micro-batches; return a
    :class:`fp8lab.speedometer.Timing` of the step times (median, spread), with the peak memory
    over the timed steps and, in ``extra``, the median optimizer time and the step count N.

    The model trains while it is timed (the weights change every step), as it would in a run.
    """
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
