"""A pre-flight for readers: is this machine ready to run the book's chapters?

    python -m fp8lab.doctor               # one line per check: ok, WARN or FAIL
    python -m fp8lab.doctor --json        # the same report, machine-readable
    python -m fp8lab.doctor --skip-smoke  # the facts only, no GPU tests

The facts come from :func:`fp8lab.environment.detect`: Python, torch and its CUDA, the GPU, FP8
support (and TE's own ``is_fp8_available``), Transformer Engine, and the cuDNN libraries in the
process. On an FP8 GPU two smoke tests follow, a few seconds together: an FP8 GEMM
(``te.Linear``) against its BF16 result, and FP8 attention (``te.DotProductAttention``, causal)
called twice on one input and compared with an FP32 reference. The second catches the trap
:mod:`fp8lab.environment` describes: with two cuDNN versions in one process FP8 attention gives
wrong, nondeterministic answers while everything else looks fine.

Exit code 0 when nothing FAILs; 1 when something does (two cuDNNs in the process, TE missing on a
CUDA machine, a GPU that TE refuses FP8 on, an FP8 smoke test wrong or nondeterministic); 2 for
bad flags. Without a CUDA GPU it says what runs there instead (the CPU reference) and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from fp8lab import checks, environment

__all__ = ["Check", "main", "run_checks"]

OK, WARN, FAIL = "ok", "WARN", "FAIL"
STATUSES = (OK, WARN, FAIL)
MIN_PYTHON = (3, 10)
# Relative (Frobenius) error bounds of the smoke tests. E4M3 rounding alone gives about 4% for
# the GEMM and about 5% for the attention (H200, TE 2.20.2, one cuDNN); two cuDNNs in one process
# gave 20% to 40% on this attention, a different answer at each call.
GEMM_BOUND = 0.10
ATTENTION_BOUND = 0.10
GEMM_SHAPE = (2048, 1024, 1024)  # tokens, in features, out features
# 32 heads: with two cuDNNs (9.19 and 9.14) FP8 attention went wrong at 32 heads and stayed right
# at 16 (H200, TE 2.20.2), so the smoke test uses a shape that is known to show the trap.
ATTENTION_SHAPE = {"B": 2, "S": 512, "A": 32, "D": 128}
# What the chapters do without a CUDA GPU (the README's table "What each chapter needs").
CPU_LANE = (
    ("run fully, at smoke size", "00, 01, 02, 04"),
    (
        "run, GPU-only rows left empty",
        "03 (FP8 attention, CUDA graphs, torch.compile), 05 (FP8 attention), 06 (device memory)",
    ),
    (
        "run, and show committed GPU results beside their own",
        "07 (measured memory), 08 (two CPU processes; context parallelism and Userbuffers "
        "need GPUs), 09 (the long training runs and speed rounds)",
    ),
)


@dataclass(frozen=True)
class Check:
    """One line of the report: what was checked, ``ok``/``WARN``/``FAIL``, and what was found
    (with the fix, where something FAILs)."""

    name: str
    status: str
    detail: str

    def __post_init__(self):
        for field in ("name", "detail"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value.strip():
                raise TypeError(f"{field}={checks.show(value)}: must be a non-empty string")
        checks.choice("status", self.status, STATUSES)

    def line(self, width: int = 100) -> str:
        """The check as text for a terminal: status, name, and the detail wrapped under
        itself."""
        return _wrapped(f"{self.status:<4}  {self.name:<19}", self.detail, width)


def _wrapped(prefix: str, text: str, width: int = 100) -> str:
    return textwrap.fill(
        text,
        width=width,
        initial_indent=prefix + " ",
        subsequent_indent=" " * (len(prefix) + 1),
        break_long_words=False,
        break_on_hyphens=False,
    )


# --- the facts ------------------------------------------------------------------------------


def _python(env: environment.Environment, te: Any) -> Check:
    version = ".".join(str(part) for part in sys.version_info[:3])
    if sys.version_info[:2] < MIN_PYTHON:
        return Check("Python", FAIL, f"{version}: the book needs Python 3.10 or newer")
    return Check("Python", OK, version)


def _torch(env: environment.Environment, te: Any) -> Check:
    if env.cuda_available:
        return Check("torch", OK, f"{env.torch_version}, CUDA {env.cuda_version}")
    return Check("torch", OK, f"{env.torch_version}, no CUDA GPU visible")


def _gpu(env: environment.Environment, te: Any) -> Check:
    if not env.cuda_available:
        return Check("GPU", WARN, "none: the chapters run on the CPU, at smoke size")
    major, minor = env.compute_capability
    count = "" if env.gpu_count > 1 else "; chapter 08 shows its committed multi-GPU results"
    return Check(
        "GPU",
        OK,
        f"{env.gpu_count} x {env.gpu_name}, compute capability {major}.{minor}{count}",
    )


def _fp8(env: environment.Environment, te: Any) -> Check:
    if not env.cuda_available:
        return Check("FP8", WARN, "emulated on the CPU by the CPU reference (real FP8 casts)")
    if not env.fp8_supported:
        return Check("FP8", WARN, "no FP8 tensor cores (needs sm_89+: Ada, Hopper, Blackwell)")
    if te is None:
        return Check("FP8", OK, "FP8 tensor cores; TE not asked (TE is missing or unsafe here)")
    available, reason = te.is_fp8_available(return_reason=True)
    if not available:
        return Check("FP8", FAIL, f"the GPU has FP8 tensor cores but TE refuses FP8: {reason}")
    return Check("FP8", OK, "FP8 tensor cores; te.is_fp8_available() is True")


def _transformer_engine(env: environment.Environment, te: Any) -> Check:
    if env.uses_real_te:
        return Check("Transformer Engine", OK, env.te_version)
    if not env.cuda_available:
        return Check("Transformer Engine", OK, "CPU reference: TE's API in plain PyTorch")
    return Check(
        "Transformer Engine",
        FAIL,
        f"does not import ({env.te_problem}). Install it: pip install --no-build-isolation "
        "'transformer-engine[pytorch]', or use an NVIDIA PyTorch container",
    )


def _torch_cudnn_dir() -> str | None:
    """The folder of the cuDNN that PyTorch's wheel ships (the ``nvidia-cudnn`` package)."""
    try:
        spec = importlib.util.find_spec("nvidia.cudnn")
    except ImportError:
        return None
    locations = list(spec.submodule_search_locations or ()) if spec else []
    return locations[0] if locations else None


