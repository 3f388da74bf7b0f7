"""A task that needs attention, and the paired comparison of two settings over seeds.

:func:`copy_batches`: each sequence is ``H`` random tokens followed by the same ``H`` tokens
again. Only the second half is scored (the first half's targets carry the ignore index): token
``i`` of the copy is token ``i`` of the first half, so a model can predict it only by attending
``H`` positions back. A model without attention stays at ``ln V`` nats, a model that copies
goes to 0; the chapter-01 Markov chain, by contrast, is solved from the current token alone.

:func:`paired_interval`: the differences of two settings run with the same seeds (same initial
weights, same batches), their mean and its interval, judged by the book's protocol against a
margin declared before the runs.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fp8lab import checks, protocol
from fp8lab.devices import resolve_device
from fp8lab.training.loss import IGNORE_INDEX

__all__ = ["copy_batches", "paired_interval"]


def copy_batches(
    vocab_size: int, batch: int, half: int, steps: int, *, seed: int = 0, device=None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` pairs of ``(inputs [B, 2H], targets [B, 2H])``: random tokens repeated once,
    targets the next token, with the first ``H - 1`` targets (unpredictable) ignored."""
    checks.integer("vocab_size", vocab_size, minimum=2)
    checks.integer("batch", batch)
    checks.integer("half", half, minimum=2)
    checks.integer("steps", steps)
    checks.integer("seed", seed, minimum=0)
    device = resolve_device(device)
    generator = torch.Generator().manual_seed(seed)
    first = torch.randint(vocab_size, (steps, batch, half), generator=generator)
    tokens = torch.cat([first, first, first[..., :1]], dim=-1)  # [steps, B, 2H + 1]
    inputs, targets = tokens[..., :-1], tokens[..., 1:].clone()
    targets[..., : half - 1] = IGNORE_INDEX
    return [(x.to(device), y.to(device)) for x, y in zip(inputs, targets, strict=True)]


def paired_interval(
    first: Mapping[int, float],
    second: Mapping[int, float],
    *,
    margin: float,
    confidence: float = 0.95,
) -> dict[str, float | str]:
    """Per-seed differences ``first[s] - second[s]`` over the seeds both have, judged by the
    protocol (:func:`fp8lab.protocol.paired_summary`): ``{"seeds", "mean", "low", "high",
    "verdict"}``, the verdict against ``margin`` (> 0, declared before the runs) given from
    five seeds on ("not resolved" below)."""
    if not isinstance(first, Mapping) or not isinstance(second, Mapping):
        raise TypeError("first and second must map seeds to final losses")
    if not set(first) & set(second):
        raise ValueError("first and second share no seed")
    return protocol.paired_summary(
        first, second, margin=margin, names=("first", "second"), confidence=confidence
    )
