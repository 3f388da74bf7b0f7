"""Attention: FLOPs against FlopCounterMode, the CPU reference's masks and windows against plain
PyTorch, and chapter 05's kit (the shape of a problem, standard attention, the copy task, TE's
selection log from a fresh process, the checks of their inputs).

The GPU tests at the end (``-m gpu``) check on real TE that the selection log comes back from a
fresh process and that the reference's sliding windows match TE's.
"""

from __future__ import annotations

import math
import os
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from fp8lab import attention, flops, profiling
from fp8lab.config import TransformerConfig
from fp8lab.reference.attention import DotProductAttention, allowed_keys, check_set_window_size

B, A, S, D = 2, 4, 24, 8


def counted(fn, *tensors, backward=False):
    with FlopCounterMode(display=False) as counter:
        out = fn(*tensors)
        if backward:
            out.sum().backward()
    return counter.get_total_flops()


def qkv(groups=A, seq=S, dtype=torch.float64, batch=B):
    torch.manual_seed(0)
    return (
        torch.randn(batch, seq, A, D, dtype=dtype, requires_grad=True),
        torch.randn(batch, seq, groups, D, dtype=dtype, requires_grad=True),
        torch.randn(batch, seq, groups, D, dtype=dtype, requires_grad=True),
    )


def banded_attention(q, k, v, mask, window_size):
    """Attention that computes, for each query row, only the keys inside its window: the work a
    kernel that skips every masked score does. ``[B, S, heads, D]`` in and out."""
    left, right = flops.attention_window(mask, window_size)
    repeat = q.shape[2] // k.shape[2]
    q_, k_, v_ = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, S, D]
    k_, v_ = k_.repeat_interleave(repeat, dim=1), v_.repeat_interleave(repeat, dim=1)
    seq, rows = q.shape[1], []
    for i in range(seq):
        lo = 0 if left < 0 else max(0, i - left)
        hi = seq - 1 if right < 0 else min(seq - 1, i + right)
        scores = q_[:, :, i : i + 1] @ k_[:, :, lo : hi + 1].transpose(-2, -1) / math.sqrt(D)
        rows.append(scores.softmax(dim=-1) @ v_[:, :, lo : hi + 1])  # [B, A, 1, D]
    return torch.cat(rows, dim=2).transpose(1, 2)


WINDOWS = [
    ("no_mask", None),
    ("causal", None),
    ("causal", (5, 0)),
    ("causal", (0, 0)),
    ("no_mask", (3, 2)),
    ("no_mask", (0, 7)),
    ("causal_bottom_right", (40, 0)),
]


# --- FLOPs --------------------------------------------------------------------------------------


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "forward+backward"])
@pytest.mark.parametrize("groups", [A, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_dense_explicit_attention_counts_the_full_square_whatever_the_mask(groups, backward):
    """Masked dense attention computes every score: FlopCounterMode sees the full square."""
    expected = flops.attention_core_flops(B, A, S, D, mask="no_mask", backward=backward)
    for mask, window in WINDOWS:

        def fn(q, k, v, mask=mask, window=window):
            return attention.explicit_attention(q, k, v, mask=mask, window_size=window)

        assert counted(fn, *qkv(groups), backward=backward) == expected


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "forward+backward"])
@pytest.mark.parametrize(("mask", "window"), [w for w in WINDOWS if w[1] is not None])
def test_window_flops_are_the_pairs_a_skipping_kernel_computes(mask, window, backward):
    fn = lambda q, k, v: banded_attention(q, k, v, mask, window)  # noqa: E731
    expected = flops.attention_core_flops(
        B, A, S, D, mask=mask, window_size=window, groups=2, backward=backward
    )
    assert counted(fn, *qkv(groups=2), backward=backward) == expected


def test_causal_convention_is_half_the_square_not_the_exact_triangle():
    """Without a window, causal counts S^2/2 pairs per head; a kernel skipping every masked score
    does S(S+1)/2, exactly 2 B A D S FLOPs more (1/S relative)."""
    exact = counted(lambda q, k, v: banded_attention(q, k, v, "causal", None), *qkv())
    convention = flops.attention_core_flops(B, A, S, D, mask="causal")
    assert convention == flops.attention_core_flops(B, A, S, D) // 2
    assert exact - convention == 2 * B * A * D * S


