"""The CPU reference of TE: modules, recipes, context managers, numerics and error paths."""

import pytest
import torch

from fp8lab import reference as te
from fp8lab.formats import relative_error
from fp8lab.reference import quantization as q
from fp8lab.reference import recipe

# --- numerics ------------------------------------------------------------------------------------


def test_cast_saturates_and_rounds_to_nearest_even():
    x = torch.tensor([1e6, -1e6, 0.3952, 17.0, 19.0, float("nan")])
    e4m3 = q.cast_to_fp8(x, 1.0, torch.float8_e4m3fn).float()
    assert e4m3[:2].tolist() == [448.0, -448.0]
    assert e4m3[2].item() == 0.40625 and e4m3[3].item() == 16.0 and e4m3[4].item() == 20.0
    assert torch.isnan(e4m3[5])
    assert q.cast_to_fp8(x[:3], 1.0, torch.float8_e5m2).float().tolist() == [
        57344.0,
        -57344.0,
        0.375,
    ]


def test_scale_from_amax_edge_cases():
    assert q.scale_from_amax(torch.tensor(2.0), 448.0).item() == 224.0
    assert q.scale_from_amax(torch.tensor(0.0), 448.0).item() == 1.0
    assert q.scale_from_amax(torch.tensor(float("inf")), 448.0).item() == 1.0
    assert q.scale_from_amax(torch.tensor(1e-45), 448.0).item() == q.FP32_MAX
    assert q.scale_from_amax(torch.tensor(3.0), 448.0, power_of_2=True).item() == 128.0


def test_scales_are_correctly_rounded_divisions():
    """TE divides in FP32 with one rounding; ``float / tensor`` in PyTorch rounds twice."""
    amaxes = (
        torch.cat([torch.tensor([4.59375, 1.515625]), torch.rand(2000) * 10])
        .to(torch.bfloat16)
        .float()
    )
    for fp8_max in (448.0, 57344.0):
        exact = (torch.tensor(fp8_max, dtype=torch.float64) / amaxes.double()).float()
        assert torch.equal(q.scale_from_amax(amaxes, fp8_max), exact)
        meta = q.ScalingMeta.create(1, amaxes.numel())
        meta.amax_history[0] = amaxes
        meta.update(fp8_max, recipe.DelayedScaling(amax_history_len=1, margin=1))
        assert torch.equal(meta.scale, exact / 2)
    assert (
        q.scale_from_amax(torch.tensor(4.59375), 57344.0).item() == 12483.0478515625
    )  # not 12483.046875
    x = (
        torch.randn(1 << 16).clamp(-4.59375, 4.59375).to(torch.bfloat16).float()
    )  # amax 4.59375 = 147 / 32
    x[0] = 4.59375
    scale = q.scale_from_amax(q.amax_of(x), 57344.0)
    one_ulp_less = torch.nextafter(scale, torch.tensor(0.0))
    flipped = (
        (
            q.cast_to_fp8(x, scale, torch.float8_e5m2).view(torch.uint8)
            != q.cast_to_fp8(x, one_ulp_less, torch.float8_e5m2).view(torch.uint8)
        )
        .float()
        .mean()
        .item()
    )
    assert (
        0.004 < flipped < 0.008
    )  # values on an exact tie (about 0.6%): the ulp decides their rounding
    just_below_1024 = torch.tensor(448.0) / torch.nextafter(torch.tensor(1024.0), torch.tensor(0.0))
    assert q.scale_from_amax(just_below_1024, 448.0, power_of_2=True).item() == 512.0


def test_delayed_scaling_update_follows_te():
    meta = q.ScalingMeta.create(4, 1)
    r = recipe.DelayedScaling(amax_history_len=4, margin=1)
    for amax in (2.0, 8.0, 1.0):
        meta.amax_history[0, 0] = amax
        meta.update(448.0, r)
    # max over the window, divided by 2**margin; history rolled with row 0 zeroed
    assert meta.scale.item() == pytest.approx(448.0 / 8.0 / 2)
    assert meta.amax_history[:, 0].tolist() == [0.0, 2.0, 8.0, 1.0]
    recent = q.ScalingMeta.create(4, 1)
    for amax in (8.0, 1.0):
        recent.amax_history[0, 0] = amax
        recent.update(
            448.0, recipe.DelayedScaling(amax_history_len=4, amax_compute_algo="most_recent")
        )
    assert recent.scale.item() == 448.0
    zero = q.ScalingMeta.create(2, 1)
    zero.scale.fill_(5.0)
    zero.update(448.0, recipe.DelayedScaling(amax_history_len=2))
    assert zero.scale.item() == 5.0  # a zero amax keeps the previous scale


