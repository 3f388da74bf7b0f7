"""A task that needs attention.

:func:`copy_batches`: each sequence is ``H`` random tokens followed by the same ``H`` tokens
again. Only the second half is scored (the first half's targets carry the ignore index): token
``i`` of the copy is token ``i`` of the first half, so a model can predict it only by attending
``H`` positions back. A model without attention stays at ``ln V`` nats, a model that copies
goes to 0; the chapter-01 Markov chain, by contrast, is solved from the current token alone.
"""

from __future__ import annotations

import torch

from fp8lab import checks
from fp8lab.devices import resolve_device
from fp8lab.training.loss import IGNORE_INDEX

__all__ = ["copy_batches"]


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