def test_gqa_does_not_change_flops():
    mha = counted(lambda q, k, v: banded_attention(q, k, v, "causal", (5, 0)), *qkv(A))
    mqa = counted(lambda q, k, v: banded_attention(q, k, v, "causal", (5, 0)), *qkv(1))
    assert (
        mha
        == mqa
        == flops.attention_core_flops(B, A, S, D, mask="causal", window_size=(5, 0), groups=1)
    )


def test_attention_flops_of_a_config_reuses_the_core_count():
    cfg = TransformerConfig(256, 1024, 8, num_gqa_groups=2)
    for causal in (False, True):
        core = flops.attention_core_flops(
            3, 8, 100, 32, mask="causal" if causal else "no_mask", groups=2
        )
        assert flops.attention_flops(cfg, 3, 100, causal=causal) == core
    assert flops.attention_flops(cfg, 1, 64, causal=True, window_size=(7, 0)) == (
        4 * 8 * 32 * flops.attended_pairs(64, "causal", (7, 0))
    )


def test_flashattention_benchmark_convention_for_the_backward():
    """FlashAttention's benchmarks count forward + backward as 3.5x the forward (the backward
    recomputes the scores); the default, model FLOPs, is 3x."""
    forward = flops.attention_core_flops(8, 16, 2048, 64, mask="causal")
    assert forward == 4 * 8 * 2048**2 * 16 * 64 // 2
    assert flops.attention_core_flops(8, 16, 2048, 64, mask="causal", backward=True) == 3 * forward
    assert flops.attention_core_flops(
        8, 16, 2048, 64, mask="causal", backward=True, backward_factor=2.5
    ) == pytest.approx(3.5 * forward)


@settings(max_examples=200, deadline=None)
@given(
    seq=st.integers(1, 40),
    left=st.integers(-1, 45),
    right=st.integers(-1, 45),
    causal=st.booleans(),
)
def test_attended_pairs_closed_form_matches_counting(seq, left, right, causal):
    mask = "causal" if causal else "no_mask"
    window = (left, 0) if causal else (-1, -1) if min(left, right) < 0 else (left, right)
    brute = sum(
        1
        for i in range(seq)
        for j in range(seq)
        if (window[1] < 0 or j <= i + window[1]) and (window[0] < 0 or j >= i - window[0])
    )
    assert flops.attended_pairs(seq, mask, window) == brute
    assert int(attention.window_mask(seq, mask, window).sum()) == brute


@pytest.mark.parametrize(
    ("mask", "window", "error"),
    [
        ("causal", (4, 2), "needs \\(-1, 0\\) or \\(left >= 0, 0\\)"),
        ("no_mask", (-1, 0), "needs \\(-1, -1\\)"),
        ("no_mask", (3, -1), "needs \\(-1, -1\\)"),
        ("causal", (-2, 0), "window_size\\[0\\]=-2"),
        ("padding", None, "mask='padding'"),
    ],
)
def test_windows_te_would_rewrite_or_reject_are_refused(mask, window, error):
    with pytest.raises(ValueError, match=error):
        flops.attention_window(mask, window)


def test_attention_window_defaults_follow_te():
    assert flops.attention_window("causal") == (-1, 0)
    assert flops.attention_window("causal", (-1, -1)) == (-1, 0)
    assert flops.attention_window("no_mask") == (-1, -1)
    assert flops.attention_window("causal_bottom_right", [128, 0]) == (128, 0)


# --- the CPU reference --------------------------------------------------------------------------


def _to(layout, t):
    return t.transpose(0, 1) if layout == "sbhd" else t  # bshd <-> sbhd


