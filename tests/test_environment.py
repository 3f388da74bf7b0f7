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
