"""FP8 attention's softmax scale under delayed scaling: error per call and per row against FP32,
determinism, and what the recorded amax of the softmax output does to the next call.

With ``DelayedScaling(fp8_dpa=True)`` TE keeps one scale per attention tensor in the module's
``fp8_meta``; the softmax output S has the slot ``META_S``
(``transformer_engine.pytorch.cpp_extensions.fused_attn``). cuDNN's FP8 graph records the amax
of the softmax output there and multiplies S by ``scale_S`` before the second GEMM. TE updates
the delayed-scaling scales when a ``te.autocast`` region is left with grad enabled
(``autocast_exit``), to ``448 / amax`` for E4M3. :func:`probe_softmax_scale` runs the same
inputs through one module in stages (fresh; after one grad-enabled update; with ``scale_S``
forced back) and reports each stage's error, so the effect of that one scale is isolated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fp8lab import checks
from fp8lab.attention import backends
from fp8lab.attention.functional import AttentionShape, explicit_attention
from fp8lab.devices import resolve_device

__all__ = ["probe_softmax_scale", "row_errors"]

E4M3_MAX = 448.0


def row_errors(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """``||actual_i - expected_i|| / ||expected_i||`` for every query row ``i`` of ``[B, S, F]``
    outputs (F = A x D), in FP32; returns ``[B, S]``."""
    checks.tensor("actual", actual)
    checks.tensor("expected", expected)
    if actual.shape != expected.shape or actual.dim() != 3:
        raise ValueError(
            f"actual {tuple(actual.shape)} and expected {tuple(expected.shape)}: "
            "must be the same [B, S, F] shape"
        )
    difference = (actual.float() - expected.float()).norm(dim=-1)
    return difference / expected.float().norm(dim=-1).clamp_min(1e-30)


def _meta_s():
    from transformer_engine.pytorch.cpp_extensions.fused_attn import META_S

    return META_S


class _Probe:
    """One module, fixed inputs and their FP32 reference; each :meth:`stage` returns a row."""

    def __init__(self, te, make_recipe, shape: AttentionShape, device):
        self.te, self.shape = te, shape
        self.recipe = make_recipe()
        with backends.backend_context("te_fused"):
            self.module = backends._te_attention(te, shape)
        q, k, v = (t.detach() for t in shape.make_inputs(device=device, seed=1))
        self.inputs = (q, k, v)
        fp32 = [t.float() for t in self.inputs]
        self.exact = explicit_attention(*fp32, mask=shape.mask, window_size=shape.window_size)
        self.exact = self.exact.flatten(2)

    def call(self, grad: bool) -> torch.Tensor:
        with (
            backends.backend_context("te_fused"),
            torch.set_grad_enabled(grad),
            self.te.autocast(recipe=self.recipe),
        ):
            out = self.module(*self.inputs)
        return out.detach()

    @property
    def scaling(self):
        return self.module.fp8_meta["scaling_fwd"]

    def stage(self, name: str) -> dict[str, Any]:
        first, second = self.call(False), self.call(False)  # no grad: the scales stay put
        errors = row_errors(first, self.exact)
        slot = _meta_s()
        return {
            "stage": name,
            "scale_S": float(self.scaling.scale[slot]),
            "amax_S recorded": float(self.scaling.amax_history[0, slot]),
            "error vs FP32": float((first.float() - self.exact).norm() / self.exact.norm()),
            "row error, median": float(errors.median()),
            "row error, max": float(errors.max()),
            "norm / FP32 norm": float(first.float().norm() / self.exact.norm()),
            "two calls equal": bool(torch.equal(first, second)),
        }


def probe_softmax_scale(
    te,
    make_recipe: Callable[[], Any],
    shape: AttentionShape,
    *,
    device=None,
    forced_scale: float = E4M3_MAX,
) -> list[dict[str, Any]]:
    """Three stages of FP8 attention on the same inputs, each a dict row (for a pandas table):

    1. ``fresh``: a new module (every scale 1), two no-grad calls;
    2. ``after one update``: one grad-enabled call, whose autocast exit updates the
       delayed-scaling scales from the recorded amaxes, then two no-grad calls;
    3. ``scale_S forced``: ``scale_S`` set to ``forced_scale`` (E4M3's largest value: the right
       scale for numbers up to 1), then two no-grad calls.

    Each row has the error against FP32 attention (whole output, and the median and worst query
    row), the output's norm over FP32's, ``scale_S`` and the amax recorded for S, and whether
    the two identical calls gave identical outputs (``torch.equal``). Needs TE on a GPU
    (``fp8_dpa``); ``make_recipe`` returns a fresh recipe (``lambda:
    recipe.DelayedScaling(fp8_dpa=True)``).
    """
    backends._check_te(te)
    if not callable(make_recipe):
        raise TypeError("make_recipe must be a zero-argument factory of a recipe")
    if not isinstance(shape, AttentionShape):
        raise TypeError(f"shape must be an AttentionShape, not {type(shape).__name__}")
    if shape.dropout:
        raise ValueError(f"shape.dropout={shape.dropout}: the probe needs dropout 0")
    forced_scale = checks.number("forced_scale", forced_scale, positive=True)
    if not backends._uses_real_te():
        raise NotImplementedError(f"{backends._TE_MISSING}: fp8_dpa needs TE on a GPU")
    probe = _Probe(te, make_recipe, shape, resolve_device(device, default=True))
    rows = [probe.stage("fresh")]
    probe.call(True)
    rows.append(probe.stage("after one update"))
    probe.scaling.scale[_meta_s()] = forced_scale
    rows.append(probe.stage(f"scale_S forced to {forced_scale:g}"))
    return rows