@pytest.mark.parametrize("layout", ["sbhd", "bshd"])
@pytest.mark.parametrize("groups", [A, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("mask", ["causal", "no_mask", "causal_bottom_right"])
def test_reference_matches_plain_sdpa(layout, groups, mask):
    q, k, v = qkv(groups)
    dpa = DotProductAttention(A, D, num_gqa_groups=groups, qkv_format=layout, attn_mask_type=mask)
    out = dpa(*(_to(layout, t) for t in (q, k, v)))  # [S, B, A*D] or [B, S, A*D]
    repeat = A // groups
    expected = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.transpose(1, 2).repeat_interleave(repeat, 1),
        v.transpose(1, 2).repeat_interleave(repeat, 1),
        is_causal=mask != "no_mask",
    ).transpose(1, 2)  # [B, S, A, D]
    torch.testing.assert_close(_to(layout, out), expected.reshape(B, S, A * D))


@pytest.mark.parametrize(("mask", "window"), WINDOWS)
def test_reference_windows_match_explicit_softmax(mask, window):
    q, k, v = qkv(2)
    dpa = DotProductAttention(
        A, D, num_gqa_groups=2, qkv_format="bshd", attn_mask_type=mask, window_size=window
    )
    out = dpa(q, k, v)
    expected = attention.explicit_attention(q, k, v, mask=mask, window_size=window)
    torch.testing.assert_close(out, expected.reshape(B, S, A * D))
    out.sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    banded_attention(q, k, v, mask, window).sum().backward()
    for got, want in zip(grads, (q.grad, k.grad, v.grad), strict=True):
        torch.testing.assert_close(got, want)


@settings(max_examples=60, deadline=None)
@given(
    seq_q=st.integers(1, 12),
    seq_kv=st.integers(1, 12),
    left=st.integers(-1, 14),
    right=st.integers(-1, 14),
    bottom_right=st.booleans(),
    mask=st.sampled_from(["no_mask", "causal", "causal_bottom_right"]),
)
def test_reference_window_is_te_documented_rule(seq_q, seq_kv, left, right, bottom_right, mask):
    """TE's docstring: query i attends to keys in [i + s_k - s_q - left, i + s_k - s_q + right]
    inclusive (bottom-right diagonal; without the shift at the top left), -1 unlimited; causal
    masks force right = 0, ``causal`` is at the top left, ``causal_bottom_right`` at the bottom
    right."""
    if "causal" in mask:
        right = 0
    elif min(left, right) < 0:
        left = right = -1
    if mask == "causal":
        bottom_right = False
    if mask == "causal_bottom_right":
        bottom_right = True
    shift = seq_kv - seq_q if bottom_right else 0
    got = allowed_keys(seq_q, seq_kv, mask, (left, right), bottom_right)
    for i in range(seq_q):
        for j in range(seq_kv):
            inside = (left < 0 or j >= i + shift - left) and (right < 0 or j <= i + shift + right)
            assert (True if got is None else bool(got[i, j])) == inside


def test_causal_bottom_right_for_cross_attention_shapes():
    torch.manual_seed(0)
    q = torch.randn(B, 6, A, D, dtype=torch.float64)
    k, v = (torch.randn(B, 10, A, D, dtype=torch.float64) for _ in range(2))
    out = DotProductAttention(
        A, D, qkv_format="bshd", attn_mask_type="causal_bottom_right", attention_type="cross"
    )(q, k, v)
    keep = torch.arange(10)[None, :] <= torch.arange(6)[:, None] + 4  # diagonal at bottom right
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D)
    probs = scores.masked_fill(~keep, float("-inf")).softmax(-1)
    expected = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(B, 6, A * D)
    torch.testing.assert_close(out, expected)
    top_left = DotProductAttention(A, D, qkv_format="bshd", attn_mask_type="causal")(q, k, v)
    assert not torch.allclose(top_left, out)


