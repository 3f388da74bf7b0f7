"""Check the speedometer on a GPU: repeat-to-repeat spread and overhead against a bare event loop.

``python -m tools.speedometer_check`` times the forward+backward of a
``te.TransformerLayer`` (H=4096, F=16384, A=32, S=2048, B=4: a step of well over
5 ms) in BF16 and FP8, alternating the speedometer with a bare loop that
brackets the same number of the same steps with one pair of marks of the book's one clock
(:class:`fp8lab.speedometer.Clock`), against its per-call marks.

Round-to-round range: (max - min) / median of the speedometer's medians over the rounds (and
their coefficient of variation); not the speedometer's per-run spread (IQR / median).
Overhead: the speedometer's mean per iteration over the bare loop's, minus one,
median over rounds.
"""

from __future__ import annotations

import statistics
import sys
import time


def _make_step(te, layer, x, dy, kwargs):
    """One forward+backward of ``layer`` under ``te.autocast(**kwargs)``, gradients cleared."""
    params = [p for p in layer.parameters()]

    def step():
        with te.autocast(**kwargs):
            y = layer(x)
        y.backward(dy)
        for p in params:
            p.grad = None

    return step


def _bare_loop(step, iters: int) -> float:
    """Milliseconds per step of ``iters`` steps between two marks of the book's one clock."""
    import torch

    from fp8lab.speedometer import Clock

    begin = time.perf_counter()
    while time.perf_counter() - begin < 1.0:  # the same warm-up as the speedometer's
        step()
    torch.cuda.synchronize()
    clock = Clock("cuda")
    for _ in range(iters):
        step()
    clock.mark()
    return clock.read()[0] / iters


def _report(label: str, medians, means, bares) -> None:
    spread = (max(medians) - min(medians)) / statistics.median(medians)
    variation = statistics.stdev(medians) / statistics.mean(medians)
    overhead = statistics.median(m / b - 1 for m, b in zip(means, bares, strict=True))
    print(
        f"{label}: speedometer medians {[round(m, 3) for m in medians]} ms; bare loop "
        f"{[round(b, 3) for b in bares]} ms/iter; "
        f"round-to-round range (max-min)/median {spread:.2%}, "
        f"coefficient of variation {variation:.2%}; overhead {overhead:+.2%}"
    )


def main(rounds: int = 7, iters: int = 100, warm_seconds: float = 5.0) -> int:
    import torch

    from fp8lab import recipes
    from fp8lab.environment import import_te
    from fp8lab.speedometer import speedometer

    te, recipe = import_te()
    torch.manual_seed(0)
    layer = te.TransformerLayer(4096, 16384, 32, params_dtype=torch.bfloat16, fuse_qkv_params=True)
    x = torch.randn(2048, 4, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    for name in ("bf16", "delayed"):
        label, fp8_recipe = recipes.label(name), recipes.make(recipe, name)
        kwargs = {"enabled": fp8_recipe is not None, "recipe": fp8_recipe}
        step = _make_step(te, layer, x, dy, kwargs)
        begin = time.perf_counter()
        while (
            time.perf_counter() - begin < warm_seconds
        ):  # let clocks and power settle before any round
            step()
        torch.cuda.synchronize()
        medians, means, bares = [], [], []
        for _ in range(rounds):
            timing = speedometer(
                layer,
                x,
                mode="forward_backward",
                grad_output=dy,
                autocast_kwargs=kwargs,
                warmup=10,
                min_warmup_ms=1000,
                iters=iters,
                label=label,
            )
            medians.append(timing.median_ms)
            means.append(timing.mean_ms)
            bares.append(_bare_loop(step, iters))
        _report(label, medians, means, bares)
    return 0


if __name__ == "__main__":
    sys.exit(main())
