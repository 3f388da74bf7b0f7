"""The training loop the chapters share, and the seed-to-seed band every accuracy verdict stands
on.

* :mod:`~fp8lab.training.step` -- :func:`train_step`, one optimizer step over N micro-batches:
  forward under autocast, loss, backward, clipping, optimizer step, gradients released, timed
  on the book's one clock with its peak memory; :func:`time_step`, the step repeated;
* :mod:`~fp8lab.training.accumulation` -- where the gradients of the micro-batches add up
  (``.grad``, an FP32 ``main_grad``, or TE's fused weight-gradient accumulation) and how the
  optimizer gets them; :func:`optimizer_gradients` reads them back;
* :mod:`~fp8lab.training.loss` -- :func:`lm_loss`, next-token cross-entropy in FP32;
* :mod:`~fp8lab.training.loop` -- :func:`train` over many steps, :func:`final_loss`;
* :mod:`~fp8lab.training.state` -- :class:`StepOptions`, :class:`StepResult`,
  :func:`training_state_bytes`, :func:`seed_master_weights`;
* :mod:`~fp8lab.training.band` -- :class:`SeedBand`, the spread of BF16 over seeds.

(Introduced in chapter 03; the step with accumulation in chapter 06.)
"""

from __future__ import annotations

from fp8lab.parts import CACHE_WORKSPACES
from fp8lab.training.accumulation import optimizer_gradients
from fp8lab.training.band import SeedBand
from fp8lab.training.loop import final_loss, train
from fp8lab.training.loss import lm_loss
from fp8lab.training.state import (
    GRAD_ACCUMULATION,
    StepOptions,
    StepResult,
    seed_master_weights,
    training_state_bytes,
)
from fp8lab.training.step import time_step, train_step

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