def test_window_size_is_checked_and_rewritten_as_te_does():
    with pytest.warns(UserWarning, match="should be \\(-1, 0\\) or \\(>=0, 0\\)"):
        assert check_set_window_size("causal", (-1, -1)) == (-1, 0)
    with pytest.warns(UserWarning, match="should be \\(-1, 0\\)"):
        assert check_set_window_size("causal", (8, 3)) == (8, 0)
    with pytest.warns(UserWarning, match="should be \\(-1, -1\\)"):
        assert check_set_window_size("no_mask", (-1, 0)) == (-1, -1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_set_window_size("causal", None) == (-1, 0)
        assert check_set_window_size("no_mask", (4, 0)) == (4, 0)
    with pytest.raises(AssertionError, match="window_size should be"):
        check_set_window_size("causal", (-3, 0))
    with pytest.raises(AssertionError, match="window_size should be"):
        check_set_window_size("no_mask", (3, -1))
    with pytest.raises(AssertionError, match="Invalid attn_mask_type"):
        DotProductAttention(A, D, attn_mask_type="triangular")


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: DotProductAttention(A, D, attn_mask_type="padding"), "attn_mask_type='padding'"),
        (
            lambda: DotProductAttention(A, D, attn_mask_type="padding,causal"),
            "attn_mask_type='padding_causal'",
        ),
        (lambda: DotProductAttention(A, D, attn_mask_type="arbitrary"), "attn_mask_type"),
        (lambda: DotProductAttention(A, D, softcap=30.0), "softcap"),
        (lambda: DotProductAttention(A, D, softmax_type="learnable"), "softmax_type"),
        (
            lambda: DotProductAttention(A, D, qkv_format="bshd")(
                *qkv(), attention_mask=torch.ones(B, 1, 1, S, dtype=torch.bool)
            ),
            "attention_mask",
        ),
        (
            lambda: DotProductAttention(A, D, qkv_format="bshd")(
                *qkv(), attn_mask_type="padding_causal_bottom_right"
            ),
            "attn_mask_type",
        ),
        (
            lambda: DotProductAttention(A, D, qkv_format="bshd")(
                *qkv(), cu_seqlens_q=torch.ones(3)
            ),
            "cu_seqlens_q",
        ),
    ],
)
def test_reference_refuses_what_it_does_not_model(make, argument):
    with pytest.raises(NotImplementedError, match=argument.replace("(", "\\(")):
        make()


def test_reference_refuses_rows_with_nothing_to_attend_to():
    q = torch.randn(1, 8, A, D)
    k = v = torch.randn(1, 3, A, D)
    dpa = DotProductAttention(A, D, qkv_format="bshd", attn_mask_type="causal_bottom_right")
    with pytest.raises(NotImplementedError, match="no key to attend to"):
        dpa(q, k, v)


def test_forward_arguments_override_the_constructor_like_te():
    q, k, v = qkv()
    dpa = DotProductAttention(A, D, qkv_format="bshd", attn_mask_type="no_mask")
    windowed = dpa(q, k, v, attn_mask_type="causal", window_size=(3, 0))
    expected = attention.explicit_attention(q, k, v, mask="causal", window_size=(3, 0))
    torch.testing.assert_close(windowed, expected.reshape(B, S, A * D))


# --- explicit and SDPA attention ----------------------------------------------------------------


def test_attention_shape_label_and_inputs():
    shape = attention.AttentionShape(2, 64, 8, 16, groups=2, window_size=(15, 0))
    assert shape.label == "B=2 S=64 A=8 G=2 (GQA) D=16 causal window 15"
    assert shape.flops() == 3 * flops.attention_core_flops(
        2, 8, 64, 16, mask="causal", window_size=(15, 0)
    )
    q, k, v = shape.make_inputs(device="cpu", dtype=torch.float32)
    assert q.shape == (2, 64, 8, 16) and k.shape == v.shape == (2, 64, 2, 16)
    assert q.requires_grad and q.dtype == torch.float32
    assert attention.AttentionShape(1, 8, 4, 8, groups=1).label.endswith("(MQA) D=8 causal")
    with pytest.raises(ValueError, match="groups=3: must divide heads=8"):
        attention.AttentionShape(1, 8, 8, 8, groups=3)


# --- the backend helper -------------------------------------------------------------------------

SMALL = attention.AttentionShape(1, 32, 2, 8)


def test_q_k_v_of_different_dtypes_or_devices_are_refused_by_name():
    attend = attention.explicit_attention
    q, k, v = qkv(2)
    with pytest.raises(TypeError, match="k has dtype torch.float32 and q torch.float64"):
        attend(q, k.float(), v)
    with pytest.raises(TypeError, match="v has dtype torch.bfloat16"):
        attend(q, k, v.bfloat16())
    with pytest.raises(ValueError, match="k is on meta and q on cpu"):
        attend(q, k.to("meta"), v)


@pytest.mark.parametrize(
    "call",
    [
        lambda device: SMALL.make_inputs(device=device),
        lambda device: attention.window_mask(8, device=device),
        lambda device: attention.copy_batches(8, 1, 4, 1, device=device),
    ],
    ids=["make_inputs", "window_mask", "copy_batches"],
)
def test_device_names_a_machine_cannot_serve_are_refused(call):
    with pytest.raises(ValueError, match="device='gpu'"):
        call("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda': this machine has no CUDA GPU"):
            call("cuda")
    with pytest.raises(TypeError, match="device=1.5"):
        call(1.5)


