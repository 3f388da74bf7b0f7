"""The datasheet (pure data), the measured ceilings and the roofline arithmetic."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8lab import ceilings, datasheet, roofline


@pytest.mark.parametrize(
    "name, expected",
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("h200", "H200"),
        ("NVIDIA B200", "B200"),
    ],
)
def test_lookup_by_the_name_torch_reports(name, expected):
    assert datasheet.gpu_spec(name).name == expected


def test_unknown_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="name='NVIDIA Z9000': no datasheet entry.*known: .*H200"):
        datasheet.gpu_spec("NVIDIA Z9000")
    with pytest.raises(TypeError, match="name=42"):
        datasheet.gpu_spec(42)


def test_every_entry_is_internally_consistent():
    """FP8 tensor cores exist exactly from sm_89 and double the BF16 rate; TF32 is half of BF16 on
    data-centre parts; the ridge point follows from peak and bandwidth."""
    for spec in datasheet.DATASHEET:
        if spec.fp8_tflops is None:
            assert spec.compute_capability < (8, 9), spec.name
            with pytest.raises(ValueError, match="no FP8 tensor cores"):
                spec.peak_tflops("fp8")
        else:
            assert spec.compute_capability >= (8, 9), spec.name
            assert spec.fp8_tflops == pytest.approx(2 * spec.bf16_tflops, rel=0.02), spec.name
        assert spec.ridge_point("bf16") == spec.bf16_tflops * 1e12 / (spec.bandwidth_gbs * 1e9)
        assert spec.memory_bytes == spec.memory_gb * 1e9


def test_h200_differs_from_h100_only_in_memory():
    """The H200 datasheet: the H100 SXM's tensor cores with 141 GB of HBM3e at 4.8 TB/s."""
    h100, h200 = datasheet.gpu_spec("H100 SXM"), datasheet.gpu_spec("H200")
    for dtype in datasheet.DTYPES:
        assert h100.peak_tflops(dtype) == h200.peak_tflops(dtype)
    assert (h200.memory_gb, h200.bandwidth_gbs) == (141, 4800)
    assert h200.ridge_point("fp8") == pytest.approx(2 * h200.ridge_point("bf16"), rel=1e-3)


def test_dtype_names_and_torch_dtypes_agree():
    spec = datasheet.gpu_spec("H200")
    assert spec.peak_tflops(torch.bfloat16) == spec.peak_tflops("bf16") == spec.peak_tflops("BF16")
    assert spec.peak_tflops(torch.float8_e4m3fn) == spec.peak_tflops("fp8")
    with pytest.raises(ValueError, match="dtype='int4'"):
        spec.peak_tflops("int4")
    with pytest.raises(TypeError, match="dtype=3"):
        spec.peak_tflops(3)


def test_table_has_every_gpu_and_refuses_unknown_columns():
    table = datasheet.datasheet_table()
    assert list(table.index) == [spec.name for spec in datasheet.DATASHEET]
    assert list(datasheet.datasheet_table(("bf16_tflops",)).columns) == ["bf16_tflops"]
    with pytest.raises(ValueError, match="unknown"):
        datasheet.datasheet_table(("tflops",))


@pytest.mark.parametrize("dtype", ["bf16", "fp8", "fp32"])
def test_a_measured_product_reports_its_own_rate_and_bytes(dtype):
    result = ceilings.measure_matmul(64, 32, 48, dtype, warmup=1, iters=3)
    assert result.flops == 2 * 64 * 32 * 48
    assert result.tflops == pytest.approx(result.flops / (result.timing.median_ms * 1e-3) / 1e12)
    in_size = {"bf16": 2, "fp8": 1, "fp32": 4}[dtype]
    out_size = 4 if dtype == "fp32" else 2
    assert result.bytes_moved == in_size * (64 * 48 + 48 * 32) + out_size * 64 * 32
    assert result.intensity == result.flops / result.bytes_moved