def test_block_scaling_limits_error_to_each_block():
    x = torch.randn(4, 256)
    x[0, :128] *= 1e5
    per_tensor = q.quantize_per_tensor(
        x, q.scale_from_amax(q.amax_of(x), 448.0), torch.float8_e4m3fn
    ).dequantize()
    blocks = q.quantize_blocks_1d(x, torch.float8_e4m3fn, 128, power_of_2=True).dequantize()
    small = (slice(1, 4), slice(None))
    assert (
        relative_error(blocks[small], x[small]) < 0.05 < relative_error(per_tensor[small], x[small])
    )
    w = q.quantize_blocks_2d(torch.randn(200, 300), torch.float8_e4m3fn, 128, True)
    assert w.data.shape == (200, 300) and w.scale_inv.shape == (200, 300)


def test_mxfp8_scales_are_powers_of_two_per_32_values():
    x = torch.randn(8, 64) * torch.logspace(-3, 3, 64)
    quant = q.quantize_mxfp8(x)
    assert torch.all(torch.log2(quant.scale_inv) == torch.round(torch.log2(quant.scale_inv)))
    assert quant.scale_inv[:, :32].unique(dim=1).shape[1] == 1
    assert relative_error(quant.dequantize(), x) < 0.05
    assert quant.data.float().abs().max() <= 448


def test_nvfp4_values_block_scales_and_error():
    x = torch.randn(4, 64)
    quant = q.quantize_nvfp4(x)
    grid = set(q.E2M1_VALUES.tolist())
    assert set(quant.values.abs().unique().tolist()) <= grid
    assert quant.block_scales.dtype == torch.float8_e4m3fn and quant.block_scales.shape == (4, 4)
    assert 0.02 < relative_error(quant.dequantize(), x) < 0.2
    assert q.round_to_e2m1(torch.tensor([0.25, 0.75, 2.5, 5.0, 7.0])).tolist() == [
        0.0,
        1.0,
        2.0,
        4.0,
        6.0,
    ]


# --- modules ------------------------------------------------------------------------------------

KINDS = {
    "Linear": lambda dtype: te.Linear(64, 32, params_dtype=dtype),
    "LayerNormLinear": lambda dtype: te.LayerNormLinear(
        64, 32, params_dtype=dtype, normalization="RMSNorm"
    ),
    "LayerNormMLP": lambda dtype: te.LayerNormMLP(64, 128, params_dtype=dtype, activation="swiglu"),
    "TransformerLayer": lambda dtype: te.TransformerLayer(
        64, 128, 4, num_gqa_groups=2, params_dtype=dtype, hidden_dropout=0.0, attention_dropout=0.0
    ),
}
RECIPES = [
    None,
    recipe.DelayedScaling(),
    recipe.Float8CurrentScaling(),
    recipe.Float8BlockScaling(),
    recipe.MXFP8BlockScaling(),
]


@pytest.mark.parametrize("recipe_obj", RECIPES, ids=lambda r: type(r).__name__ if r else "bf16")
@pytest.mark.parametrize("kind", KINDS)
def test_modules_run_and_stay_close_to_high_precision(kind, recipe_obj):
    module = KINDS[kind](torch.float32)
    shape = (16, 2, 64) if kind == "TransformerLayer" else (32, 64)
    x = torch.randn(shape, requires_grad=True)
    reference_out = module(x)
    reference_out.sum().backward()
    reference_grad = x.grad.clone()
    x.grad = None
    with te.autocast(enabled=recipe_obj is not None, recipe=recipe_obj):
        out = module(x)
    out.sum().backward()
    assert out.shape == reference_out.shape and out.dtype == torch.float32
    bound = 0.0 if recipe_obj is None else 0.1
    assert relative_error(out, reference_out) <= bound + 1e-6
    assert relative_error(x.grad, reference_grad) <= 2 * bound + 1e-6
    if recipe_obj is not None:
        assert relative_error(out, reference_out) > 0  # quantization really happened


