"""Where a step's time goes: the profiler breakdown."""

import warnings

import pytest
import torch

from fp8lab import profiling


def test_time_breakdown_is_silent_and_its_shares_add_up():
    """A chapter prints this table: the profiler must not leave a warning beside it (torch
    2.10-2.11 warned about clearing events between cycles even with a single cycle)."""
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        by_category, by_kernel = profiling.time_breakdown(lambda: (a @ b).relu(), iters=3)
    assert by_category["share"].sum() == pytest.approx(1.0)
    assert "GEMM" in by_category.index
    assert set(by_kernel["category"]) <= {name for name, _ in profiling.CATEGORIES} | {
        profiling.OTHER
    }


@pytest.mark.parametrize(
    ("name", "category"),
    [
        (
            "void multi_tensor_apply_kernel<TensorListMetadata<5>, AdamFunctorMaster<fp8>>",
            "optimizer",
        ),
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "attention"),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "GEMM"),
        ("transformer_engine::cast_fp8_kernel", "FP8 cast / amax / transpose"),
        ("something_unheard_of", "other"),
    ],
)
def test_categorize_reads_the_optimizer_first(name, category):
    assert profiling.categorize(name) == category


def test_union_length_counts_overlaps_once():
    assert profiling.union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert profiling.union_length([]) == 0


def test_a_profile_accounts_for_its_span():
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    result = profiling.profile(lambda: (a @ b).relu(), warmup=1, iters=3)
    assert 0 < result.busy_ms <= result.span_ms
    assert 0 <= result.idle_fraction < 1
    table = result.by_category(idle=True)
    assert table["ms per step"].sum() == pytest.approx(
        result.kernel_ms + result.span_ms - result.busy_ms
    )
