"""The training loop the chapters share, and the seed-to-seed band every accuracy verdict stands on.

:func:`train` runs a language model over a list of ``(inputs, targets)`` batches: BF16
autocast on a GPU (FP32 on a CPU, where BF16 matmuls are slow and not what the chapter is
about), ``te.autocast`` with a recipe when one is given, cross-entropy in FP32
(:func:`lm_loss`), AdamW or any optimizer. It returns the loss of every step.

An FP8 run is judged against a **band**: the spread of the same BF16 run over several seeds
(:class:`SeedBand`). A gap to one BF16 run says nothing until it is compared with how much
BF16 differs from itself.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fp8lab import checks

__all__ = ["SeedBand", "final_loss", "lm_loss", "train"]


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


def train(
    model: torch.nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    *,
    te=None,
    fp8_recipe=None,
    bf16_autocast: bool | None = None,
    on_step: Callable[[torch.nn.Module, int], None] | None = None,
) -> np.ndarray:
    """Train ``model`` on ``batches``; return the loss of each step as a NumPy array.

    ``te`` and ``fp8_recipe`` (from :func:`fp8lab.import_te`) run the forward under
    ``te.autocast(recipe=fp8_recipe)``; without a recipe the TE modules run in high precision.
    ``bf16_autocast`` defaults to True on a GPU and False on a CPU. ``on_step(model, step)`` is
    called after each optimizer step (to log scales, say).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer, not {type(optimizer).__name__}"
        )
    if fp8_recipe is not None and te is None:
        raise ValueError("fp8_recipe needs te= (the module returned by fp8lab.import_te())")
    if on_step is not None and not callable(on_step):
        raise TypeError(f"on_step must be callable, not {type(on_step).__name__}")
    device = next(model.parameters()).device
    if bf16_autocast is None:
        bf16_autocast = device.type == "cuda"
    checks.flag("bf16_autocast", bf16_autocast)
    losses = []
    for step, batch in enumerate(batches):
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise TypeError(f"batches[{step}] must be an (inputs, targets) pair")
        inputs, targets = batch
        fp8 = (
            te.autocast(enabled=True, recipe=fp8_recipe)
            if fp8_recipe is not None
            else contextlib.nullcontext()
        )
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_autocast), fp8:
            logits = model(inputs)
        loss = lm_loss(logits, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(model, step)
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