def _cudnn_facts(report: environment.CudnnReport) -> str:
    runtime = report.torch_runtime
    if runtime is not None and not runtime[:1].isdigit():  # torch's refusal, first sentence
        runtime = "refused (" + " ".join(runtime.split(". ")[0].split()) + ")"
    mapped = ", ".join(report.libraries) or "none"
    return (
        f"torch built with {report.torch_built}, torch runtime {runtime}, "
        f"TE loaded {report.te_loaded or 'none'}; mapped: {mapped}"
    )


def _cudnn(env: environment.Environment, te: Any) -> Check:
    if not env.cuda_available:
        return Check("cuDNN", OK, "not used (no CUDA GPU)")
    facts = _cudnn_facts(env.cudnn)
    if env.cudnn.problem is None:
        return Check("cuDNN", OK, facts)
    folder = _torch_cudnn_dir() or "<site-packages>/nvidia/cudnn"
    return Check(
        "cuDNN",
        FAIL,
        f"two cuDNN versions in one process: {facts}. TE looks for cuDNN in CUDNN_HOME, "
        "CUDNN_PATH, CUDA_HOME and the system's library path before PyTorch's own, and FP8 "
        f"attention is then wrong and nondeterministic. Fix: export CUDNN_HOME={folder} "
        f"CUDNN_PATH={folder} LD_LIBRARY_PATH={folder}/lib:$LD_LIBRARY_PATH (PyTorch's cuDNN) "
        "before starting Python (make doctor and make lab do), or remove the older system "
        "cuDNN",
    )


