"""Reproduce: after FusedAdam(master_weights=True) updates a delayed-scaling FP8 weight, the
weight's cached transpose is neither rebuilt nor marked invalid, and the next backward computes
the input gradient from it (Transformer Engine 2.20.2, Hopper; torch and TE imported only).

    python tools/fp8_weight_transpose_repro.py            # te.Linear 256 x 256, lr 1e-2
    python tools/fp8_weight_transpose_repro.py --width 1024 --lr 1e-4

Report (as it would be filed upstream)
--------------------------------------
**Setup.** A ``te.Linear`` built under ``te.quantized_model_init(recipe=DelayedScaling())``
holds a ``Float8Tensor`` weight. On sm_90, where FP8 GEMMs take only the TN layout, the tensor
keeps its FP8 bytes twice: ``_data`` (row-wise) and ``_transpose`` (column-wise), both decoded
with the one ``_scale_inv``. The backward's data-gradient GEMM (dX = dY W) reads
``_transpose``.

**What the optimizer does.** ``optimizers/fused_adam.py`` (TE 2.20.2), ``step``: lines
~684-697 put every delayed-scaling ``Float8Tensor`` (its quantizer a ``Float8Quantizer``) on
the FP8 kernel's lists -- ``_data``, and the ``scale``, ``amax`` and ``scale_inv`` of its
quantizer; lines ~866-877 call ``multi_tensor_adam_fp8`` on those lists. The kernel writes the
new FP8 bytes into ``_data`` with the quantizer's current ``scale`` and writes the matching
``scale_inv``. Nothing touches ``_transpose`` or ``_transpose_invalid``.

**What the next backward reads.** ``Float8Tensor.update_usage`` keeps a transpose that is
flagged valid, so the backward reads the old transpose bytes -- decoded with the *new*
``_scale_inv``. Two errors stack: the weight of the step before (small at a small learning
rate) and, where the step changed the scale, every value multiplied by
``scale_inv_after / scale_inv_before`` (not small: a delayed-scaling weight is cast with a
scale of 1.0 at initialisation, and its first update can move the scale by orders of
magnitude).

**Expected.** After the step, ``_transpose`` equals ``_data.T`` (or is flagged invalid), and the
input gradient does not change when the transpose is rebuilt.

**Observed.** Printed by this script: whether the transpose equals ``_data.T`` before and after
the step; ``_scale_inv`` before and after; ``||dX stale|| / ||dX fresh||``; the relative change
of dX when the transpose is rebuilt (``_reset_caches()``, a private method that sets
``_transpose_invalid``); and the two explanations measured apart: the stale bytes decoded with
the old scale give the weight before the step (bytes untouched), and the ratio of the scales
predicts ``||dX stale|| / ||dX fresh||`` when the weight itself barely moved.

**Workaround.** Call ``param._reset_caches()`` on every ``Float8Tensor`` parameter after
``optimizer.step()`` (private API), or cast master weights with
``transformer_engine.pytorch.tensor.utils.cast_master_weights_to_fp8``, which rebuilds the
transposes. **Suggested fix.** Have ``FusedAdam.step`` mark the transposes of the FP8 weights it
wrote invalid (``_reset_caches()``) after ``multi_tensor_adam_fp8``, or rebuild them there.
"""

from __future__ import annotations

import argparse


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args(argv)
    if min(args.width, args.tokens) < 1 or args.lr <= 0:
        parser.error("--width and --tokens must be positive, --lr above 0")
    return args


def decode(fp8_bytes, scale_inv):
    """E4M3 bytes (``torch.uint8``) as FP32 values at ``scale_inv``."""
    import torch

    return fp8_bytes.view(torch.float8_e4m3fn).float() * scale_inv


def main(argv=None) -> dict:
    """Run the reproduction; print and return what it measured."""
    import torch
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import DelayedScaling

    args = parse(argv)
    torch.manual_seed(0)
    recipe = DelayedScaling()
    with te.quantized_model_init(enabled=True, recipe=recipe):
        layer = te.Linear(args.width, args.width, bias=False, params_dtype=torch.bfloat16,
                          device="cuda")
    optimizer = te.optimizers.FusedAdam(layer.parameters(), lr=args.lr, master_weights=True)
    x = torch.randn(args.tokens, args.width, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)

    def input_grad():
        x.grad = None
        with te.autocast(enabled=True, recipe=recipe):
            out = layer(x)
        out.float().square().mean().backward()
        return x.grad.float().clone()

    weight = layer.weight
    input_grad()  # one step's gradients (and the autocast exit's scale update)
    before = {"scale_inv": float(weight._scale_inv), "data": weight._data.clone(),
              "transpose": weight._transpose.clone(),
              "in sync": bool(torch.equal(weight._transpose, weight._data.t()))}
    optimizer.step()
    scale_inv = float(weight._scale_inv)
    in_sync = bool(torch.equal(weight._transpose, weight._data.t()))
    untouched = bool(torch.equal(weight._transpose, before["transpose"]))
    stale = input_grad()
    weight._reset_caches()  # private: flags the transpose invalid, so it is rebuilt
    fresh = input_grad()
    old_weight = decode(before["data"], before["scale_inv"])
    new_weight = decode(weight._data, scale_inv)
    result = {
        "transpose equals data.T before the step": before["in sync"],
        "transpose equals data.T after the step": in_sync,
        "transpose bytes untouched by the step": untouched,
        "_scale_inv before the step": before["scale_inv"],
        "_scale_inv after the step": scale_inv,
        "scale_inv after / before": scale_inv / before["scale_inv"],
        "||dX stale|| / ||dX fresh||": float(stale.norm() / fresh.norm()),
        "||dX stale - dX fresh|| / ||dX fresh||": float((stale - fresh).norm() / fresh.norm()),
        "weight change over the step (relative)":
            float((new_weight - old_weight).norm() / old_weight.norm()),
        "stale transpose at the old scale vs the weight before the step (relative)":
            float((decode(before["transpose"], before["scale_inv"]).t() - old_weight).norm()
                  / old_weight.norm()),
    }
    for name, value in result.items():
        print(f"{name}: {value:.6g}" if isinstance(value, float) else f"{name}: {value}")
    return result


if __name__ == "__main__":
    main()
