"""Measuring one configuration: build the model, run complete training steps, record the peaks.

Each configuration builds an ``fp8lab.models.GPT`` of ``te.TransformerLayer`` layers in its
parameter layout, runs :data:`STEPS` steps of :func:`fp8lab.training.train_step` and records
``torch.cuda.max_memory_allocated`` above what was allocated before the model was built, phase
by phase (hooks on the model and the optimizer mark the phases), beside
:func:`fp8lab.memory.estimate`'s prediction.
"""

from __future__ import annotations

import contextlib
import gc
import json
import time
from dataclasses import asdict

from fp8lab import memory, recipes
from tools.memory_check.matrices import RECIPES, Config

MiB = memory.MiB
STEPS = 2  # training steps per configuration: the second runs with the optimizer's states


class Meter:
    """Peaks of ``torch.cuda.max_memory_allocated`` above ``base``, phase by phase (a CPU run
    records NaN)."""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.type == "cuda"
        self.peaks: dict[str, float] = {}
        self.after: dict[str, float] = {}
        self.base = self.base_reserved = 0
        if self.cuda:
            torch.cuda.synchronize()
            self.base = torch.cuda.memory_allocated()
            self.base_reserved = torch.cuda.memory_reserved()
            torch.cuda.reset_peak_memory_stats()

    def mark(self, phase: str) -> None:
        """Close ``phase``: its peak is the largest allocation total since the last mark."""
        if not self.cuda:
            self.peaks[phase] = self.after[phase] = float("nan")
            return
        cuda = self.torch.cuda
        cuda.synchronize()
        self.peaks[phase] = max(self.peaks.get(phase, 0), cuda.max_memory_allocated() - self.base)
        self.after[phase] = cuda.memory_allocated() - self.base
        self.reserved = max(getattr(self, "reserved", 0), cuda.max_memory_reserved())
        cuda.reset_peak_memory_stats()


def build(config: Config, te, fp8, device):
    """The model and its optimizer, as the parameter layout says (``fp8``: the FP8 recipe)."""
    import torch

    from fp8lab.models import GPT

    weights = memory.WEIGHTS[config.weights]
    params_dtype = torch.float32 if weights.param_bytes == 4 else torch.bfloat16
    init = (
        te.quantized_model_init(enabled=True, recipe=fp8)
        if weights.fp8_params
        else contextlib.nullcontext()
    )
    with init:
        model = GPT(config.cfg, form="te_layer", te=te, params_dtype=params_dtype, device=device)
    if weights.optimizer == "te-fused":  # TE's, or the CPU reference's stand-in
        optimizer = te.optimizers.FusedAdam(
            model.parameters(),
            lr=1e-4,
            weight_decay=0.01,
            master_weights=True,
            master_weight_dtype=torch.float32,
        )
    else:  # torch picks its foreach implementation on CUDA
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    return model, optimizer


def fp8_recipe(config: Config, recipe_module):
    return recipes.make(recipe_module, RECIPES.get(config.precision, "bf16"))


def forward(model, tokens, recompute: str, te):
    """``model(tokens)``; with recompute, the same computation with each layer checkpointed
    (``"full"``: ``te.checkpoint`` around the layer; ``"selective"``: its core attention)."""
    if recompute == "none":
        return model(tokens)
    import torch

    from fp8lab.layers import rotary_angles

    cfg, s = model.cfg, tokens.shape[1]
    x = model.embed(tokens).transpose(0, 1)  # [B, S, H] -> [S, B, H]
    if model.pos is not None:
        x = x + model.pos(torch.arange(s, device=tokens.device))[:, None, :]
    rotary = (
        rotary_angles(s, cfg.head_dim, device=tokens.device)
        if cfg.position_embedding == "rope"
        else None
    )
    for layer in model.layers:
        if recompute == "full":
            x = te.checkpoint(layer.layer, x, rotary_pos_emb=rotary)
        elif tokens.device.type == "cpu":  # the CPU reference has no checkpoint_core_attention
            x = layer.layer(x, rotary_pos_emb=rotary)
        else:
            x = layer.layer(x, rotary_pos_emb=rotary, checkpoint_core_attention=True)
    return model.head(model.final_norm(x)).transpose(0, 1)  # [S, B, V] -> [B, S, V]