def test_layer_norm_and_rms_norm_match_torch():
    x = torch.randn(8, 32)
    torch.testing.assert_close(
        te.LayerNorm(32)(x), torch.nn.functional.layer_norm(x, (32,), eps=1e-5)
    )
    torch.testing.assert_close(
        te.RMSNorm(32)(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    )


def test_transformer_layer_defaults_are_causal_with_dropout():
    layer = te.TransformerLayer(32, 64, 4)
    assert layer.self_attn_mask_type == "causal" and layer.hidden_dropout == 0.1
    assert layer.self_attention.core_attention.attention_dropout == 0.1
    layer.eval()
    x = torch.randn(8, 1, 32)
    changed = x.clone()
    changed[-1] += 1  # a later token must not change earlier outputs under the causal mask
    torch.testing.assert_close(layer(x)[:-1], layer(changed)[:-1])


def test_parameter_names_follow_te():
    names = set(dict(te.TransformerLayer(64, 128, 4).named_parameters()))
    assert {
        "self_attention.layernorm_qkv.query_weight",
        "self_attention.layernorm_qkv.layer_norm_weight",
        "self_attention.proj.weight",
        "layernorm_mlp.fc1_weight",
        "layernorm_mlp.fc2_bias",
    } <= names
    fused = set(dict(te.TransformerLayer(64, 128, 4, fuse_qkv_params=True).named_parameters()))
    assert "self_attention.layernorm_qkv.weight" in fused


def test_delayed_scaling_updates_when_te_does():
    linear = te.Linear(64, 32)
    r = recipe.DelayedScaling(amax_history_len=8)
    x = torch.randn(16, 64) * 3
    with te.autocast(recipe=r):
        out = linear(x)
        assert (
            linear.fp8_meta["scaling_fwd"].amax_history[0, 0] == x.abs().max()
        )  # recorded at the cast
        assert (
            linear.fp8_meta["scaling_fwd"].scale[0] == 1.0
        )  # not updated until the autocast exits
    assert linear.fp8_meta["scaling_fwd"].scale[0] == pytest.approx(448 / x.abs().max().item())
    assert linear.fp8_meta["scaling_bwd"].scale[0] == 1.0
    out.backward(torch.full_like(out, 0.5))
    assert linear.fp8_meta["scaling_bwd"].scale[0] == pytest.approx(
        57344 / 0.5
    )  # HYBRID: E5M2 gradients


def test_fuse_wgrad_accumulation_writes_main_grad():
    linear = te.Linear(64, 32, fuse_wgrad_accumulation=True, bias=False)
    x = torch.randn(16, 64)
    with pytest.raises(RuntimeError, match="main_grad"):
        linear(x)
    linear.weight.main_grad = torch.zeros(32, 64)
    for enabled in (False, True):
        with te.autocast(enabled=enabled, recipe=recipe.Float8CurrentScaling()):
            linear(x).sum().backward()
    assert linear.weight.grad is None and linear.weight.main_grad.abs().sum() > 0


def test_is_first_microbatch_caches_the_fp8_weight():
    linear = te.Linear(64, 32)
    r = recipe.Float8CurrentScaling()
    x = torch.randn(16, 64)
    with te.autocast(recipe=r):
        first = linear(x, is_first_microbatch=True)
    with torch.no_grad():
        linear.weight.mul_(2)
    with te.autocast(recipe=r):
        cached = linear(x, is_first_microbatch=False)
        fresh = linear(x, is_first_microbatch=True)
    torch.testing.assert_close(cached, first)
    assert not torch.allclose(fresh, first)


def test_quantized_model_init_stores_fp8_values():
    # delayed scaling: TE casts with the weight quantizer's fresh scale, 1.0
    with te.quantized_model_init(enabled=True, recipe=recipe.DelayedScaling()):
        linear = te.Linear(64, 32, params_dtype=torch.bfloat16)
    assert linear.weight._fp8lab_quantized
    w = linear.weight.float()
    on_grid = q.cast_to_fp8(w, 1.0, torch.float8_e4m3fn).float()
    torch.testing.assert_close(on_grid, w, rtol=0, atol=0)
    # current scaling: the weight's own amax
    with te.quantized_model_init(enabled=True, recipe=recipe.Float8CurrentScaling()):
        linear = te.Linear(64, 32, params_dtype=torch.bfloat16)
    w = linear.weight.float()
    scale = q.scale_from_amax(q.amax_of(w), 448.0)
    on_grid = q.cast_to_fp8(w, scale, torch.float8_e4m3fn).float() / scale
    torch.testing.assert_close(
        on_grid, w, rtol=2**-8, atol=0
    )  # FP8 values, stored after BF16 rounding


def test_preserve_high_precision_init_val_keeps_the_values_before_the_cast():
    torch.manual_seed(0)
    plain = te.Linear(64, 32, params_dtype=torch.bfloat16)
    torch.manual_seed(0)
    with te.quantized_model_init(
        recipe=recipe.DelayedScaling(), preserve_high_precision_init_val=True
    ):
        linear = te.Linear(64, 32, params_dtype=torch.bfloat16)
    kept = linear.weight.get_high_precision_init_val()
    assert kept.device.type == "cpu" and torch.equal(kept, plain.weight.detach())
    assert not torch.equal(kept, linear.weight.detach())  # the weight itself is FP8-rounded
    linear.weight.clear_high_precision_init_val()
    assert linear.weight.get_high_precision_init_val() is None


def test_fused_wgrad_overwrites_main_grad_on_the_first_micro_batch():
    """TE's wgrad GEMM writes main_grad with accumulate=False when is_first_microbatch=True."""
    linear = te.Linear(64, 32, fuse_wgrad_accumulation=True, bias=False)
    x, dy = torch.randn(16, 64), torch.randn(16, 32)
    expected = dy.t() @ x
    for enabled in (False, True):
        for first in (True, None):
            linear.weight.main_grad = torch.full((32, 64), 7.0)
            with te.autocast(enabled=enabled, recipe=recipe.Float8CurrentScaling()):
                out = linear(x, is_first_microbatch=first)
            out.backward(dy)
            offset = 0.0 if first else 7.0
            tolerance = 0.1 if enabled else 1e-4
            error = (linear.weight.main_grad - offset - expected).norm() / expected.norm()
            assert error < tolerance, (enabled, first, error)


def test_deprecated_aliases_warn_like_te():
    recipe_object = recipe.DelayedScaling()
    with (
        pytest.warns(DeprecationWarning, match="fp8_autocast is deprecated"),
        te.fp8_autocast(enabled=True, fp8_recipe=recipe_object),
    ):
        pass
    with (
        pytest.warns(DeprecationWarning, match="fp8_model_init is deprecated"),
        te.fp8_model_init(enabled=True),
    ):
        pass


def test_checkpoint_gives_the_same_gradients():
    layer = te.TransformerLayer(64, 128, 4, hidden_dropout=0.0, attention_dropout=0.0)
    r = recipe.DelayedScaling()
    x = torch.randn(16, 2, 64, requires_grad=True)
    for use_checkpoint in (False, True):
        with te.autocast(recipe=r):
            out = te.checkpoint(layer, x) if use_checkpoint else layer(x)
        out.sum().backward()
        if not use_checkpoint:
            plain, x.grad = x.grad.clone(), None
    assert relative_error(x.grad, plain) < 0.05
    proj = layer.self_attention.layernorm_qkv.fp8_meta["scaling_bwd"]
    assert proj.amax_history[-1, 0] > 0  # the backward update ran under checkpoint too


# --- errors --------------------------------------------------------------------------------------


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="the reference refuses CUDA only where there is none"
)
def test_reference_refuses_cuda_without_a_gpu():
    with pytest.raises(ValueError, match="device='cuda' but this machine has no CUDA GPU"):
        te.Linear(64, 32, device="cuda")


