"""The readers' pre-flight, ``python -m fp8lab.doctor``: what it prints here, and its verdicts on
machines described by fake environments (two cuDNNs, TE missing on a CUDA GPU)."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from fp8lab import doctor, environment

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU lane's report")
SYSTEM_CUDNN = "/usr/lib/x86_64-linux-gnu/libcudnn.so.9.14.0"
TORCH_CUDNN = "/site-packages/nvidia/cudnn/lib/libcudnn.so.9"
MIXED = environment.CudnnReport(
    "9.19.0",
    "cuDNN version incompatibility: PyTorch was compiled  against (9, 19, 0) but found runtime "
    "version (9, 14, 0). PyTorch already comes bundled with cuDNN.",
    "9.14.0",
    (TORCH_CUDNN, SYSTEM_CUDNN),
)
ONE = environment.CudnnReport("9.19.0", "9.19.0", "9.19.0", (TORCH_CUDNN,))


def _gpu(te_version="2.20.2", te_problem=None, cudnn=ONE, capability=(9, 0)):
    return environment.Environment(
        "2.11.0",
        True,
        "NVIDIA H100 80GB HBM3",
        1,
        capability,
        te_version,
        te_problem,
        "13.0",
        cudnn,
    )


def _doctor(*flags):
    return subprocess.run(
        [sys.executable, "-m", "fp8lab.doctor", *flags], capture_output=True, text=True
    )


def _by_name(results):
    return {check.name: check for check in results}


@pytest.fixture
def machine(monkeypatch):
    """Make ``environment.detect`` describe a fake machine; TE itself is a stub whose
    ``is_fp8_available`` says yes, and whose smoke tests are never reached unless asked."""

    def use(env):
        monkeypatch.setattr(environment, "detect", lambda: env)
        fake_te = SimpleNamespace(is_fp8_available=lambda return_reason: (True, ""))
        monkeypatch.setattr(environment, "import_te", lambda: (fake_te, SimpleNamespace()))
        return env

    return use


@CPU_ONLY
def test_the_cpu_lane_report_says_what_runs_here():
    done = _doctor()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CPU reference" in done.stdout
    assert "What runs here" in done.stdout and "09" in done.stdout
    lines = done.stdout.splitlines()
    assert not any(line.startswith("FAIL") for line in lines) and "Traceback" not in done.stderr
    for name in ("Python", "torch", "GPU", "FP8", "Transformer Engine", "cuDNN"):
        assert any(line[6:].startswith(name) for line in lines), name


@CPU_ONLY
def test_the_cpu_lane_report_as_json():
    done = _doctor("--json", "--skip-smoke")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["exit_code"] == 0 and report["failed"] == []
    assert {check["status"] for check in report["checks"]} <= {"ok", "WARN"}
    assert report["smoke_tests"] == "skipped (--skip-smoke)"
    assert any("CPU reference" in check["detail"] for check in report["checks"])
    assert len(report["runs_here"]) == len(doctor.CPU_LANE)


def test_a_bad_flag_is_refused_by_argparse():
    done = _doctor("--smoke-only")
    assert done.returncode == 2
    assert "usage:" in done.stderr and "--smoke-only" in done.stderr
    assert "Traceback" not in done.stderr


def test_two_cudnns_in_one_process_fail_with_the_fix(machine, capsys):
    machine(_gpu(cudnn=MIXED))
    results, skipped = doctor.run_checks()
    cudnn = _by_name(results)["cuDNN"]
    assert cudnn.status == doctor.FAIL
    assert SYSTEM_CUDNN in cudnn.detail and "CUDNN_HOME=" in cudnn.detail
    assert "refused (cuDNN version incompatibility" in cudnn.detail
    assert "FP8 GEMM" not in _by_name(results) and "fix the FAIL" in skipped
    assert doctor.main([]) == 1
    assert "FAIL  cuDNN" in capsys.readouterr().out


def test_te_missing_on_a_cuda_machine_fails(machine, capsys):
    machine(_gpu(te_version=None, te_problem="ImportError: libtransformer_engine.so"))
    results, _ = doctor.run_checks(smoke=False)
    te = _by_name(results)["Transformer Engine"]
    assert te.status == doctor.FAIL and "libtransformer_engine" in te.detail
    assert "pip install" in te.detail
    assert doctor.main(["--json"]) == 1
    assert json.loads(capsys.readouterr().out)["failed"] == ["Transformer Engine"]


def test_a_healthy_gpu_without_smoke_tests_passes(machine, capsys):
    machine(_gpu())
    results, skipped = doctor.run_checks(smoke=False)
    assert all(check.status == doctor.OK for check in results), results
    assert skipped == "skipped (--skip-smoke)"
    assert doctor.main(["--skip-smoke"]) == 0
    out = capsys.readouterr().out
    assert "9.19.0" in out and "What runs here" not in out


def test_a_gpu_without_fp8_warns_and_runs_no_smoke_test(machine):
    machine(_gpu(capability=(8, 0)))
    results, skipped = doctor.run_checks()
    assert _by_name(results)["FP8"].status == doctor.WARN
    assert "no FP8 tensor cores" in skipped


def test_smoke_test_failures_are_reported_not_raised(machine, monkeypatch):
    machine(_gpu())

    def wrong(te, recipe):
        return doctor._verdict("FP8 GEMM", 0.4, doctor.GEMM_BOUND)

    def broken(te, recipe):
        raise RuntimeError("no fused attention backend\nsecond line")

    monkeypatch.setattr(doctor, "SMOKE_TESTS", (("FP8 GEMM", wrong), ("FP8 attention", broken)))
    found = _by_name(doctor.run_checks()[0])
    assert found["FP8 GEMM"].status == doctor.FAIL and "40.00%" in found["FP8 GEMM"].detail
    attention = found["FP8 attention"]
    assert attention.status == doctor.FAIL and "no fused attention backend" in attention.detail
    assert "second line" not in attention.detail
    assert doctor.main([]) == 1


@pytest.mark.parametrize("error, status", [(0.05, "ok"), (0.2, "FAIL"), (float("nan"), "FAIL")])
def test_a_verdict_needs_a_finite_error_under_its_bound(error, status):
    assert doctor._verdict("FP8 GEMM", error, 0.1).status == status


def test_a_check_refuses_an_unknown_status():
    with pytest.raises(ValueError, match="status='fine'"):
        doctor.Check("GPU", "fine", "H100")
    with pytest.raises(TypeError, match="detail"):
        doctor.Check("GPU", "ok", "")


@pytest.mark.gpu
def test_the_doctor_passes_on_a_gpu_box():
    done = _doctor()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok    FP8 GEMM" in done.stdout and "ok    FP8 attention" in done.stdout
    assert "deterministic" in done.stdout
