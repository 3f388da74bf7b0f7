import pytest
import torch

from fp8lab import hardware


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB"),
    ("NVIDIA L40S", "L40S"), ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("h200", "H200"), ("NVIDIA B200", "B200"),
])
def test_lookup_by_reported_name(name, expected):
    assert hardware.gpu_spec(name).name == expected


def test_unknown_gpu_is_a_clear_error():
    with pytest.raises(KeyError, match="unknown GPU 'NVIDIA Z9000'.*known: .*H200.*measure_ceilings"):
        hardware.gpu_spec("NVIDIA Z9000")
    with pytest.raises(TypeError, match="name must be"):
        hardware.gpu_spec(42)


def test_datasheet_peaks_are_dense_and_consistent():
    h100, h200 = hardware.gpu_spec("H100 SXM"), hardware.gpu_spec("H200")
    assert h200.bf16_tflops == h100.bf16_tflops == 989.4
    assert h200.bandwidth_gbs == 4800 and h200.memory_gb == 141
    for spec in hardware.DATASHEET:
        if spec.fp8_tflops is not None:
            assert spec.fp8_tflops == pytest.approx(2 * spec.bf16_tflops, rel=0.02), spec.name
            assert spec.compute_capability >= (8, 9)
        else:
            assert spec.compute_capability < (8, 9)
    assert hardware.gpu_spec("H200").ridge_point_bf16 == pytest.approx(206, abs=1)


def test_peak_by_dtype_and_missing_fp8():
    spec = hardware.gpu_spec("H200")
    assert spec.peak_tflops(torch.bfloat16) == spec.peak_tflops("bf16") == 989.4
    assert spec.peak_tflops("fp8") == 1978.9
    with pytest.raises(ValueError, match="no FP8 tensor cores"):
        hardware.gpu_spec("A100 SXM4 80GB").peak_tflops("fp8")
    with pytest.raises(ValueError, match="dtype='int4'"):
        spec.peak_tflops("int4")


def test_table_has_every_gpu():
    table = hardware.datasheet_table()
    assert len(table) == len(hardware.DATASHEET)
    assert table.loc["H200", "fp8_tflops"] == 1978.9


@pytest.mark.parametrize("dtype", ["bf16", "fp8", "fp32"])
def test_measured_matmul_on_this_machine(dtype):
    result = hardware.measure_matmul(64, 32, 48, dtype, warmup=1, iters=3)
    assert result.flops == 2 * 64 * 32 * 48
    assert result.tflops > 0 and result.timing.iters == 3
    in_size = {"bf16": 2, "fp8": 1, "fp32": 4}[dtype]
    out_size = 4 if dtype == "fp32" else 2
    assert result.bytes_moved == in_size * (64 * 48 + 48 * 32) + out_size * 64 * 32


def test_nn_layout_for_16_bit_only():
    assert hardware.measure_matmul(32, 16, 16, "bf16", layout="nn", warmup=0, iters=1).tflops > 0
    with pytest.raises(ValueError, match="layout='tn'"):
        hardware.measure_matmul(32, 16, 16, "fp8", layout="nn")
    with pytest.raises(ValueError, match="layout='tt'"):
        hardware.measure_matmul(32, 16, 16, layout="tt")


def test_matmul_bad_sizes():
    with pytest.raises(ValueError, match="m=0"):
        hardware.measure_matmul(0, 16, 16)
    with pytest.raises(ValueError, match="divisible by 16"):
        hardware.measure_matmul(16, 16, 24, "fp8")


def test_copy_bandwidth_counts_read_and_write():
    result = hardware.measure_copy_bandwidth(1 << 20, warmup=1, iters=3)
    assert result.gbs == pytest.approx(2 * (1 << 20) / (result.timing.median_ms * 1e-3) / 1e9)
    with pytest.raises(ValueError, match="nbytes=-1"):
        hardware.measure_copy_bandwidth(-1)