def test_the_package_shows_its_modules_names():
    for name in attention.__all__:
        value = getattr(attention, name)
        home = getattr(value, "__module__", "fp8lab.attention.")
        assert home.startswith("fp8lab.attention.") or not callable(value), (name, home)
    assert attention.te_selection_logs is attention.logs.te_selection_logs
    assert attention.explicit_attention is attention.functional.explicit_attention


@pytest.mark.parametrize(
    ("names", "family"),
    [
        (
            [
                "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1",
                "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_7",
            ],
            profiling.CUDNN,
        ),
        (
            ["void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>"],
            profiling.FLASH_TORCH,
        ),
        (
            ["flash_fwd_kernel<Flash_fwd_kernel_traits>", "flash_bwd_dot_do_o_kernel"],
            profiling.FLASH_PACKAGE,
        ),
        (
            ["fmha_cutlassF_bf16_aligned_64x64_rf_sm80(...)", "fmha_cutlassB_bf16"],
            profiling.EFFICIENT,
        ),
        (
            ["sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8", "cunn_SoftMaxForward<4>"],
            profiling.UNFUSED,
        ),
        (
            [
                "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT",
                "scaled_upper_triang_masked_softmax_warp_forward",
            ],
            profiling.UNFUSED,
        ),
        (["aten::bmm", "aten::_softmax"], profiling.UNFUSED),
        (["vectorized_elementwise_kernel"], profiling.OTHER),
        ([], profiling.OTHER),
    ],
)
def test_kernel_families(names, family):
    assert profiling.kernel_family(names) == family


def test_selection_logs_without_te_say_so():
    if attention.logs._uses_real_te():
        pytest.skip("TE runs here")
    logs = attention.te_selection_logs([{"shape": SMALL, "title": "small"}])
    assert logs[0].title == "small" and "needs Transformer Engine" in logs[0].error
    assert logs[0].summary() == ["-> needs Transformer Engine on a CUDA GPU"]


FAKE_TE = """
import contextlib, logging, os
from fp8lab.reference import DotProductAttention as _Reference

_log = logging.getLogger("DotProductAttention")
_handler = logging.StreamHandler()
_handler.setFormatter(logging.Formatter("[%(levelname)-8s | %(name)-19s]: %(message)s"))
_log.addHandler(_handler)
_log.setLevel(logging.DEBUG if os.environ.get("NVTE_DEBUG") == "1" else logging.WARNING)


class DotProductAttention(_Reference):
    def forward(self, q, k, v, **kwargs):
        _log.debug("Running with config={'max_seqlen_q': %d}", q.shape[1])
        if os.environ.get("NVTE_FUSED_ATTN") == "0":
            _log.debug("Disabling FusedAttention due to NVTE_FUSED_ATTN=0")
            _log.warning("flash-attn v4 may help. Please install flash-attn v4 by \\npip install x")
            _log.debug("Selected backend = UnfusedDotProductAttention.")
        else:
            _log.debug("Selected backend = FusedAttention (sub-backend 1).")
        return super().forward(q, k, v, **kwargs)


@contextlib.contextmanager
def autocast(recipe=None, **kwargs):
    if type(recipe).__name__ == "Float8CurrentScaling":
        raise ValueError("No dot product attention backend is available for the provided inputs.")
    yield
"""