def test_fp8_shape_rule_error_as_in_te():
    linear = te.Linear(60, 32)
    with (
        pytest.raises(ValueError, match=r"divisible by 16.*dims=\[16, 60\]"),
        te.autocast(recipe=recipe.DelayedScaling()),
    ):
        linear(torch.randn(16, 60))
    linear(torch.randn(16, 60))  # fine outside autocast


@pytest.mark.parametrize(
    "call, error, message",
    [
        (
            lambda: te.Linear(64, 32, tp_size=2),
            NotImplementedError,
            "tensor parallelism over 2 ranks",
        ),
        (lambda: te.Linear(64, 32, ub_overlap_ag=True), NotImplementedError, "ub_overlap_ag"),
        (
            lambda: te.TransformerLayer(64, 128, 4, self_attn_mask_type="padding"),
            NotImplementedError,
            "self_attn_mask_type='padding'",
        ),
        (
            lambda: te.TransformerLayer(64, 128, 4, layer_type="decoder"),
            NotImplementedError,
            "layer_type",
        ),
        (
            lambda: te.LayerNormMLP(64, 128, activation="srelu"),
            NotImplementedError,
            "activation='srelu'",
        ),
        (lambda: te.TransformerLayer(64, 128, 3), ValueError, "num_attention_heads=3 must divide"),
        (lambda: te.TransformerLayer(64, 128, 4, num_gqa_groups=3), ValueError, "num_gqa_groups=3"),
        (
            lambda: te.autocast(recipe=recipe.NVFP4BlockScaling()).__enter__(),
            NotImplementedError,
            "NVFP4",
        ),
        (
            lambda: te.autocast(recipe=recipe.DelayedScaling(fp8_dpa=True)).__enter__(),
            NotImplementedError,
            "fp8_dpa",
        ),
        (lambda: recipe.DelayedScaling(fp8_format=recipe.Format.E5M2), AssertionError, "Pure E5M2"),
        (
            lambda: recipe.DelayedScaling(amax_compute_algo="mean"),
            ValueError,
            "amax_compute_algo='mean'",
        ),
    ],
)
def test_refusals_name_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()
    q.STATE.__init__()  # a refused autocast must not leave state behind for the next test
