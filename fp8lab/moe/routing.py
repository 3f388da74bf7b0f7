"""Token counts per expert, and launching the expert-parallel exchange on two processes.

:func:`skewed_counts` gives the rows each expert receives in the speed sweep: balanced, or
skewed by a power law so that the busiest expert gets ``imbalance`` times the mean -- what a
router that favours a few experts does to ``GroupedLinear``'s GEMMs.

:func:`run_functions` runs functions a notebook defined (their source, read with
``inspect``) in ``nproc`` processes under ``torchrun``: NCCL on GPUs when there are enough
of them, gloo on CPU processes otherwise, with NVLink multicast off as in chapter 08
(:func:`fp8lab.distributed.worker_environment`). The functions stay in the notebook, where
the reader sees them; this module only writes them to a temporary script and starts it.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

from fp8lab import checks

__all__ = ["run_functions", "skewed_counts"]

RESULT_MARK = "FP8LAB-RESULT "


def _power_weights(experts: int, exponent: float) -> list[float]:
    return [(e + 1) ** -exponent for e in range(experts)]


def skewed_counts(rows: int, experts: int, imbalance: float = 1.0) -> list[int]:
    """``experts`` non-negative counts summing to ``rows``, the largest ``imbalance`` times
    their mean (1.0: as even as integers allow; at most ``experts``: one expert takes all)."""
    rows = checks.integer("rows", rows, minimum=0)
    experts = checks.integer("experts", experts)
    imbalance = checks.number("imbalance", imbalance, positive=True)
    if not 1.0 <= imbalance <= experts:
        raise ValueError(f"imbalance={imbalance}: must be between 1 and experts={experts}")
    low, high = 0.0, 60.0  # the power law's exponent, found by bisection
    for _ in range(100):
        middle = (low + high) / 2
        weights = _power_weights(experts, middle)
        ratio = max(weights) * experts / sum(weights)
        low, high = (middle, high) if ratio < imbalance else (low, middle)
    weights = _power_weights(experts, (low + high) / 2)
    shares = [w / sum(weights) * rows for w in weights]
    counts = [int(s) for s in shares]
    by_remainder = sorted(range(experts), key=lambda e: counts[e] - shares[e])
    for e in by_remainder[: rows - sum(counts)]:
        counts[e] += 1
    return counts


def _results(stdout: str) -> list[dict]:
    """Every JSON object printed after :data:`RESULT_MARK` (two ranks may share a line)."""
    decoder, found, start = json.JSONDecoder(), [], stdout.find(RESULT_MARK)
    while start >= 0:
        obj, end = decoder.raw_decode(stdout, start + len(RESULT_MARK))
        found.append(obj)
        start = stdout.find(RESULT_MARK, end)
    return found


def run_functions(functions: Sequence[Callable], main: str, nproc: int = 2,
                  use_gpus: bool = False, timeout_s: float = 300.0) -> list[dict]:
    """Run ``main`` (a call such as ``"worker()"``) after the source of ``functions`` in
    ``nproc`` processes under ``torchrun``; each process prints ``RESULT_MARK`` and a JSON
    object, and the objects come back in rank order. ``use_gpus``: one GPU per process
    (NCCL), else CPU processes (gloo). Raises ``RuntimeError`` with the log's end if the job
    fails."""
    if isinstance(functions, (str, bytes)) or not all(callable(f) for f in functions):
        raise TypeError("functions: must be a list of functions")
    if not isinstance(main, str) or not main:
        raise TypeError(f"main={checks.show(main)}: must be a non-empty string")
    nproc = checks.integer("nproc", nproc)
    checks.flag("use_gpus", use_gpus)
    from fp8lab.distributed import worker_environment

    header = "import json, os, sys, time\nimport torch\nimport torch.distributed as dist\n"
    body = "\n\n".join(textwrap.dedent(inspect.getsource(f)) for f in functions)
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "moe_worker.py"
        script.write_text(f"{header}\n{body}\n\n{main}\n")
        env = worker_environment({"FP8LAB_EP_BACKEND": "nccl" if use_gpus else "gloo"})
        if not use_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ""
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={nproc}", str(script)]
        done = subprocess.run(command, capture_output=True, text=True, env=env,
                              timeout=timeout_s, cwd=folder)
    found = _results(done.stdout)
    if done.returncode != 0 or len(found) != nproc:
        tail = (done.stdout + done.stderr)[-2000:]
        raise RuntimeError(f"the {nproc}-process job failed (exit {done.returncode}):\n{tail}")
    return sorted(found, key=lambda r: r["rank"])
