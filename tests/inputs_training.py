"""Property-test entries for the gradient-accumulation step of :mod:`fp8lab.training` (chapter 06).

Imported by ``tests/test_inputs.py``, which feeds each entry valid values and junk and requires a
consistent result or a ``ValueError``/``TypeError`` naming the argument.
"""

from __future__ import annotations

import hypothesis.strategies as st
import torch

import fp8lab.reference as ref
from fp8lab import models, training
from tests.property_support import TINY, Entry, ints, maybe, reals


def _batches(count):
    generator = torch.Generator().manual_seed(count)
    return [(torch.randint(0, 64, (2, 8), generator=generator),) * 2 for _ in range(count)]


def _model(mode, fp8_weights=False):
    torch.manual_seed(0)
    init = ref.quantized_model_init(enabled=fp8_weights, recipe=ref.recipe.DelayedScaling())
    with init:
        return models.GPT(
            TINY,
            form="te_layer",
            te=ref,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            fuse_wgrad_accumulation=mode == "fused",
        )


def _optimizer(model):
    return ref.optimizers.FusedAdam(
        model.parameters(), lr=1e-3, master_weights=True, use_decoupled_grad=True
    )


def _options(cache, mode, bf16, max_norm, refresh=True):
    return training.StepOptions(
        cache_fp8_weights=cache,
        grad_accumulation=mode,
        bf16_autocast=bf16,
        max_grad_norm=max_norm,
        refresh_fp8_weights=refresh,
    )


def _train_step(micro_batches, cache, mode, max_norm, fp8):
    model = _model(mode if isinstance(mode, str) else "param", fp8_weights=fp8 is True)
    options = _options(cache, mode, False, max_norm)
    batches = _batches(micro_batches) if isinstance(micro_batches, int) else micro_batches
    return training.train_step(
        model,
        batches,
        _optimizer(model),
        te=ref,
        fp8_recipe=ref.recipe.DelayedScaling() if fp8 is True else None,
        options=options,
    )


def _time_step(warmup, iters, label):
    model = _model("param")
    return training.time_step(
        model, _batches(1), _optimizer(model), warmup=warmup, iters=iters, label=label
    ).median_ms


def _optimizer_gradients(mode, steps):
    model = _model(mode if mode in training.GRAD_ACCUMULATION else "param")
    for _ in range(steps):
        training.train_step(
            model, _batches(2), None, options=training.StepOptions(grad_accumulation=mode)
        )
    return sum(g.abs().sum().item() for g in training.optimizer_gradients(model, mode).values())


def _state_bytes(with_optimizer):
    model = _model("param")
    optimizer = _optimizer(model) if with_optimizer is True else with_optimizer
    return training.training_state_bytes(model, optimizer)


def _seed(with_source):
    model = _model("param", fp8_weights=True)
    source = _model("param") if with_source is True else with_source
    return training.seed_master_weights(_optimizer(model), model, source)


ENTRIES = {
    "training.GRAD_ACCUMULATION": Entry(lambda: len(training.GRAD_ACCUMULATION), {}, examples=1),
    "training.CACHE_WORKSPACES": Entry(lambda: len(training.CACHE_WORKSPACES), {}, examples=1),
    "training.StepOptions": Entry(
        lambda cache, mode, bf16, max_norm, refresh: (
            _options(cache, mode, bf16, max_norm, refresh).max_grad_norm
        ),
        {
            "refresh": maybe(st.booleans()),
            "cache": maybe(st.booleans()),
            "mode": maybe(st.sampled_from(training.GRAD_ACCUMULATION)),
            "bf16": maybe(st.sampled_from([None, True, False])),
            "max_norm": maybe(st.sampled_from([None, 1.0, 0.5])),
        },
        aliases={
            "cache": ["cache_fp8_weights"],
            "mode": ["grad_accumulation"],
            "bf16": ["bf16_autocast"],
            "max_norm": ["max_grad_norm"],
            "refresh": ["refresh_fp8_weights"],
        },
    ),
    "training.StepResult": Entry(
        lambda loss, n, step_ms, opt_ms: (
            training.StepResult(loss, n, step_ms, opt_ms).micro_batch_ms
        ),
        {
            "loss": maybe(reals(0, 10)),
            "n": maybe(ints(1, 8)),
            "step_ms": maybe(reals(1, 10)),
            "opt_ms": maybe(reals(0, 1)),
        },
        aliases={"n": ["micro_batches"], "step_ms": ["step_ms"], "opt_ms": ["optimizer_ms"]},
    ),
    "training.train_step": Entry(
        _train_step,
        {
            "micro_batches": maybe(ints(1, 3)),
            "cache": st.booleans(),
            "mode": maybe(st.sampled_from(training.GRAD_ACCUMULATION)),
            "max_norm": maybe(st.sampled_from([None, 1.0])),
            "fp8": st.booleans(),
        },
        aliases={
            "mode": ["grad_accumulation", "fuse_wgrad_accumulation"],
            "max_norm": ["max_grad_norm"],
        },
        examples=12,
    ),
    "training.time_step": Entry(
        _time_step,
        {
            "warmup": maybe(ints(0, 1)),
            "iters": maybe(ints(1, 2)),
            "label": maybe(st.just("step")),
        },
        examples=8,
    ),
    "training.optimizer_gradients": Entry(
        _optimizer_gradients,
        {"mode": maybe(st.sampled_from(training.GRAD_ACCUMULATION)), "steps": ints(0, 1)},
        aliases={"mode": ["grad_accumulation"], "steps": ["grad_accumulation"]},
        examples=10,
    ),
    "training.training_state_bytes": Entry(
        _state_bytes,
        {"with_optimizer": maybe(st.booleans())},
        aliases={"with_optimizer": ["optimizer"]},
        examples=6,
    ),
    "training.seed_master_weights": Entry(
        _seed,
        {"with_source": maybe(st.booleans())},
        aliases={"with_source": ["source"]},
        examples=6,
    ),
}