def test_selection_logs_parse_what_a_fresh_process_prints(tmp_path, monkeypatch):
    """The child process and the parsing, with a stand-in for TE that logs as TE does."""
    package = tmp_path / "transformer_engine"
    (package / "pytorch").mkdir(parents=True)
    (package / "common").mkdir()
    (package / "__init__.py").write_text("")
    (package / "pytorch" / "__init__.py").write_text(FAKE_TE)
    selection = package / "pytorch" / "attention" / "dot_product_attention"
    selection.mkdir(parents=True)
    (package / "pytorch" / "attention" / "__init__.py").write_text("")
    (selection / "__init__.py").write_text("_attention_backends = {}\n")  # TE's cache
    (package / "common" / "__init__.py").write_text("")
    (package / "common" / "recipe.py").write_text("from fp8lab.reference.recipe import *\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setattr(attention.logs, "_uses_real_te", lambda: True)
    logs = attention.te_selection_logs(
        [
            {"shape": SMALL, "title": "default"},
            {"shape": SMALL, "env": {"NVTE_FUSED_ATTN": "0"}},
            {"shape": SMALL, "recipe": "current"},
        ]
    )
    assert [log.title for log in logs] == ["default", SMALL.label, SMALL.label]
    assert logs[0].selected == "FusedAttention (sub-backend 1)" and logs[0].error is None
    assert len(logs[0].summary()) == 1 and len(logs[0].summary(config=True)) == 2
    assert logs[1].selected == "UnfusedDotProductAttention"
    two_lines = [line for line in logs[1].lines if "pip install x" in line]
    assert len(two_lines) == 1 and "\n" in two_lines[0]  # one entry for a two-line message
    assert logs[2].error.startswith("ValueError: No dot product attention backend")
    assert "NVTE_FUSED_ATTN" not in os.environ


def test_a_recipe_is_named_not_passed():
    import fp8lab

    te, recipe = fp8lab.import_te()
    with pytest.raises(TypeError, match=r"\['recipe'\]=.* is the te module"):
        attention.te_selection_logs([{"shape": SMALL, "recipe": te}])
    with pytest.raises(TypeError, match="is the recipe module or a recipe: name the recipe"):
        attention.te_selection_logs([{"shape": SMALL, "recipe": recipe.DelayedScaling()}])


def test_selection_log_cases_are_checked():
    with pytest.raises(TypeError, match="shape"):
        attention.te_selection_logs([{"shape": "big"}])
    with pytest.raises(ValueError, match="recipe"):
        attention.te_selection_logs([{"shape": SMALL, "recipe": "mxfp8"}])


# --- on a GPU with TE ------------------------------------------------------------------------------


@pytest.mark.gpu
def test_selection_logs_from_a_fresh_process():
    shape = attention.AttentionShape(1, 512, 8, 64)
    logs = attention.te_selection_logs(
        [
            {"shape": shape},
            {"shape": shape, "recipe": "current"},
            {"shape": shape, "env": {"NVTE_FUSED_ATTN": "0"}},
        ]
    )
    assert logs[0].selected == "FusedAttention (sub-backend 1)", logs[0].lines
    assert "No dot product attention backend" in (logs[1].error or ""), logs[1]
    assert logs[2].selected == "UnfusedDotProductAttention", logs[2].lines


@pytest.mark.gpu
@pytest.mark.parametrize(("mask", "window"), [w for w in WINDOWS if w[0] != "causal_bottom_right"])
def test_reference_windows_match_te(mask, window):
    import fp8lab

    te, _ = fp8lab.import_te()
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 256, 4, 64, dtype=torch.bfloat16) for _ in range(3))
    reference = DotProductAttention(
        4, 64, qkv_format="bshd", attn_mask_type=mask, window_size=window
    )
    real = te.DotProductAttention(4, 64, qkv_format="bshd", attn_mask_type=mask, window_size=window)
    expected = reference(q.double(), k.double(), v.double())
    got = real(q.cuda(), k.cuda(), v.cuda()).double().cpu()
    assert ((got - expected).norm() / expected.norm()).item() < 1e-2


def test_the_config_dump_is_not_a_reason():
    log = attention.SelectionLog(
        "case",
        (
            "[DEBUG    | DotProductAttention]: Running with config={'flash_attn_version': "
            "'not installed', 'fp8': False}",
            "[DEBUG    | DotProductAttention]: Disabling FlashAttention as it is not installed",
            "[DEBUG    | DotProductAttention]: Selected backend = NoBackend",
        ),
    )
    assert log.first_reason() == "Disabling FlashAttention as it is not installed"
    assert log.first_reason("FusedAttention") == ""
    assert log.available == ""
    listed = attention.SelectionLog(
        "x", ("[DEBUG | x]: Available backends = {FlashAttention=False,\n FusedAttention=True}",)
    )
    assert listed.available == "Available backends = {FlashAttention=False, FusedAttention=True}"
