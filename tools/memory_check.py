"""Check the memory estimator against ``torch.cuda.max_memory_allocated`` on a GPU with TE.

``python -m tools.memory_check --matrix validation --csv out.csv`` builds a stack of
``te.TransformerLayer`` (through :func:`fp8lab.layers.build_layer`) for each configuration of a
named matrix (two shapes -- GPT-style
GeLU/MHA and Llama-style SwiGLU/GQA --, two sequence lengths, two micro-batches, BF16 vs
TE FP8 vs TE FP8 with ``quantized_model_init``, recompute none vs full), runs one warm-up
and one measured forward+backward, and prints predicted against measured peaks. The
``calibration`` matrix is the one the estimator's transient terms were checked against;
``validation`` holds out other shapes and sizes.

Measured is the rise of ``max_memory_allocated`` above what was allocated before the
model was built (a warm-up has already created TE's cuBLAS workspace), which is what
:func:`fp8lab.memory.estimate` predicts as ``peak_bytes`` with ``include_optimizer=False``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import sys
from dataclasses import dataclass

from fp8lab.config import TransformerConfig
from fp8lab.memory import MiB, estimate

PRECISIONS = ("bf16", "fp8-delayed", "fp8-weights")
RECOMPUTES = ("none", "full")


@dataclass(frozen=True)
class Matrix:
    """A named set of configurations: shapes x sequence lengths x micro-batches x precisions x
    recompute."""

    shapes: dict
    seqs: tuple
    batches: tuple


MATRICES = {
    # the configurations the estimator's backward transients were checked against while it was
    # written
    "calibration": Matrix(
        {
            "gpt-gelu-mha": TransformerConfig(2048, 8192, 16, num_layers=4, name="gpt-gelu-mha"),
            "llama-swiglu-gqa": TransformerConfig(
                2048,
                5632,
                16,
                num_gqa_groups=4,
                num_layers=4,
                activation="swiglu",
                normalization="RMSNorm",
                bias=False,
                name="llama-swiglu-gqa",
            ),
        },
        seqs=(1024, 4096),
        batches=(1, 4),
    ),
    # held out: other shapes, sequence lengths and micro-batches
    "validation": Matrix(
        {
            "gpt-gelu-mha-2560": TransformerConfig(
                2560, 10240, 20, num_layers=3, name="gpt-gelu-mha-2560"
            ),
            "llama-swiglu-gqa-3072": TransformerConfig(
                3072,
                8192,
                24,
                num_gqa_groups=8,
                num_layers=3,
                activation="swiglu",
                normalization="RMSNorm",
                bias=False,
                name="llama-swiglu-gqa-3072",
            ),
        },
        seqs=(2048, 8192),
        batches=(1, 2),
    ),
}
SHAPES = {**MATRICES["calibration"].shapes, **MATRICES["validation"].shapes}


@dataclass
class Measured:
    after_init: int
    after_forward: int
    forward_peak: int
    peak: int


def build_stack(te, recipe_module, cfg: TransformerConfig, precision: str):
    import torch

    from fp8lab.layers import build_layer

    def make():
        return torch.nn.ModuleList(
            build_layer("te_layer", cfg, te, params_dtype=torch.bfloat16, device="cuda")
            for _ in range(cfg.num_layers)
        )

    if precision == "fp8-weights":
        with te.quantized_model_init(enabled=True, recipe=recipe_module.DelayedScaling()):
            return make()
    return make()


def measure(
    cfg: TransformerConfig, seq: int, batch: int, precision: str, recompute: str
) -> Measured:
    import torch

    from fp8lab.environment import import_te

    te, recipe_module = import_te()
    # TE's fused element-wise kernels are compiled: a fresh cache per config, as in a real run
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    layers = build_stack(te, recipe_module, cfg, precision)
    after_init = torch.cuda.memory_allocated() - base
    fp8 = precision != "bf16"
    recipe = recipe_module.DelayedScaling() if fp8 else None
    x = torch.randn(
        seq, batch, cfg.hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True
    )
    dy = torch.randn_like(x)

    def forward():
        h = x
        with te.autocast(enabled=fp8, recipe=recipe):
            for layer in layers:
                h = te.checkpoint(layer.layer, h) if recompute == "full" else layer(h)
        return h

    for phase in ("warm-up", "measured"):
        for p in layers.parameters():
            p.grad = None
        x.grad = None
        torch.cuda.synchronize()
        if phase == "measured":
            torch.cuda.reset_peak_memory_stats()
        y = forward()
        torch.cuda.synchronize()
        after_forward = torch.cuda.memory_allocated() - base
        forward_peak = torch.cuda.max_memory_allocated() - base
        y.backward(dy)
        torch.cuda.synchronize()
        del y
    result = Measured(
        after_init, after_forward, forward_peak, torch.cuda.max_memory_allocated() - base
    )
    return result


def rows(matrix: Matrix, precisions=PRECISIONS, recomputes=RECOMPUTES):
    for (name, cfg), seq, batch, precision, recompute in itertools.product(
        matrix.shapes.items(), matrix.seqs, matrix.batches, precisions, recomputes
    ):
        predicted = estimate(
            cfg, batch, seq, precision=precision, recompute=recompute, include_optimizer=False
        )
        measured = measure(cfg, seq, batch, precision, recompute)
        yield {
            "shape": name,
            "seq": seq,
            "batch": batch,
            "precision": precision,
            "recompute": recompute,
            "predicted_MiB": round(predicted.peak_mib, 1),
            "measured_MiB": round(measured.peak / MiB, 1),
            "after_init_MiB": round(measured.after_init / MiB, 1),
            "after_forward_MiB": round(measured.after_forward / MiB, 1),
            "forward_peak_MiB": round(measured.forward_peak / MiB, 1),
        }


def summarise(frame) -> dict:
    error = frame["predicted_MiB"] / frame["measured_MiB"] - 1
    return {
        "configs": len(frame),
        "median_abs_error": error.abs().median(),
        "worst_abs_error": error.abs().max(),
        "worst_under_prediction": min(0.0, error.min()),
        "worst_over_prediction": max(0.0, error.max()),
    }


def warm_up() -> None:
    """Create TE's one-off buffers (cuBLAS workspace, FP8 kernels) before any measurement."""
    tiny = TransformerConfig(256, 1024, 4, num_layers=1)
    measure(tiny, 128, 2, "fp8-delayed", "none")
    measure(tiny, 128, 2, "bf16", "full")


def main(argv=None) -> int:
    import pandas as pd

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", help="write the table here")
    parser.add_argument("--matrix", choices=sorted(MATRICES), default="validation")
    args = parser.parse_args(argv)
    warm_up()
    frame = pd.DataFrame(rows(MATRICES[args.matrix]))
    frame["error"] = (frame["predicted_MiB"] / frame["measured_MiB"] - 1).round(4)
    pd.set_option("display.width", 200)
    print(frame.to_string(index=False))
    print(summarise(frame))
    if args.csv:
        frame.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
