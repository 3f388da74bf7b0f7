"""Chapter 09's training step, written so that the host never waits for the device.

A step is forward (BF16 autocast on a GPU, TE's FP8 autocast with a recipe), the loss
(next-token cross-entropy in FP32, inside :class:`WithLoss`, without the id checks of
:func:`fp8lab.training.lm_loss` and of the model: they wait for the device, and the ids come
from the kit's own loader), backward, clipping of the global
gradient norm (on the device: no ``.item()``), the optimizer and ``zero_grad``. Its loss is
copied into a tensor on the device (:class:`LossLog`), read back only at evaluation points, so
the host can run ahead of the GPU, and the GPU, not Python, sets the pace wherever the GPU has
enough work.

Two forms remove the host from the small model's step entirely:
:func:`graph_te` captures the TE model and its loss with ``te.make_graphed_callables``
(forward and backward replayed as CUDA graphs), and :func:`compile_torch` compiles the PyTorch
model with ``torch.compile(mode="reduce-overhead")`` (CUDA graphs by way of PyTorch's
cudagraph trees). Either may fail on a given stack; the caller records why
(:mod:`fp8lab.e2e.speed`).

Delayed scaling starts every scale at 1.0, so its first step quantizes with scales that fit
no tensor: gradients far below E5M2's smallest step flush to zero and the first update is lost.
:func:`calibrate` runs one forward and backward that only fills the amax history, then throws
the gradients away, so step 0 already quantizes with measured scales.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F


class WithLoss(torch.nn.Module):
    """``model`` and its next-token loss as one module: ``(inputs, targets) -> loss``. One
    module to capture or compile, so the loss is part of the graph. The model's token check is
    turned off (it waits for the device)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        model.check_tokens = False

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.model(inputs)  # [B, S, V]
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


class LossLog:
    """The loss of every step, written on the device; :meth:`read` waits for it."""

    def __init__(self, steps: int, device: torch.device):
        self.values = torch.full((steps,), float("nan"), device=device)
        self.count = 0

    def add(self, loss: torch.Tensor) -> None:
        self.values[self.count].copy_(loss.detach(), non_blocking=True)
        self.count += 1

    def read(self, start: int = 0) -> list[float]:
        """The losses from step ``start`` on (one host sync)."""
        return self.values[start : self.count].float().cpu().tolist()


@contextlib.contextmanager
def precision(device: torch.device, te=None, fp8_recipe=None, bf16: bool = True):
    """BF16 autocast on a GPU (``bf16=False``: none, for a captured graph that holds its own
    dtypes), and TE's FP8 autocast with a recipe."""
    fp8 = (
        te.autocast(enabled=True, recipe=fp8_recipe)
        if fp8_recipe is not None
        else contextlib.nullcontext()
    )
    on = bf16 and device.type == "cuda"
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on), fp8:
        yield


def step(trained, batch, optimizer, max_grad_norm: float, fp8: dict, bf16: bool = True):
    """One optimizer step of ``trained`` (a :class:`WithLoss`, plain, captured or compiled) on
    ``batch``; returns the loss as a device tensor (no host sync)."""
    inputs, targets = batch
    device = inputs.device
    if getattr(trained, "reduce_overhead", False):
        torch.compiler.cudagraph_mark_step_begin()
    with precision(device, fp8.get("te"), fp8.get("fp8_recipe"), bf16=bf16):
        loss = trained(inputs, targets)
    loss.backward()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(params, max_grad_norm, foreach=device.type == "cuda")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def calibrate(trained, batch, optimizer, fp8: dict) -> None:
    """One forward and backward in FP8 that fills the delayed-scaling amax history (TE updates
    the scales from it), with its gradients thrown away: no optimizer step."""
    inputs, targets = batch
    with precision(inputs.device, fp8.get("te"), fp8.get("fp8_recipe")):
        loss = trained(inputs, targets)
    loss.backward()
    optimizer.zero_grad(set_to_none=True)


def graph_te(wrapped: WithLoss, batch, te, fp8_recipe):
    """``wrapped`` captured as CUDA graphs (forward and backward) by
    ``te.make_graphed_callables``, FP8 with ``fp8_recipe`` (BF16 without). Capture runs under
    BF16 autocast without its weight cache (TE refuses the cache); replays keep the dtypes
    captured. Raises whatever TE raises."""
    inputs, targets = batch
    cls = type(wrapped)
    had_own_call = "__call__" in cls.__dict__
    call = cls.__call__
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            return te.make_graphed_callables(
                wrapped,
                (inputs.clone(), targets.clone()),
                enabled=fp8_recipe is not None,
                recipe=fp8_recipe,
                allow_unused_input=True,
            )
    finally:  # TE wraps the class's __call__ while it captures: undo it even on a failure
        if had_own_call:
            cls.__call__ = call
        elif "__call__" in cls.__dict__:
            del cls.__call__


def compile_torch(wrapped: WithLoss, reduce_overhead: bool):
    """``wrapped`` compiled, with CUDA graphs (``mode="reduce-overhead"``) or without."""
    wrapped.reduce_overhead = reduce_overhead  # step() marks each step for cudagraph trees
    return torch.compile(wrapped, mode="reduce-overhead" if reduce_overhead else None)