FACTS = (_python, _torch, _gpu, _fp8, _transformer_engine, _cudnn)


# --- the smoke tests --------------------------------------------------------------------------


def _relative_error(result: torch.Tensor, reference: torch.Tensor) -> float:
    reference = reference.float()
    return ((result.float() - reference).norm() / reference.norm()).item()


def _verdict(name: str, error: float, bound: float, extra: str = "") -> Check:
    status = OK if math.isfinite(error) and error < bound else FAIL
    return Check(name, status, f"relative error {error:.2%} (bound {bound:.0%}){extra}")


def _smoke_gemm(te: Any, recipe: Any) -> Check:
    """``te.Linear`` under FP8 delayed scaling against the same layer in BF16."""
    tokens, features_in, features_out = GEMM_SHAPE
    torch.manual_seed(0)
    layer = te.Linear(features_in, features_out, bias=False, params_dtype=torch.bfloat16)
    x = torch.randn(tokens, features_in, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):  # forwards with grad: delayed scaling records amaxes and sets its scales
        with te.autocast(recipe=recipe.DelayedScaling()):
            layer(x)
    with torch.no_grad():
        bf16 = layer(x)
        with te.autocast(recipe=recipe.DelayedScaling()):
            fp8 = layer(x)
    finite = bool(torch.isfinite(fp8).all())
    error = _relative_error(fp8, bf16) if finite else float("nan")
    return _verdict("FP8 GEMM", error, GEMM_BOUND, f", te.Linear {tokens}x{features_in}")


def _smoke_attention(te: Any, recipe: Any) -> Check:
    """``te.DotProductAttention`` in FP8 (``fp8_dpa``), causal: two identical calls must agree
    bit for bit, and both must be close to FP32 attention on the same inputs."""
    batch, seq, heads, head_dim = (ATTENTION_SHAPE[key] for key in "BSAD")
    torch.manual_seed(0)
    # q, k, v: [S, B, A, D], TE's default qkv_format "sbhd"
    q, k, v = (
        torch.randn(seq, batch, heads, head_dim, device="cuda", dtype=torch.bfloat16)
        for _ in range(3)
    )
    attention = te.DotProductAttention(heads, head_dim, attn_mask_type="causal")
    with torch.no_grad(), te.autocast(recipe=recipe.DelayedScaling(fp8_dpa=True)):
        first = attention(q, k, v)  # [S, B, A*D]
        second = attention(q, k, v)
    upcast = [t.float().permute(1, 2, 0, 3) for t in (q, k, v)]  # [B, A, S, D]
    exact = torch.nn.functional.scaled_dot_product_attention(*upcast, is_causal=True)
    exact = exact.permute(2, 0, 1, 3).reshape(seq, batch, heads * head_dim)  # [S, B, A*D]
    error = max(_relative_error(first, exact), _relative_error(second, exact))
    shape = f", B={batch} S={seq} A={heads} D={head_dim}"
    if not torch.equal(first, second):
        return Check(
            "FP8 attention",
            FAIL,
            f"nondeterministic: two identical calls differ (relative error up to {error:.2%})"
            f"{shape}; two cuDNN versions in the process are the known cause",
        )
    return _verdict("FP8 attention", error, ATTENTION_BOUND, f", deterministic{shape}")


SMOKE_TESTS = (("FP8 GEMM", _smoke_gemm), ("FP8 attention", _smoke_attention))


def _run_smoke(te: Any, recipe: Any) -> list[Check]:
    results = []
    for name, test in SMOKE_TESTS:
        start = time.perf_counter()
        try:
            check = test(te, recipe)
        except Exception as error:  # a smoke test reports whatever breaks, it does not crash
            first_line = f"{type(error).__name__}: {error}".splitlines()[0]
            check = Check(name, FAIL, f"raised {first_line}")
        seconds = time.perf_counter() - start
        results.append(Check(check.name, check.status, f"{check.detail}; {seconds:.1f}s"))
    return results