def steppable(model, recompute: str, te):
    """The model as ``train_step`` calls it: itself, or a wrapper whose forward recomputes."""
    if recompute == "none":
        return model
    import torch

    class Recomputed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gpt = model

        def forward(self, tokens):
            return forward(self.gpt, tokens, recompute, te)

    return Recomputed()


def measure(config: Config, te, recipe_module, device) -> dict:
    """Build, train ``STEPS`` steps with ``train_step``, and return the measured peaks (MiB)."""
    import torch

    from fp8lab.models import random_tokens
    from fp8lab.training import train_step

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    batches = [
        tuple(
            random_tokens(config.cfg, config.batch, config.seq, seed=2 * i + j, device=device)
            for j in (0, 1)
        )
        for i in range(config.accumulation)
    ]
    fp8 = fp8_recipe(config, recipe_module)  # one recipe object for the whole run
    meter = Meter(torch, device)
    begin = time.perf_counter()
    model, optimizer = build(config, te, fp8, device)
    meter.mark("build")
    after_build = meter.after["build"]
    model = steppable(model, config.recompute, te)
    step = {"index": 0}

    def marker(phase):
        return lambda *_, **__: meter.mark(f"step {step['index']} {phase}")

    hooks = [
        model.register_forward_pre_hook(marker("loss and backward")),  # the previous micro-batch's
        model.register_forward_hook(marker("model forward")),
        optimizer.register_step_pre_hook(marker("loss and backward")),
        optimizer.register_step_post_hook(marker("optimizer step")),
    ]
    try:
        for index in range(1, STEPS + 1):
            step["index"] = index
            train_step(model, batches, optimizer, te=te, fp8_recipe=fp8, measure_peak=False)
            meter.mark(f"step {index} optimizer step")  # until train_step returned
    finally:
        for hook in hooks:
            hook.remove()
    seconds = time.perf_counter() - begin
    peaks = {phase: value / MiB for phase, value in meter.peaks.items()}
    reserved = getattr(meter, "reserved", float("nan")) - meter.base_reserved
    return {
        "measured_MiB": max(peaks.values()),
        "measured_phase": max(peaks, key=peaks.get),
        "after_build_MiB": after_build / MiB,
        "reserved_MiB": reserved / MiB,
        **{f"{phase}_MiB": value for phase, value in peaks.items()},
        "seconds": seconds,
    }


def attempt(config: Config, te, recipe_module, device) -> dict:
    """:func:`measure`, with an out-of-memory or any other error turned into a result row."""
    import torch

    try:
        return {"status": "ok", **measure(config, te, recipe_module, device)}
    except torch.cuda.OutOfMemoryError as error:
        result = {"status": "oom", "error": str(error).splitlines()[0][:200]}
    except Exception as error:  # noqa: BLE001 -- a failed configuration is a row, not a crash
        result = {"status": "error", "error": f"{type(error).__name__}: {error}"[:300]}
    finally:
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


def row(config: Config, te, recipe_module, device) -> dict:
    """One CSV row: the configuration, the prediction and the measurement."""
    predicted = config.predict()
    if RECIPES.get(config.precision) == "block":
        available, reason = te.is_fp8_block_scaling_available(return_reason=True)
        if not available:
            return {**describe(config, predicted), "status": "unavailable", "error": reason}
    return {**describe(config, predicted), **attempt(config, te, recipe_module, device)}


def describe(config: Config, predicted: memory.MemoryEstimate) -> dict:
    from fp8lab.flops import parameter_count

    return {
        **asdict(config),
        "family": "gpt" if config.cfg.position_embedding == "learned" else "llama",
        "params_M": round(parameter_count(config.cfg) / 1e6, 1),
        "config": json.dumps(asdict(config.cfg)),  # the model, for readers of the CSV alone
        "predicted_MiB": round(predicted.peak_mib, 1),
        "predicted_event": predicted.peak_event,
        "predicted_phase": memory.measured_phase(predicted.peak_event),
        **{
            f"predicted {phase}_MiB": round(value / MiB, 1)
            for phase, value in memory.phase_peaks(predicted).items()
        },
    }

