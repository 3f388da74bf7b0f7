"""A training step whose time the GPU sets: the stack's forward and backward under CUDA graphs.

A CUDA graph replays a captured sequence of kernels with one launch, so the host's Python and
launch overhead drop out of the step. TE's ``make_graphed_callables`` (``pytorch/graph.py``,
TE 2.20) captures TE modules under FP8: ``enabled`` and ``recipe`` set the autocast it runs the
capture in, and ``cache_quantized_params=True`` (formerly ``fp8_weight_caching``) keeps the FP8
weight copies between micro-batches. The graphed callable then needs the
``is_first_microbatch`` keyword on every call; TE turns it into a flag tensor the captured
kernels read (``skip_fp8_weight_update = not is_first_microbatch``), since a graph cannot
branch on a Python value.

The optimizer step stays outside the graph (TE's ``FusedAdam`` reading ``.grad``). The graphed
backward hands the weight gradients over from the capture's side stream to ``AccumulateGrad``
nodes made on the default stream, and PyTorch (2.9 and later) warns about the stream mismatch:
the extra synchronisation it names is part of what the step's time measures, and nothing here is
captured after that point, so :func:`graphed_stack_step` silences that one warning.
:func:`attempt` runs a risky call and turns an exception into the words of a table row.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

_STREAM_MISMATCH = "The AccumulateGrad node's stream does not match"

__all__ = ["attempt", "graphed_stack_step"]


def attempt(fn: Callable[[], Any]) -> tuple[Any, str | None]:
    """``(fn(), None)``, or ``(None, "refused: <error>")`` if it raises (the error's first line,
    no closing period)."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    try:
        return fn(), None
    except Exception as error:  # a refusal becomes a row of the page, not a dead notebook
        # its first line, without a closing period: the words go into sentences and cells
        first = (str(error).strip().splitlines() or [""])[0][:120].rstrip(". ")
        return None, f"refused: {type(error).__name__}: {first}"


def graphed_stack_step(
    te,
    model: torch.nn.Module,
    micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    fp8_recipe,
    *,
    cache: bool,
    loss_fn: Callable,
    lr: float = 1e-4,
) -> Callable[[], float]:
    """Capture ``model``'s forward and backward once with ``te.make_graphed_callables`` and
    return a step: N graphed micro-batches (``is_first_microbatch`` passed when ``cache``),
    then ``FusedAdam(master_weights=True)``. Raises what TE raises (see :func:`attempt`)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if not micro_batches:
        raise ValueError("micro_batches: must hold at least one (input, target) pair")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable")
    if not hasattr(te, "make_graphed_callables"):
        raise NotImplementedError("CUDA graphs need TE on a GPU (the CPU reference has none)")
    sample = micro_batches[0][0].detach().clone().requires_grad_(True)
    cls = type(model)
    own_call = cls.__dict__.get("__call__")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_STREAM_MISMATCH, category=UserWarning)
            graphed = te.make_graphed_callables(
                model, (sample,), enabled=fp8_recipe is not None, recipe=fp8_recipe,
                cache_quantized_params=cache)
    finally:  # TE wraps the model's class __call__ during capture; a failed capture keeps it
        if own_call is None:
            if "__call__" in cls.__dict__:
                delattr(cls, "__call__")
        else:
            cls.__call__ = own_call
    optimizer = te.optimizers.FusedAdam(model.parameters(), lr=lr, master_weights=True)
    inputs = [(x.detach().clone().requires_grad_(True), t) for x, t in micro_batches]

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for i, (x, target) in enumerate(inputs):
            kwargs = {"is_first_microbatch": i == 0} if cache else {}
            loss = loss_fn(graphed(x, **kwargs), target) / len(inputs)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_STREAM_MISMATCH, category=UserWarning)
                loss.backward()
            total = total + loss.detach()
        optimizer.step()
        return total

    return step
