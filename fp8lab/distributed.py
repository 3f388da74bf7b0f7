"""Start a worker script on several GPUs (or CPU processes) with torchrun; get its result.

A notebook is one process; training on N GPUs takes N processes that find each other.
:func:`torchrun` starts ``python -m torch.distributed.run --standalone --nproc-per-node N
SCRIPT ARGS_JSON RESULT_JSON``, waits for it (up to ``timeout_s``) and returns what rank 0
wrote at ``RESULT_JSON``; a job that fails or runs too long comes back as ``{"error": ...}``
with the first worker traceback of its log (:func:`first_traceback`: torchrun's own summary
names the failed rank but not its exception), the end of the log, and whatever rank 0 had
written by then, so that a chapter shows the failure rather than stopping on it. A job
stopped for its time has its workers stopped too, so that they do not hold the GPUs the
next job needs.

Every process gets :data:`MULTICAST_OFF`: NVLink SHARP (multicast) stays off for NCCL,
PyTorch's symmetric memory and NVSHMEM, and TE's Userbuffers use CUDA IPC (``UB_SKIPMC=1``).
That suits GPUs that cannot use multicast; where they can, drop these variables.

:func:`command` writes the same launch for several machines (``--nnodes`` and a rendezvous).

A chapter whose jobs take longer than one sitting can be run in parts. With
``FP8LAB_JOB_CACHE`` set to a folder, every job that finished is saved there under a hash of
what ran (the worker file's bytes, its arguments, the number of processes, the extra
environment), and a second run of the same job returns the saved result instead of running
it again. With ``FP8LAB_JOB_BUDGET_S`` set, a process refuses to start a job once that many
seconds have passed since its first job (:class:`JobBudgetSpent`): the notebook stops, and
the same command run again replays the finished jobs from the folder and runs the rest.
Neither is set by default; a result from the folder is one this code produced on this
machine, under the same arguments.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from fp8lab import checks

__all__ = ["JobBudgetSpent", "command", "first_traceback", "torchrun", "worker_environment"]

MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "UB_SKIPMC": "1",
}
ROOT = Path(__file__).resolve().parent.parent
LOG_TAIL = 3000
TRACEBACK_LINES = 60
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")  # torchrun's per-rank tag
JOB_CACHE_ENV = "FP8LAB_JOB_CACHE"
JOB_BUDGET_ENV = "FP8LAB_JOB_BUDGET_S"
_first_job_at: float | None = None


class JobBudgetSpent(RuntimeError):
    """A job was refused: this process has run jobs for longer than ``FP8LAB_JOB_BUDGET_S``."""


def job_key(path: Path, payload: str, nproc: int, env: Mapping[str, str] | None) -> str:
    """What identifies a job's result: a hash of its worker file, arguments, process count
    and extra environment."""
    import hashlib

    digest = hashlib.sha256(path.read_bytes())
    extra = json.dumps(sorted((env or {}).items()))
    for part in (payload, str(nproc), extra):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()


def _budget_check(now: float) -> None:
    global _first_job_at
    raw = os.environ.get(JOB_BUDGET_ENV)
    if not raw:
        return
    try:
        budget = float(raw)
    except ValueError:
        raise ValueError(f"{JOB_BUDGET_ENV}={raw!r}: must be a number of seconds") from None
    _first_job_at = now if _first_job_at is None else _first_job_at
    if now - _first_job_at > budget:
        raise JobBudgetSpent(
            f"{now - _first_job_at:.0f} s of jobs, over {JOB_BUDGET_ENV}={raw}: run the same "
            f"command again to replay the finished jobs from {JOB_CACHE_ENV} and run the rest")


def first_traceback(log: str) -> str:
    """The first Python traceback in a job's log, up to its exception line (at most
    :data:`TRACEBACK_LINES` lines), or ``""``. Lines tagged ``[rankN]:`` are read untagged;
    torchrun's own traceback (``torch/distributed/run.py``) is not a worker's and is skipped."""
    if not isinstance(log, str):
        raise TypeError(f"log must be a str, not {type(log).__name__}")
    lines = [_RANK_PREFIX.sub("", line) for line in log.splitlines()]
    for start, line in enumerate(lines):
        if not line.startswith("Traceback (most recent call last):"):
            continue
        block = [line]
        for following in lines[start + 1:]:
            block.append(following)
            if following and not following[0].isspace():  # the exception's own line
                break
        if not any("torch/distributed/run.py" in b or "elastic/" in b for b in block):
            return "\n".join(block[:TRACEBACK_LINES])
    return ""


def worker_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment, :data:`MULTICAST_OFF`, fp8lab's checkout first on
    ``PYTHONPATH``, one OpenMP thread per process, then ``extra``."""
    if extra is not None and (
        not isinstance(extra, Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in extra.items())
    ):
        raise TypeError("extra must be a mapping of strings to strings")
    env = dict(os.environ)
    env.update(MULTICAST_OFF)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + path if path else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def command(
    nproc: int,
    script: str = "worker.py",
    *,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "fp8lab",
) -> list[str]:
    """The ``torchrun`` command line for ``script`` as a list: ``--standalone`` on one
    machine; on ``nnodes`` machines the same line on each, with a c10d rendezvous at
    ``rdzv_endpoint`` (``host:port`` every machine reaches) and a shared ``rdzv_id``."""
    checks.integer("nproc", nproc)
    checks.integer("nnodes", nnodes)
    for name, value in (("script", script), ("rdzv_id", rdzv_id)):
        if not isinstance(value, str) or not value:
            raise TypeError(f"{name}={value!r}: must be a non-empty string")
    argv = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1 and rdzv_endpoint is None:
        argv += ["--standalone", "--nnodes", "1"]
    else:
        if not isinstance(rdzv_endpoint, str) or ":" not in rdzv_endpoint:
            raise ValueError(
                f"rdzv_endpoint={rdzv_endpoint!r}: several machines need a 'host:port' "
                "every machine can reach"
            )
        argv += ["--nnodes", str(nnodes), "--rdzv-backend", "c10d"]
        argv += ["--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id]
    return argv + ["--nproc-per-node", str(nproc), script]


def torchrun(
    script: str | os.PathLike,
    nproc: int,
    args: Mapping | None = None,
    *,
    timeout_s: float = 300.0,
    env: Mapping[str, str] | None = None,
) -> dict:
    """Run ``script`` on ``nproc`` processes; return the JSON its rank 0 wrote at the path
    given as its second argument (its first is ``args`` as JSON), with ``seconds`` added;
    with ``"error"`` added too when the job failed, wrote nothing or timed out (then the
    JSON is whatever rank 0 had written, possibly nothing)."""
    import time

    path = Path(script) if isinstance(script, (str, os.PathLike)) else None
    if path is None or not path.is_file():
        raise ValueError(f"script={script!r}: no such file")
    path = path.resolve()
    nproc = checks.integer("nproc", nproc)
    timeout_s = checks.number("timeout_s", timeout_s, positive=True)
    try:
        payload = json.dumps(dict(args or {}))
    except (TypeError, ValueError) as error:
        raise TypeError(f"args must be JSON-serialisable: {error}") from None
    cache = os.environ.get(JOB_CACHE_ENV)
    saved = Path(cache) / f"{job_key(path, payload, nproc, env)}.json" if cache else None
    if saved is not None and saved.is_file():
        return json.loads(saved.read_text())
    _budget_check(time.monotonic())
    with tempfile.TemporaryDirectory(prefix="fp8lab-run-") as folder:
        result = Path(folder) / "result.json"
        argv = command(nproc, str(path)) + [payload, str(result)]
        begin = time.monotonic()
        job = subprocess.Popen(
            argv, cwd=path.parent, env=worker_environment(env), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True, text=True, errors="replace",
        )
        try:
            log, _ = job.communicate(timeout=timeout_s)
            code = job.returncode
        except subprocess.TimeoutExpired:
            log, code = _stop(job) + f"\ntimed out after {timeout_s:g} s", None
        except BaseException:  # an interrupt: leave no job behind
            _stop(job)
            raise
        seconds = time.monotonic() - begin
        found = json.loads(result.read_text()) if result.is_file() else {}
    if code == 0 and found:
        if saved is not None:
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_text(json.dumps({**found, "seconds": seconds}))
        return {**found, "seconds": seconds}
    cause, tail = first_traceback(log), log[-LOG_TAIL:]
    shown = cause and cause not in tail
    head = f"first traceback:\n{cause}\n--- end of the log:\n" if shown else ""
    return {**found, "error": f"exit code {code}\n{head}{tail}", "seconds": seconds}


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux's /proc; none found elsewhere)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _stop(job: subprocess.Popen, grace_s: float = 10.0) -> str:
    """Stop a torchrun that ran too long, and its workers: torchrun starts each worker in
    a session of its own, so killing torchrun alone would leave them holding the GPUs (and
    the log's pipe open). SIGTERM first (torchrun passes it on), then SIGKILL to each
    worker's process group and to torchrun; the log read so far."""
    workers = _children(job.pid)
    job.send_signal(signal.SIGTERM)
    try:
        log, _ = job.communicate(timeout=grace_s)
    except subprocess.TimeoutExpired:
        log = None
    for pid in workers:  # each leads a session and group of its own: both, to be sure
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)
    if log is None:
        job.kill()
        try:
            log, _ = job.communicate(timeout=grace_s)
        except subprocess.TimeoutExpired:  # something still holds the pipe: stop reading
            job.stdout.close()
            job.wait()
            log = ""
    return log or ""
