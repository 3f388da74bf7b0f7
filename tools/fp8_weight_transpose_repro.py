"""Reproduction: TE's FusedAdam leaves a delayed-scaling FP8 weight's transpose stale.

Needs one Hopper GPU (sm_90) and Transformer Engine (checked with 2.20.2); run with
``python -m fp8lab.weights.stale_transpose`` or copy this file alone (it imports only torch and
TE). On Hopper an FP8 GEMM takes only the "TN" layout, so a ``Float8Tensor`` weight built
under ``quantized_model_init`` keeps its FP8 data and a transpose (``_transpose``), and the
backward's data-gradient GEMM reads the transpose. ``FusedAdam(master_weights=True)`` updates
delayed-scaling FP8 weights with its fused kernel (``multi_tensor_adam_fp8``), which writes
``_data`` in place; nothing marks ``_transpose`` invalid, and ``update_usage`` keeps a
transpose that is flagged valid. The next backward then computes dX with the weight of the
step before. Expected: the transpose equals ``_data.T`` after the step, and dX does not
change when the transpose is rebuilt. Observed: it is stale, and dX moves when it is rebuilt.
"""

import torch


def main() -> dict:
    """Run the reproduction; return what it measured (and print it)."""
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import DelayedScaling

    torch.manual_seed(0)
    recipe = DelayedScaling()
    with te.quantized_model_init(enabled=True, recipe=recipe):
        layer = te.Linear(256, 256, bias=False, params_dtype=torch.bfloat16, device="cuda")
    optimizer = te.optimizers.FusedAdam(layer.parameters(), lr=1e-2, master_weights=True)
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def fwd_bwd():
        x.grad = None
        with te.autocast(enabled=True, recipe=recipe):
            out = layer(x)
        out.float().square().mean().backward()
        return x.grad.clone()

    fwd_bwd()
    optimizer.step()  # rewrites weight._data, leaves weight._transpose as it was
    weight = layer.weight
    transpose = weight._transpose
    in_sync = transpose is not None and bool(torch.equal(transpose, weight._data.t()))
    stale_grad = fwd_bwd()
    weight._transpose_invalid = True  # what a fix would do: rebuild it before it is read
    fresh_grad = fwd_bwd()
    error = float((stale_grad - fresh_grad).float().norm() / fresh_grad.float().norm())
    result = {"transpose equals data.T after the step": in_sync,
              "dX with the stale transpose vs rebuilt (relative)": error}
    for name, value in result.items():
        print(f"{name}: {value}")
    return result


if __name__ == "__main__":
    main()
