"""Check the memory estimator against complete training steps measured on a GPU with TE.

Each configuration builds an ``fp8lab.models.GPT`` of ``te.TransformerLayer`` layers in one of
the parameter layouts of :data:`fp8lab.memory.WEIGHTS`, runs two complete training steps of the
book's :func:`fp8lab.training.train_step` (BF16 autocast and the FP8 recipe around each
forward, ``lm_loss``, backward, optimizer step; gradient accumulation when asked; recompute
through ``te.checkpoint``), and records ``torch.cuda.max_memory_allocated`` above what was
allocated before the model was built, phase by phase (hooks on the model and the optimizer
mark the phases), beside :func:`fp8lab.memory.estimate`'s prediction::

    python -m tools.memory_check --matrix tune --csv tests/gpu_results/memory_tune_h200.csv
    python -m tools.memory_check --matrix heldout --csv tests/gpu_results/memory_heldout_h200.csv
    python -m tools.memory_check --matrix fits --csv tests/gpu_results/memory_fits_h200.csv
    python -m tools.memory_check --matrix tune --dry-run      # toy sizes, any machine

``tune`` is the matrix the estimator's constants may be tuned on; ``heldout`` (other model
shapes, sequence lengths and micro-batches) never is. ``fits`` compares, for a few
configurations, the largest micro-batch :func:`fp8lab.memory.largest_micro_batch` predicts
with the largest that runs (tried, out-of-memory caught). Each CSV gets a sidecar
``.stamp.json`` (GPU, versions, the fp8lab code the measurements ran), checked by the CPU
lane. A failed configuration is a row with its error; an out-of-memory is a result.
Progress goes to stderr, the summary to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from fp8lab import memory
from fp8lab.config import TransformerConfig

MiB = memory.MiB
STEPS = 2  # training steps per configuration: the second runs with the optimizer's states
# fp8lab modules the measurements run (the stamp hashes them; fp8lab.memory only predicts, and
# the CPU lane re-predicts from the measured columns, so it is left out)
MEASURED_WITH = ("fp8lab.models", "fp8lab.training", "fp8lab.environment")
PHASES = ("build", "forward", "backward", "optimizer step")


def _gpt(name, h, f, a, layers, vocab) -> TransformerConfig:
    """GPT-style: GeLU, multi-head attention, learned positions, LayerNorm, biases, tied head."""
    return TransformerConfig(
        h, f, a, num_layers=layers, vocab_size=vocab, max_seq_len=4096, name=name
    )


def _llama(name, h, f, a, g, layers, vocab) -> TransformerConfig:
    """Llama-style: SwiGLU, grouped-query attention, RoPE, RMSNorm, no biases, untied head."""
    return TransformerConfig(
        h,
        f,
        a,
        num_gqa_groups=g,
        num_layers=layers,
        vocab_size=vocab,
        activation="swiglu",
        normalization="RMSNorm",
        bias=False,
        tied_embeddings=False,
        position_embedding="rope",
        max_seq_len=4096,
        name=name,
    )


MODELS = {
    # tune: the configurations constants may be fitted on
    "gpt-350m": _gpt("gpt-350m", 1024, 4096, 16, 24, 50304),
    "llama-530m": _llama("llama-530m", 1024, 2816, 16, 4, 24, 128256),
    # held out: other widths, depths, head dimensions and vocabularies
    "gpt-760m": _gpt("gpt-760m", 1536, 6144, 16, 24, 50304),
    "llama-850m": _llama("llama-850m", 2048, 5632, 16, 4, 16, 32000),
}


@dataclass(frozen=True)
class Config:
    """One measured configuration: a model, a micro-batch shape, a parameter layout, a compute
    precision, a recompute mode and the micro-batches per step."""

    model: str
    seq: int
    batch: int
    weights: str
    precision: str
    recompute: str = "none"
    accumulation: int = 1

    @property
    def cfg(self) -> TransformerConfig:
        return MODELS[self.model]

    def predict(self) -> memory.MemoryEstimate:
        return memory.estimate(
            self.cfg,
            self.batch,
            self.seq,
            precision=self.precision,
            weights=self.weights,
            recompute=self.recompute,
            accumulation=self.accumulation,
        )


# Every parameter layout with the compute precisions it is used with.
LAYOUTS = (
    ("bf16", "bf16"),
    ("bf16", "fp8-delayed"),
    ("fp32-autocast", "bf16"),
    ("fp32-autocast", "fp8-delayed"),
    ("fp32-autocast", "fp8-current"),
    ("bf16-master", "bf16"),
    ("bf16-master", "fp8-delayed"),
    ("bf16-master", "fp8-current"),
    ("bf16-master", "fp8-block"),
    ("fp8-master", "fp8-delayed"),
    ("fp8-master", "fp8-current"),
)


def _matrix(models, shapes, extras) -> list[Config]:
    """Every layout for each model, the (S, B) shapes taken in turn, plus ``extras``."""
    configs = []
    for model in models:
        for index, (weights, precision) in enumerate(LAYOUTS):
            seq, batch = shapes[index % len(shapes)]
            configs.append(Config(model, seq, batch, weights, precision))
    return configs + list(extras)


MATRICES = {
    "tune": _matrix(
        ("gpt-350m", "llama-530m"),
        shapes=((2048, 4), (1024, 8), (4096, 2), (2048, 2)),
        extras=(
            Config("gpt-350m", 2048, 4, "bf16-master", "bf16", "full"),
            Config("gpt-350m", 2048, 4, "bf16-master", "fp8-delayed", "selective"),
            Config("llama-530m", 2048, 4, "bf16", "fp8-delayed", "full"),
            Config("llama-530m", 2048, 2, "bf16-master", "bf16", "none", accumulation=2),
            Config("gpt-350m", 1024, 4, "fp32-autocast", "bf16", "none", accumulation=2),
        ),
    ),
    "heldout": _matrix(
        ("gpt-760m", "llama-850m"),
        shapes=((1024, 6), (2048, 3), (4096, 1), (2048, 2)),
        extras=(
            Config("gpt-760m", 2048, 3, "bf16-master", "fp8-delayed", "full"),
            Config("gpt-760m", 4096, 2, "fp32-autocast", "bf16", "full"),
            Config("llama-850m", 2048, 3, "bf16-master", "bf16", "full"),
            Config("llama-850m", 2048, 3, "fp8-master", "fp8-delayed", "selective"),
            Config("llama-850m", 1024, 3, "bf16", "bf16", "none", accumulation=3),
            Config("gpt-760m", 2048, 2, "bf16-master", "fp8-current", "none", accumulation=2),
        ),
    ),
}
# The "fits?" check: the largest micro-batch that runs, against the estimator's
FITS = (
    Config("llama-850m", 4096, 0, "bf16-master", "bf16"),
    Config("llama-850m", 4096, 0, "bf16-master", "fp8-delayed"),
    Config("llama-850m", 4096, 0, "fp8-master", "fp8-delayed"),
    Config("gpt-760m", 4096, 0, "bf16", "bf16"),
    Config("gpt-760m", 4096, 0, "fp32-autocast", "bf16", "full"),
)
FITS_EXTRA_TRIES = 4  # above the prediction, how many larger micro-batches to try at most
RECIPES = {
    "fp8-delayed": "DelayedScaling",
    "fp8-current": "Float8CurrentScaling",
    "fp8-block": "Float8BlockScaling",
}


def toy(config: Config) -> Config:
    """The configuration at a size that runs in seconds on a CPU (``--dry-run``)."""
    cfg = config.cfg
    small = cfg.replace(
        hidden_size=64,
        ffn_hidden_size=128 if cfg.activation == "gelu" else 96,
        num_attention_heads=4,
        num_gqa_groups=None if cfg.num_gqa_groups is None else 2,
        num_layers=2,
        vocab_size=256,
        max_seq_len=128,
        name=cfg.name + "-toy",
    )
    MODELS[small.name] = small
    return replace(config, model=small.name, seq=min(config.seq, 64), batch=min(config.batch, 2))


# --- measuring -----------------------------------------------------------------------------------


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
    name = RECIPES.get(config.precision)
    return None if name is None else getattr(recipe_module, name)()


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
    if RECIPES.get(config.precision) == "Float8BlockScaling":
        available, reason = te.is_fp8_block_scaling_available(return_reason=True)
        if not available:
            return {**_describe(config, predicted), "status": "unavailable", "error": reason}
    return {**_describe(config, predicted), **attempt(config, te, recipe_module, device)}


def _describe(config: Config, predicted: memory.MemoryEstimate) -> dict:
    from fp8lab.flops import parameter_count

    return {
        **asdict(config),
        "family": "gpt" if config.cfg.position_embedding == "learned" else "llama",
        "params_M": round(parameter_count(config.cfg) / 1e6, 1),
        "config": json.dumps(asdict(config.cfg)),  # the model, for readers of the CSV alone
        "predicted_MiB": round(predicted.peak_mib, 1),
        "predicted_event": predicted.peak_event,
        **{f"predicted {phase}_MiB": round(v / MiB, 1) for phase, v in predicted.phases.items()},
    }


def summarise(frame) -> dict:
    """Median and worst absolute error, and the worst under- and over-prediction."""
    error = frame["predicted_MiB"] / frame["measured_MiB"] - 1
    return {
        "configs": int(error.notna().sum()),
        "median_abs_error": float(error.abs().median()),
        "worst_abs_error": float(error.abs().max()),
        "worst_under_prediction": float(min(0.0, error.min())),
        "worst_over_prediction": float(max(0.0, error.max())),
    }


def by_layout(frame):
    """:func:`summarise` for each parameter layout."""
    import pandas as pd

    return pd.DataFrame(
        {weights: summarise(group) for weights, group in frame.groupby("weights")}
    ).T


# --- the "fits?" check ---------------------------------------------------------------------------


def capacity_bytes() -> float:
    """What this process can still allocate: free device memory plus the allocator's idle cache."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    return free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()


