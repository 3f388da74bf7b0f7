"""The language-model loss every chapter trains and evaluates with: next-token cross-entropy in
FP32.

Targets are checked before the loss is taken: an id outside ``[0, V)`` would index past the
logits (an ``IndexError`` on a CPU, a device-side assert that ends the process on a GPU), and a
batch whose targets are all the ignore index gives a NaN loss that trains nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fp8lab import checks

IGNORE_INDEX = -100  # F.cross_entropy's default: targets with this id count for nothing


def check_targets(targets: torch.Tensor, vocab_size: int) -> None:
    """Raise ``ValueError`` naming ``targets`` unless every id is in ``[0, vocab_size)`` or the
    ignore index, and at least one is not ignored. One host-device sync (skipped while
    ``torch.compile`` traces, as :class:`fp8lab.models.GPT` skips its token check)."""
    if targets.numel() == 0 or torch.compiler.is_compiling():
        return
    kept = targets != IGNORE_INDEX
    low, high = torch.aminmax(torch.where(kept, targets, 0))
    low, high, any_kept = torch.stack([low, high, kept.any().to(low.dtype)]).tolist()
    if not any_kept:
        raise ValueError(
            f"targets: every id is the ignore index {IGNORE_INDEX}: the loss would be NaN"
        )
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"targets hold ids in [{low}, {high}]: must be in [0, V={vocab_size}) "
            f"or the ignore index {IGNORE_INDEX}"
        )


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy in FP32: ``logits [B, S, V]`` against ``targets [B, S]``."""
    checks.tensor("logits", logits, dims=3, floating=True)
    checks.tensor("targets", targets, dims=2, floating=False)
    if logits.shape[:2] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)}: B and S must match"
        )
    check_targets(targets, logits.shape[-1])
    return F.cross_entropy(
        logits.float().flatten(0, 1), targets.flatten()
    )  # [B*S, V] against [B*S]
