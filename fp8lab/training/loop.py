"""Many steps: :func:`train` runs :func:`~fp8lab.training.train_step` over a stream of batches
and returns the loss of each step; :func:`final_loss` is the number a run is judged by.

BF16 autocast on a GPU (FP32 on a CPU, where BF16 matmuls are slow and not what the chapters are
about), cross-entropy in FP32 (:func:`~fp8lab.training.lm_loss`), any optimizer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch

from fp8lab import checks
from fp8lab.training.state import StepOptions, check_model_and_optimizer, check_te_and_recipe
from fp8lab.training.step import train_step


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
    check_model_and_optimizer(model, optimizer)
    check_te_and_recipe(te, fp8_recipe)
    options = _checked_options(batches, on_step, micro_batches, bf16_autocast, options)
    losses = []
    group: list = []
    given = 0
    for index, batch in enumerate(batches):
        given = index + 1
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
        raise ValueError(_too_few(given, micro_batches))
    return np.array(losses)


def _checked_options(batches, on_step, micro_batches, bf16_autocast, options) -> StepOptions:
    """The rest of :func:`train`'s arguments, checked; returns the step options to run with."""
    if on_step is not None and not callable(on_step):
        raise TypeError(f"on_step must be callable, not {type(on_step).__name__}")
    if not isinstance(batches, Iterable):
        kind = type(batches).__name__
        raise TypeError(f"batches must be an iterable of (inputs, targets) pairs, not {kind}")
    checks.integer("micro_batches", micro_batches)
    if bf16_autocast is not None:
        checks.flag("bf16_autocast", bf16_autocast)
    if options is None:
        return StepOptions(bf16_autocast=bf16_autocast)
    if not isinstance(options, StepOptions):
        raise TypeError(f"options must be a training.StepOptions, not {type(options).__name__}")
    if bf16_autocast is not None:
        raise ValueError("give bf16_autocast in options= (StepOptions), not both")
    return options


def _too_few(given: int, micro_batches: int) -> str:
    """Why no step ran: no batch at all, or fewer than one step's micro-batches."""
    if given == 0:
        return "batches: no batch to train on (the iterable was empty)"
    return (
        f"micro_batches={micro_batches} needs at least {micro_batches} batches for one step; "
        f"batches held {given}"
    )


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