def fits_row(config: Config, te, recipe_module, device) -> dict:
    """Predicted against actual largest micro-batch (two steps each, out-of-memory caught).

    On a CPU (``--dry-run``) there is no memory to run out of: the capacity is made up, so that
    the search itself is exercised."""
    if device.type == "cuda":
        capacity = capacity_bytes()
    else:
        capacity = 1.01 * replace(config, batch=2).predict().peak_bytes
    predicted = memory.largest_micro_batch(
        config.cfg,
        config.seq,
        memory_bytes=capacity,
        headroom=1.0,
        context_bytes=0,
        max_batch=512,
        precision=config.precision,
        weights=config.weights,
        recompute=config.recompute,
    )
    tried: dict[int, dict] = {}

    def runs(batch: int) -> bool:
        if batch not in tried:
            print(f"  fits: trying B={batch}", file=sys.stderr, flush=True)
            tried[batch] = attempt(replace(config, batch=batch), te, recipe_module, device)
        return tried[batch]["status"] == "ok"

    if predicted >= 1 and runs(predicted):
        actual = predicted
        while actual < predicted + FITS_EXTRA_TRIES and runs(actual + 1):
            actual += 1
    else:
        actual = predicted - 1
        while actual >= 1 and not runs(actual):
            actual -= 1
    errors = {b: r.get("error", "") for b, r in tried.items() if r["status"] == "error"}
    largest = tried.get(actual, {})
    return {
        **{k: v for k, v in asdict(config).items() if k != "batch"},
        "capacity_GiB": round(capacity / 2**30, 2),
        "predicted_batch": predicted,
        "actual_batch": actual,
        "within_one": abs(predicted - actual) <= 1,
        "capped": actual == predicted + FITS_EXTRA_TRIES,
        "tried": " ".join(f"{b}:{r['status']}" for b, r in sorted(tried.items())),
        "measured_MiB_at_actual": largest.get("measured_MiB", float("nan")),
        "reserved_MiB_at_actual": largest.get("reserved_MiB", float("nan")),
        "predicted_MiB_at_actual": (
            replace(config, batch=actual).predict().peak_mib if actual >= 1 else float("nan")
        ),
        "error": "; ".join(f"B={b}: {e}" for b, e in errors.items()),
    }


