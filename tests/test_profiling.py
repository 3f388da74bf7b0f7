"""Where a step's time goes: the profiler breakdown."""

import json
import warnings
from pathlib import Path

import pytest
import torch

from fp8lab import profiling

ROOT = Path(__file__).resolve().parent.parent


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


# Kernel names of chapter 08's committed two-GPU timeline (notebooks/results/
# 08_parallelism_2gpu.json keeps each name's first 80 characters), completed the way the profiler
# reports them: PyTorch's demangled element-wise kernels carry their lambdas ("{lambda(float)#1}"),
# TE's multi-tensor kernels their functor (transformer_engine/common/multi_tensor/adam.cu).
COMMITTED = {
    "multi_tensor_te": "void multi_tensor_apply_kernel<TensorListMetadata<5, false>, transformer_engine:",
    "mse": "void at::native::vectorized_elementwise_kernel<4, at::native::mse_kernel_cuda(at",
    "copy": "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda",
    "bf16_copy": "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kern",
    "nocast": "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<a",
    "reduce": "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16, at::n",
}
OPTIMIZER_KERNELS = [
    COMMITTED["multi_tensor_te"]
    + ":multi_tensor_adam::AdamFunctorMaster<__nv_bfloat16, __nv_bfloat16, float, float, long>, "
    "float, float, float, float, float, float, transformer_engine::multi_tensor_adam::adamMode_t, "
    "float>(long, int volatile*, TensorListMetadata<5, false>&, ...)",
    "void multi_tensor_apply_kernel<TensorListMetadata<4, false>, transformer_engine::"
    "multi_tensor_adam::AdamFunctor<float, float, float, float, long>, ...>(...)",
    "void at::native::(anonymous namespace)::multi_tensor_apply_for_fused_optimizer<4, "
    "at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, "
    "false>, double, double, double, double, double, bool, float const*, float const*>(...)",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
    "namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor"
    "<float, 2, 2, 0>, std::plus<float>, float>(...)",  # foreach AdamW's adds
    "Optimizer.step#AdamW.step",
    "aten::_fused_adamw_",
    "aten::_foreach_addcdiv_",
    "void multi_tensor_apply_kernel<TensorListMetadata<3>, transformer_engine::multi_tensor_sgd::"
    "SGDFunctor<float, float>, ...>(...)",
]
NOT_OPTIMIZER_KERNELS = {
    "void at::native::vectorized_elementwise_kernel<4, at::native::mse_kernel_cuda(at::"
    "TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::"
    "{lambda(float, float)#1}, std::array<char*, 3ul> >(int, ...)": "element-wise",
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::"
    "TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::"
    "{lambda(float)#1}, std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, unsigned int>, "
    "TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, "
    "at::native::memory::StoreWithCast<1> >(int, ...)": "element-wise",
    "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at::"
    "TensorIteratorBase&)::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, ...)": (
        "element-wise"
    ),
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
    "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::"
    "{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, ...)"
    "::{lambda(int)#1}>(int, ...)": "element-wise",
    "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16, at::native::"
    "func_wrapper_t<c10::BFloat16, at::native::sum_functor<c10::BFloat16, float, c10::BFloat16>"
    "::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, c10::BFloat16, 4"
    ", 4> >(...)": "element-wise",
    "cast_transpose_optimized_kernel(__nv_bfloat16 const*, float const*, __nv_fp8_e4m3*, "
    "__nv_fp8_e4m3*, float*, float*, unsigned long, unsigned long)": "FP8 cast",
}


@pytest.mark.parametrize("name", OPTIMIZER_KERNELS, ids=lambda n: n[:40])
def test_optimizer_kernels_of_te_and_torch_are_the_optimizer(name):
    assert profiling.categorize(name) == "optimizer"


@pytest.mark.parametrize("name", sorted(NOT_OPTIMIZER_KERNELS), ids=lambda n: n[:60])
def test_a_lambda_in_a_kernel_name_is_not_lamb(name):
    """PyTorch's element-wise kernels name their lambdas; "lamb" inside "{lambda" once put the
    MSE loss and every copy of chapter 08's step under "optimizer"."""
    category = profiling.categorize(name)
    assert category != "optimizer" and category.startswith(NOT_OPTIMIZER_KERNELS[name])


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_the_committed_prefixes_fall_where_their_kernels_do(name):
    """The first 80 characters the result file keeps already decide the class."""
    category = profiling.categorize(COMMITTED[name])
    assert (category == "optimizer") == (name == "multi_tensor_te"), category


def test_every_kernel_of_the_committed_timeline_is_classed_by_what_it_runs():
    """Over chapter 08's committed two-GPU timeline: the optimizer is exactly TE's multi-tensor
    kernels (FusedAdam), whatever the file recorded when it was made."""
    path = ROOT / "notebooks" / "results" / "08_parallelism_2gpu.json"
    rows = json.loads(path.read_text())["results"]["timeline"]["data"]["rows"]
    names = {event["name"] for row in rows for event in row["events"]}
    assert any("mse_kernel_cuda" in n for n in names)  # the loss and the copies are there
    assert any("direct_copy_kernel_cuda" in n for n in names)
    for name in names:
        is_update = name.startswith("void multi_tensor_apply_kernel")
        assert (profiling.categorize(name) == "optimizer") == is_update, name


def test_optimizer_words_stand_alone():
    """A word boundary on each side, case-aware: no optimizer inside other words."""
    for name in ("Adamant_kernel", "lambdas", "isgdx", "optimized_kernel", "{lambda(int)#1}"):
        assert profiling.categorize(name) != "optimizer", name
    for name in ("sgd_step", "adamw_update", "FusedSgdMathFunctor", "LAMBStage1Functor"):
        assert profiling.categorize(name) == "optimizer", name


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