def _smoke_skipped(env: environment.Environment, te: Any, smoke: bool) -> str | None:
    """Why the smoke tests do not run here (``None`` when they do)."""
    if not smoke:
        return "skipped (--skip-smoke)"
    if not env.cuda_available:
        return "not run: no CUDA GPU"
    if not env.fp8_supported:
        return "not run: the GPU has no FP8 tensor cores"
    if te is None:
        return "not run: fix the FAIL lines above first"
    return None


# --- the report -------------------------------------------------------------------------------


def _real_te(env: environment.Environment) -> tuple[Any, Any]:
    """``(te, recipe)`` where real TE runs in a process with one cuDNN, else ``(None, None)``."""
    if not env.uses_real_te or env.cudnn.problem is not None:
        return None, None
    return environment.import_te()


def run_checks(smoke: bool = True) -> tuple[list[Check], str | None]:
    """Every check of this machine, in order, and why the smoke tests did not run (``None``
    when they ran). ``smoke=False`` leaves the GPU tests out."""
    checks.flag("smoke", smoke)
    env = environment.detect()
    te, recipe = _real_te(env)
    results = [fact(env, te) for fact in FACTS]
    if any(check.status == FAIL for check in results):
        te = None
    skipped = _smoke_skipped(env, te, smoke)
    if skipped is None:
        results += _run_smoke(te, recipe)
    return results, skipped


def _report(results: list[Check], skipped: str | None, cuda: bool) -> dict:
    failed = [check.name for check in results if check.status == FAIL]
    return {
        "checks": [asdict(check) for check in results],
        "smoke_tests": skipped or "ran",
        "runs_here": None if cuda else [{"what": what, "chapters": ch} for what, ch in CPU_LANE],
        "failed": failed,
        "exit_code": 1 if failed else 0,
    }


def _text(report: dict) -> str:
    lines = ["fp8lab doctor: is this machine ready for the book?", ""]
    lines += [Check(**check).line() for check in report["checks"]]
    if report["smoke_tests"] != "ran":
        lines.append(_wrapped(f"{'':4}  {'smoke tests':<19}", report["smoke_tests"]))
    if report["runs_here"]:
        lines += ["", "What runs here: every chapter, through the CPU reference of TE's API."]
        for row in report["runs_here"]:
            lines.append(_wrapped(" -", f"{row['what']}: {row['chapters']}"))
        lines.append("The rendered book shows every chapter's committed GPU outputs.")
    failed = report["failed"]
    warned = sum(check["status"] == WARN for check in report["checks"])
    verdict = (
        f"FAIL ({', '.join(failed)}): fix the lines marked FAIL before running the chapters"
        if failed
        else f"No FAIL ({warned} WARN): the chapters can run here"
    )
    return "\n".join([*lines, "", verdict])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fp8lab.doctor",
        description="Check that this machine can run the book: GPU, torch, Transformer Engine, "
        "cuDNN, and (on an FP8 GPU) an FP8 GEMM and FP8 attention.",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--skip-smoke", action="store_true", help="run no GPU tests")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Print the report; return 0 when nothing FAILs, 1 when something does (argparse exits
    with 2 on a bad flag). ``argv`` defaults to the command line."""
    if argv is not None and (
        not isinstance(argv, (list, tuple)) or not all(isinstance(arg, str) for arg in argv)
    ):
        raise TypeError(f"argv={checks.show(argv)}: must be a list of strings")
    options = _parser().parse_args(argv)
    results, skipped = run_checks(smoke=not options.skip_smoke)
    report = _report(results, skipped, environment.detect().cuda_available)
    print(json.dumps(report, indent=2) if options.json else _text(report))
    return report["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