# --- running and stamping ------------------------------------------------------------------------


def warm_up(configs, te, recipe_module, device) -> None:
    """Create the one-off buffers (cuBLAS workspaces, FP8 and attention kernels, compiled TE
    functions) before any measurement, with a toy version of every layout and recompute mode."""
    seen = set()
    for config in configs:
        key = (config.cfg.position_embedding, config.weights, config.precision, config.recompute)
        if key in seen:
            continue
        seen.add(key)
        small = toy(replace(config, batch=max(1, config.batch), accumulation=1))
        result = attempt(small, te, recipe_module, device)
        if result["status"] != "ok":
            print(f"warm-up {key}: {result.get('error')}", file=sys.stderr, flush=True)


def stamp(csv: Path, matrix: str, seconds: float, machine: dict | None = None) -> Path:
    """Write ``<csv>.stamp.json``: where and from which fp8lab code the measurements came
    (``machine``: :func:`fp8lab.stamp.where_it_runs` by default)."""
    from fp8lab import stamp as lane

    notebook = {
        "cells": [{"cell_type": "code", "source": "\n".join(f"import {m}" for m in MEASURED_WITH)}]
    }
    # fp8lab.memory is the estimator under test: the measured peaks do not depend on it (the tests
    # recompute its predictions from the committed measurements), so it is not part of the stamp
    record = lane.stamp_record(
        lane.library_modules(notebook, exclude=("fp8lab.memory",)),
        machine,
        matrix=matrix,
        command=f"python -m tools.memory_check --matrix {matrix} --csv {csv.as_posix()}",
        seconds=round(seconds, 1),
        csv_sha256=hashlib.sha256(csv.read_bytes()).hexdigest(),
    )
    path = stamp_path(csv)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def stamp_path(csv: Path) -> Path:
    return csv.with_name(csv.name + ".stamp.json")


