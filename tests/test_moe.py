"""fp8lab.moe: the MoE stand-ins follow TE's formulas and refuse what they do not model."""

import pytest
import torch

from fp8lab.moe import MoEShape, moe_layer_bytes, padded_rows, skewed_counts
from fp8lab.moe import reference as R
from fp8lab.reference import autocast, recipe


def routed(T=24, E=4, k=2, seed=0):
    torch.manual_seed(seed)
    logits = torch.randn(T, E, requires_grad=True)
    probs, routing_map = R.fused_topk_with_score_function(
        logits, k, False, None, None, None, "softmax", None
    )
    return logits, probs, routing_map


def test_router_weights_sum_to_one_over_top_k():
    _, probs, routing_map = routed()
    assert torch.allclose(probs.sum(1), torch.ones(24))
    assert (routing_map.sum(1) == 2).all()
    assert ((probs > 0) == routing_map).all()


def test_aux_loss_is_coeff_when_even():
    T, E, k = 8, 4, 2
    scores = torch.full((T, E), 1 / E)
    loss = R.fused_moe_aux_loss(scores, torch.full((E,), T * k // E), T, E, k, 0.5)
    assert loss.item() == pytest.approx(0.5)


@pytest.mark.parametrize("align", [None, 16])
def test_permute_unpermute_round_trip(align):
    _, probs, routing_map = routed()
    x = torch.randn(24, 8, requires_grad=True)
    counts = routing_map.sum(0)
    if align:
        rows, _, rid, pad, splits = R.moe_permute_and_pad_with_probs(
            x, probs, routing_map, counts, align
        )
        assert all(n % align == 0 for n in splits.tolist())
    else:
        rows, rid = R.moe_permute(x, routing_map, num_out_tokens=48)
        pad = None
    y = R.moe_unpermute(rows, rid, merging_probs=probs, pad_offsets=pad)
    assert torch.allclose(y, x * probs.sum(1, keepdim=True), atol=1e-6)
    y.sum().backward()
    assert x.grad is not None


def test_grouped_linear_matches_per_expert_linear_and_runs_fp8():
    g = R.GroupedLinear(3, 16, 32, bias=False)
    x = torch.randn(48, 16)
    out = g(x, [16, 0, 32])
    expected = torch.cat([x[:16] @ g.weight0.t(), x[16:] @ g.weight2.t()])
    assert torch.allclose(out, expected, atol=1e-6)
    for r in (recipe.DelayedScaling(), recipe.Float8CurrentScaling(),
              recipe.Float8BlockScaling()):
        with autocast(recipe=r):
            y = g(x.requires_grad_(), [16, 0, 32])
        y.sum().backward()


def test_refusals():
    logits, probs, routing_map = routed()
    with pytest.raises(NotImplementedError):
        R.fused_topk_with_score_function(logits, 2, False, 2, 1, None, "softmax", None)
    with pytest.raises(NotImplementedError):
        R.moe_permute(torch.randn(24, 8), routing_map, 10)  # would drop tokens
    with pytest.raises(ValueError):
        R.GroupedLinear(2, 4, 4)(torch.randn(4, 4), [1, 2, 3])
    with pytest.raises(NotImplementedError):
        R.GroupedLinear(2, 4, 4, sequence_parallel=True)
    with pytest.raises(ValueError):
        R.fused_topk_with_score_function(logits.double(), 2, False, None, None, None,
                                         "softmax", None)


def test_counts_and_bytes():
    counts = skewed_counts(1000, 8, 4.0)
    assert sum(counts) == 1000 and max(counts) == 500
    assert skewed_counts(10, 5) == [2] * 5
    assert padded_rows([1, 16, 17]) == 16 + 16 + 32
    shape = MoEShape(T=64, H=128, F=256, E=4, k=2)
    bf16, fp8 = moe_layer_bytes(shape, "bf16"), moe_layer_bytes(shape, "current")
    assert fp8["fp8 weight copies"] == 2 * 4 * 2 * 128 * 256
    assert fp8["saved activations"] < bf16["saved activations"]
    with pytest.raises(ValueError):
        moe_layer_bytes(shape, "fp4")
    with pytest.raises(ValueError):
        skewed_counts(10, 4, 5.0)
    with pytest.raises(TypeError):
        moe_layer_bytes((64, 128), "bf16")
