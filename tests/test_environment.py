import pytest

import fp8lab
from fp8lab import environment


def test_banner_names_gpu_torch_te_fp8_and_preset(monkeypatch):
    monkeypatch.setenv("FP8LAB_PRESET", "smoke")
    line = fp8lab.banner()
    env = fp8lab.detect()
    assert "\n" not in line
    assert f"torch {env.torch_version}" in line
    assert "preset: smoke" in line
    if env.cuda_available:
        assert env.gpu_name in line
    else:
        assert "CPU only" in line and "CPU reference" in line


@pytest.mark.parametrize(
    "value, expected", [("smoke", "smoke"), ("FULL", "full"), (" full ", "full")]
)
def test_preset_override(monkeypatch, value, expected):
    monkeypatch.setenv("FP8LAB_PRESET", value)
    assert fp8lab.preset() == expected
    assert fp8lab.by_preset(smoke=1, full=2) == (2 if expected == "full" else 1)


def test_preset_default_follows_cuda(monkeypatch):
    monkeypatch.delenv("FP8LAB_PRESET", raising=False)
    assert fp8lab.preset() == ("full" if fp8lab.detect().cuda_available else "smoke")


def test_unknown_preset_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("FP8LAB_PRESET", "huge")
    with pytest.raises(ValueError, match="FP8LAB_PRESET='huge'.*smoke, full"):
        fp8lab.preset()


@pytest.mark.parametrize(
    "capability, supported",
    [
        ((8, 0), False),
        ((8, 6), False),
        ((8, 9), True),
        ((9, 0), True),
        ((10, 0), True),
        (None, False),
    ],
)
def test_fp8_support_starts_at_sm89(capability, supported):
    env = environment.Environment(
        "2.x",
        capability is not None,
        "GPU" if capability else None,
        1 if capability else 0,
        capability,
        None,
        None,
    )
    assert env.fp8_supported is supported


def test_import_te_on_a_gpu_without_te_refuses(monkeypatch):
    fake = environment.Environment(
        "2.x", True, "NVIDIA H200", 1, (9, 0), None, "ImportError: no TE"
    )
    monkeypatch.setattr(environment, "detect", lambda: fake)
    with pytest.raises(RuntimeError, match="Transformer Engine does not import"):
        environment.import_te()


SYSTEM_CUDNN = "/usr/lib/x86_64-linux-gnu/libcudnn.so.9.14.0"
TORCH_CUDNN = "/site-packages/nvidia/cudnn/lib/libcudnn.so.9"
REFUSAL = "cuDNN version incompatibility: PyTorch was compiled against (9, 19, 0) but found 9.14"


@pytest.mark.parametrize(
    "report, problem",
    [
        (environment.CudnnReport(None, None, None), None),
        (environment.CudnnReport("9.19.0", "9.19.0", "9.19.0", (TORCH_CUDNN,)), None),
        (environment.CudnnReport("9.19.0", "9.19.0", None, (TORCH_CUDNN,)), None),
        (
            environment.CudnnReport("9.19.0", "9.19.0", "9.19.0", (TORCH_CUDNN, SYSTEM_CUDNN)),
            f"two cuDNN libraries are mapped: {TORCH_CUDNN}, {SYSTEM_CUDNN}",
        ),
        (environment.CudnnReport("9.19.0", REFUSAL, "9.14.0", (SYSTEM_CUDNN,)), REFUSAL),
        (
            environment.CudnnReport("9.19.0", "9.19.0", "9.14.0"),
            "TE calls cuDNN 9.14.0, torch 9.19.0",
        ),
    ],
)
def test_cudnn_problem_names_what_is_mixed(report, problem):
    assert report.problem == problem


@pytest.mark.parametrize(
    "report, shown",
    [
        (environment.CudnnReport(None, None, None), "none"),
        (environment.CudnnReport("9.19.0", "9.19.0", "9.19.0", (TORCH_CUDNN,)), "9.19.0"),
        (environment.CudnnReport("9.19.0", "9.19.0", None), "9.19.0"),
        (
            environment.CudnnReport("9.19.0", "9.20.0", "9.20.0"),
            "9.20.0 (torch built with 9.19.0)",
        ),
        (
            environment.CudnnReport("9.19.0", REFUSAL, "9.14.0", (TORCH_CUDNN, SYSTEM_CUDNN)),
            "9.14.0 (torch built with 9.19.0) MIXED",
        ),
    ],
)
def test_cudnn_describe_shows_what_te_calls(report, shown):
    assert report.describe() == shown


def _mixed_gpu():
    mixed = environment.CudnnReport("9.19.0", REFUSAL, "9.14.0", (TORCH_CUDNN, SYSTEM_CUDNN))
    return environment.Environment(
        "2.11.0", True, "NVIDIA H100", 1, (9, 0), "2.20.2", None, "13.0", mixed
    )


def test_import_te_refuses_a_process_with_two_cudnns(monkeypatch):
    fake = _mixed_gpu()
    monkeypatch.setattr(environment, "detect", lambda: fake)
    assert fake.uses_real_te
    with pytest.raises(RuntimeError, match="Two cuDNN versions in one process") as refused:
        environment.import_te()
    assert SYSTEM_CUDNN in str(refused.value) and "CUDNN_HOME" in str(refused.value)


def test_require_one_cudnn_passes_one_and_refuses_two():
    one = environment.CudnnReport("9.19.0", "9.19.0", "9.19.0", (TORCH_CUDNN,))
    healthy = environment.Environment(
        "2.11.0", True, "NVIDIA H100", 1, (9, 0), "2.20.2", None, "13.0", one
    )
    assert environment.require_one_cudnn(healthy) is None
    with pytest.raises(RuntimeError, match="python -m fp8lab.doctor"):
        environment.require_one_cudnn(_mixed_gpu())


def test_the_banner_marks_a_mixed_cudnn(monkeypatch):
    monkeypatch.setattr(environment, "detect", _mixed_gpu)
    monkeypatch.setenv("FP8LAB_PRESET", "smoke")
    assert "cuDNN 9.14.0 (torch built with 9.19.0) MIXED" in environment.banner()