def run(matrix: str, csv: Path | None, dry_run: bool = False, limit: int | None = None):
    """Measure ``matrix`` (``limit``: its first configurations only); return the table."""
    import pandas as pd

    from fp8lab.environment import import_te

    te, recipe_module = import_te()  # TE before anything loads cuDNN
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not dry_run:
        raise SystemExit("no CUDA GPU here: measure on a GPU box, or pass --dry-run")
    for name in ("recompile_limit", "cache_size_limit"):  # TE's compiled element-wise functions
        if hasattr(torch._dynamo.config, name):  # see many shapes; keep them compiled
            setattr(torch._dynamo.config, name, 64)
    configs = list(FITS if matrix == "fits" else MATRICES[matrix])
    if limit is not None:
        configs = configs[:limit]
    if dry_run:
        configs = [toy(replace(c, batch=max(c.batch, 1))) for c in configs]
    begin = time.perf_counter()
    warm_up(configs, te, recipe_module, device)
    print(f"warm-up: {time.perf_counter() - begin:.0f} s", file=sys.stderr, flush=True)
    rows = []
    for index, config in enumerate(configs, start=1):
        started = time.perf_counter()
        if matrix == "fits":
            result = fits_row(config, te, recipe_module, device)
            note = f"predicted B={result['predicted_batch']}, actual {result['actual_batch']}"
        else:
            result = row(config, te, recipe_module, device)
            note = f"{result['status']} {result.get('measured_MiB', float('nan')):,.0f} MiB"
        rows.append(result)
        print(
            f"[{index}/{len(configs)}] {config.model} S={config.seq} B={config.batch} "
            f"{config.weights}/{config.precision}/{config.recompute}: {note} "
            f"({time.perf_counter() - started:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
    frame = pd.DataFrame(rows)
    seconds = time.perf_counter() - begin
    if csv is not None:
        csv.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(csv, index=False, float_format="%.1f")
        if device.type == "cuda" and not dry_run:
            print(f"stamp: {stamp(csv, matrix, seconds)}", file=sys.stderr)
    print(f"total: {seconds:.0f} s", file=sys.stderr)
    return frame


def main(argv=None) -> int:
    import pandas as pd

    parser = argparse.ArgumentParser(
        prog="python -m tools.memory_check", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--matrix", choices=(*MATRICES, "fits"), default="heldout")
    parser.add_argument("--csv", type=Path, help="write the table here (and a .stamp.json)")
    parser.add_argument("--dry-run", action="store_true", help="toy sizes, CPU reference on CPU")
    parser.add_argument("--limit", type=int, help="only the first N configurations")
    args = parser.parse_args(argv)
    if args.matrix == "fits":  # the allocator's fragmentation would blur a one-micro-batch check
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    frame = run(args.matrix, args.csv, args.dry_run, args.limit)
    pd.set_option("display.width", 220)
    pd.set_option("display.max_columns", 30)
    if args.matrix == "fits":
        print(frame.to_string(index=False))
        return 0
    if "measured_MiB" not in frame:
        print(frame.to_string(index=False))
        return 1
    frame["error_pct"] = 100 * (frame["predicted_MiB"] / frame["measured_MiB"] - 1)
    shown = [
        "model",
        "seq",
        "batch",
        "weights",
        "precision",
        "recompute",
        "accumulation",
        "status",
        "predicted_MiB",
        "measured_MiB",
        "error_pct",
        "measured_phase",
    ]
    print(frame[[c for c in shown if c in frame]].to_string(index=False))
    if "measured_MiB" in frame and frame["measured_MiB"].notna().any():
        print(json.dumps(summarise(frame), indent=1))
        print(by_layout(frame).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