def test_products_and_copies_refuse_what_they_cannot_time():
    with pytest.raises(ValueError, match="layout='nn'"):
        ceilings.measure_matmul(32, 16, 16, "fp8", layout="nn")
    with pytest.raises(ValueError, match="layout='tt'"):
        ceilings.measure_matmul(32, 16, 16, layout="tt")
    with pytest.raises(ValueError, match="m=0"):
        ceilings.measure_matmul(0, 16, 16)
    with pytest.raises(ValueError, match="divisible by 16"):
        ceilings.measure_matmul(16, 16, 24, "fp8")
    with pytest.raises(ValueError, match="fast_accumulation=True applies to FP8"):
        ceilings.measure_matmul(16, 16, 16, "bf16", fast_accumulation=True)
    with pytest.raises(ValueError, match="copy_bytes=0"):
        ceilings.measure_ceilings(copy_bytes=0)
    with pytest.raises(ValueError, match="nbytes=-1"):
        ceilings.measure_copy_bandwidth(-1)
    with pytest.raises(ValueError, match="device='gpu'"):
        ceilings.measure_matmul(16, 16, 16, device="gpu")


def test_copy_bandwidth_counts_read_and_write():
    result = ceilings.measure_copy_bandwidth(1 << 20, warmup=1, iters=3)
    assert result.gbs == pytest.approx(2 * (1 << 20) / (result.timing.median_ms * 1e-3) / 1e9)


def test_roofline_ridge_and_attainable_rate():
    assert roofline.ridge_point(1000, 4000) == 250
    assert roofline.attainable_tflops(100, 1000, 4000) == 400  # memory-bound: 100 FLOP/B x 4 TB/s
    assert roofline.attainable_tflops(1000, 1000, 4000) == 1000  # compute-bound
    with pytest.raises(ValueError, match="bandwidth_gbs=nan"):
        roofline.ridge_point(1000, float("nan"))


def _plot(points, **kwargs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    try:
        roofline.plot_roofline(ax, [roofline.Roof("r", 100.0, 1000.0)], points, **kwargs)
        return [len(c.get_offsets()) for c in ax.collections]
    finally:
        plt.close(fig)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(intensities=st.integers(0, 5), rates=st.integers(0, 5), labels=st.integers(0, 5))
def test_plot_roofline_wants_one_point_per_intensity(intensities, rates, labels):
    """Property: as many intensities as rates (and labels), else a ValueError naming the series
    and the counts, before matplotlib sees them."""
    points = {"bf16": ([10.0] * intensities, [1.0] * rates, ["p"] * labels)}
    if intensities == rates == labels:
        assert _plot(points, label_points=True) == [intensities]
        return
    with pytest.raises(ValueError, match=rf"points\['bf16'\]: one point per intensity, not "
                       rf"{intensities} intensities, {rates} tflops"):  # fmt: skip
        _plot(points)


@pytest.mark.parametrize(
    "values, message",
    [
        (([1.0, 2.0, 3.0], [1.0, 2.0]), "not 3 intensities, 2 tflops"),
        (([1.0], [0.0]), r"tflops\[0\]=0.0: must be a finite number > 0"),
        (([-1.0], [1.0]), r"intensities\[0\]=-1.0: must be a finite number > 0"),
        (([1.0], [float("inf")]), r"tflops\[0\]=inf"),
    ],
)
def test_plot_roofline_names_the_bad_series(values, message):
    with pytest.raises(ValueError, match=message):
        _plot({"fp8": values})
    with pytest.raises(TypeError, match=r"points\['fp8'\] intensities=5.0: must be a sequence"):
        _plot({"fp8": (5.0, [1.0])})
    with pytest.raises(TypeError, match="label_points"):
        _plot({"fp8": ([1.0], [1.0])}, label_points="yes")


def test_plot_roofline_accepts_an_unmeasured_point():
    """NaN is a point not measured (a chapter's table cell without a measurement): accepted,
    and matplotlib leaves it out of the picture."""
    assert _plot({"fp8": ([1.0, 2.0], [float("nan"), 3.0])}) == [2]
