"""Reproduce: FP8 attention without a causal mask loses its accuracy after the first
delayed-scaling update (Transformer Engine DotProductAttention, cuDNN fused FP8, Hopper).

One te.DotProductAttention with DelayedScaling(fp8_dpa=True), fixed BF16 inputs, compared with
FP32 attention of the same inputs at three moments: a fresh module; after one grad-enabled
forward (whose autocast exit updates the delayed-scaling scales); and after setting the
softmax-output scale (META_S) back to 448. Needs a CUDA GPU with Transformer Engine; only
torch and transformer_engine are imported.

What we think happens. On leaving te.autocast with grad enabled, TE sets scale_S to
448 / amax_S. cuDNN records amax_S on the softmax output, derived from 1 / row_sum (the
largest normalized probability), but multiplies the *un-normalized* P = exp(s - rowmax),
whose largest entry in every row is 1, by scale_S right before the E4M3 cast; the row sum
that divides the result is taken on the unscaled P. That ordering is stated for the cuDNN
backend in cudnn-frontend pull request #509 ("Add SM120 per-tensor FP8 (e4m3) SDPA-forward
engine", https://github.com/NVIDIA/cudnn-frontend/pull/509: "P is multiplied by scale_s
immediately before the cvt ... Amax_S, which is derived from 1/row_sum"). Every
un-normalized probability above amax_S then saturates at 448, so the damage grows with
448 / amax_S. A causal mask is safe because query 0 attends to key 0 alone: amax_S = 1 and
scale_S stays 448.

The control: --emulate runs the same stages on TE's unfused FP8 emulation
(NVTE_FUSED_ATTN=0 NVTE_UnfusedDPA_Emulate_FP8=1), where TE's own PyTorch code quantizes the
normalized probabilities with the same scale_S. If the fused kernel degrades after the
update and the emulation does not, TE's bookkeeping (amax -> scale) is sound and the
mismatch is inside the fused kernel.

    python tools/fp8_attention_repro.py                    # causal and no_mask
    python tools/fp8_attention_repro.py --emulate          # the same on TE's emulation
    NVTE_DPA_FP8_RECIPE=DelayedScaling python tools/fp8_attention_repro.py --recipe current
"""

from __future__ import annotations

import argparse
import os
import sys

MASKS = ("causal", "no_mask")


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mask", nargs="+", default=list(MASKS), help=f"any of {MASKS}")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--recipe", choices=("delayed", "current"), default="delayed")
    parser.add_argument(
        "--emulate", action="store_true", help="run TE's unfused FP8 emulation, not cuDNN"
    )
    args = parser.parse_args(argv)
    if any(m not in MASKS for m in args.mask):
        parser.error(f"--mask: choose from {MASKS}")
    if min(args.batch, args.seq, args.heads, args.head_dim) < 1:
        parser.error("--batch, --seq, --heads and --head-dim must be positive")
    return args


def reproduce(te, recipes, torch, mask: str, args) -> None:
    from transformer_engine.pytorch.cpp_extensions.fused_attn import META_S

    shape = (args.batch, args.seq, args.heads, args.head_dim)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in "qkv"
    )
    exact = torch.nn.functional.scaled_dot_product_attention(
        *(t.float().transpose(1, 2) for t in (q, k, v)), is_causal=mask == "causal"
    )
    exact = exact.transpose(1, 2).flatten(2)
    attn = te.DotProductAttention(
        args.heads, args.head_dim, qkv_format="bshd", attn_mask_type=mask, attention_dropout=0.0
    )
    make = recipes.DelayedScaling if args.recipe == "delayed" else recipes.Float8CurrentScaling
    recipe = make(fp8_dpa=True)

    def forward(grad: bool):
        with torch.set_grad_enabled(grad), te.autocast(recipe=recipe):
            return attn(q, k, v).detach().float()

    def report(moment: str) -> None:
        out, again = forward(False), forward(False)
        meta = attn.fp8_meta["scaling_fwd"]
        print(
            f"{mask:8s} {moment:24s} scale_S={meta.scale[META_S].item():10.1f} "
            f"amax_S={meta.amax_history[0, META_S].item():.4f} "
            f"error_vs_fp32={((out - exact).norm() / exact.norm()).item():.4f} "
            f"norm_ratio={(out.norm() / exact.norm()).item():.3f} "
            f"deterministic={torch.equal(out, again)}"
        )

    report("fresh module")
    forward(True)  # autocast exit with grad enabled: delayed-scaling update
    report("after one update")
    attn.fp8_meta["scaling_fwd"].scale[META_S] = 448.0
    report("scale_S forced to 448")


def main(argv=None) -> int:
    args = parse(argv)
    if args.emulate:  # read at selection and at every forward: set before the first call
        os.environ.update({"NVTE_FUSED_ATTN": "0", "NVTE_UnfusedDPA_Emulate_FP8": "1"})
    try:  # TE first: it loads its cuDNN before torch does
        import transformer_engine
        import transformer_engine.pytorch as te
        from transformer_engine.common import recipe as recipes
    except (ImportError, OSError, RuntimeError) as error:
        print(f"needs Transformer Engine on a CUDA GPU: {error}", file=sys.stderr)
        return 1
    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU (Hopper: sm90)", file=sys.stderr)
        return 1
    print(
        f"{torch.cuda.get_device_name()} torch {torch.__version__} "
        f"TE {transformer_engine.__version__} cuDNN {torch.backends.cudnn.version()} "
        f"recipe {args.recipe}" + (" (unfused FP8 emulation)" if args.emulate else "")
    )
    for mask in args.mask:
        try:
            reproduce(te, recipes, torch, mask, args)
        except Exception as error:  # a reproduction reports any failure as a line
            print(f"{mask:8s} refused: {type(error).__name__}: {str(error).splitlines()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
