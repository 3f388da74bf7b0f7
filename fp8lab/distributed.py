"""Run experiments on several GPUs (or CPU processes) and get their results back as data.

:func:`launch` starts ``torchrun --nproc-per-node N`` on :mod:`fp8lab.parallel.worker`, one
process per GPU -- or, on a machine without CUDA, N CPU processes on the gloo backend that run
the same code through fp8lab's CPU reference. One launch runs a list of tasks
(:class:`fp8lab.parallel.jobs.Task`) in order; rank 0 writes each task's result (times, memory
per rank, correctness checks) as a JSON file under a temporary directory, and :func:`launch`
returns them as a :class:`Run`.

One code path for any N: a task sees ``WORLD_SIZE`` and builds its process groups from it.

What can go wrong in a multi-process job, and what the launcher does about it:

* a task raises on every rank: the worker writes the error as that task's result and goes on;
* a task hangs (a collective that one rank never joins) or a process dies: the task runs past
  its ``timeout_s``, or the job ends without its result; the launcher ends the job (the
  worker processes by their ids), records the task as failed with the end of the job's log,
  and starts a new job for the tasks after it;
* the whole list runs past ``deadline_s``: the tasks not started are reported as skipped.

Every process gets :data:`MULTICAST_OFF` in its environment: NVLink SHARP (multicast) stays
off for NCCL, for PyTorch's symmetric memory and for NVSHMEM, and TE's Userbuffers use CUDA
IPC instead of multicast (``UB_SKIPMC=1``). Tasks that need a different environment before
CUDA starts (``CUDA_DEVICE_MAX_CONNECTIONS=1`` for tensor-parallel overlap) carry it in
``Task.env``; consecutive tasks with the same environment share one job.

:func:`command` writes the same launch for several nodes (``--nnodes``, a rendezvous endpoint),
which is how the job leaves one machine.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp8lab import checks
from fp8lab.parallel import jobs
from fp8lab.parallel.jobs import WORKER, Task, check_lr

__all__ = [
    "Run",
    "TaskResult",
    "command",
    "launch",
    "load",
    "save",
    "source",
    "worker_environment",
]

MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "UB_SKIPMC": "1",
}
# Where source() looks for a function of the worker (fp8lab.parallel.*), the layouts first.
SOURCE_MODULES = ("layouts", "model", "tasks_speed", "tasks_checks", "measure", "process")
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class TaskResult:
    """What one task returned: ``data`` (rows and checks) or the ``error`` that stopped it."""

    name: str
    kind: str
    ok: bool
    data: dict
    error: str | None = None
    seconds: float = 0.0

    def __post_init__(self):
        for field_name in ("name", "kind"):
            if not isinstance(getattr(self, field_name), str):
                raise TypeError(f"{field_name}={getattr(self, field_name)!r}: must be a string")
        checks.flag("ok", self.ok)
        if not isinstance(self.data, dict):
            raise TypeError(f"data must be a dict, not {type(self.data).__name__}")
        if self.error is not None and not isinstance(self.error, str):
            raise TypeError(f"error={self.error!r}: must be None or a string")
        checks.number("seconds", self.seconds, non_negative=True)

    @property
    def rows(self) -> list[dict]:
        """The task's table rows (each may carry an ``error`` of its own sub-run)."""
        return list(self.data.get("rows", [])) if self.ok else []


@dataclass
class Run:
    """The results of a launch, by task name, with where and how it ran."""

    nproc: int
    backend: str
    results: dict[str, TaskResult]
    machine: dict
    seconds: float
    commands: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    stamp: dict | None = None

    def __post_init__(self):
        checks.integer("nproc", self.nproc, minimum=0)
        if not isinstance(self.backend, str):
            raise TypeError(f"backend={self.backend!r}: must be a string")
        if not isinstance(self.results, dict) or not all(
            isinstance(r, TaskResult) for r in self.results.values()
        ):
            raise TypeError("results must be a dict of task names to TaskResult")
        if not isinstance(self.machine, dict):
            raise TypeError(f"machine must be a dict, not {type(self.machine).__name__}")
        checks.number("seconds", self.seconds, non_negative=True)

    def __getitem__(self, name: str) -> TaskResult:
        if name not in self.results:
            raise KeyError(f"no task {name!r} in this run (tasks: {', '.join(self.results)})")
        return self.results[name]

    def __contains__(self, name: str) -> bool:
        return name in self.results

    def summary(self) -> list[dict]:
        """One row per task: name, kind, ok, seconds and the error, for a table."""
        return [
            {
                "task": r.name,
                "kind": r.kind,
                "ok": r.ok,
                "seconds": round(r.seconds, 1),
                "error": (r.error or "").splitlines()[0][:160] if r.error else "",
            }
            for r in self.results.values()
        ]


def worker_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every started process gets: this one, :data:`MULTICAST_OFF`, fp8lab's
    checkout first on ``PYTHONPATH``, then ``extra``."""
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
    *,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "fp8lab",
    plan: str = "plan.json",
    out: str = "results",
    python: str | None = None,
) -> list[str]:
    """The ``torchrun`` command line of a launch, as a list of arguments.

    One node: ``--standalone`` (a free local port). Several nodes: the same command on every
    node, with ``--nnodes``, a c10d rendezvous at ``rdzv_endpoint`` (``host:port`` of one of
    them) and a shared ``rdzv_id``.
    """
    checks.integer("nproc", nproc)
    checks.integer("nnodes", nnodes)
    if python is not None and not isinstance(python, str):
        raise TypeError(f"python={python!r}: must be a path string")
    for name, value in (("plan", plan), ("out", out), ("rdzv_id", rdzv_id)):
        if not isinstance(value, str) or not value:
            raise TypeError(f"{name}={value!r}: must be a non-empty string")
    argv = [python or sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1 and rdzv_endpoint is None:
        argv += ["--standalone", "--nnodes", "1"]
    else:
        if not isinstance(rdzv_endpoint, str) or ":" not in rdzv_endpoint:
            raise ValueError(
                f"rdzv_endpoint={rdzv_endpoint!r}: several nodes need a 'host:port' every node "
                "can reach"
            )
        argv += [
            "--nnodes",
            str(nnodes),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            rdzv_endpoint,
            "--rdzv-id",
            rdzv_id,
        ]
    return argv + [
        "--nproc-per-node",
        str(nproc),
        "--module",
        WORKER,
        "--plan",
        plan,
        "--out",
        out,
    ]


def source(name: str) -> str:
    """The source code of a function of the worker (what a task runs), to show in a chapter:
    looked up in :mod:`fp8lab.parallel.layouts` first, then the worker's other modules."""
    import importlib
    import inspect

    if not isinstance(name, str):
        raise TypeError(f"name={name!r}: must be the name of a function of {WORKER}")
    for module in (f"fp8lab.parallel.{m}" for m in SOURCE_MODULES):
        function = getattr(importlib.import_module(module), name, None)
        if callable(function) and getattr(function, "__module__", None) == module:
            return inspect.getsource(function)
    raise ValueError(f"name={name!r}: {WORKER} and its modules have no function of that name")


# --- the launch ------------------------------------------------------------------------------


def _check_launch(tasks, nproc, shared, deadline_s, startup_timeout_s, keep):
    """``launch``'s arguments, checked; returns ``(nproc, shared, deadline_s,
    startup_timeout_s)``."""
    if isinstance(tasks, Task) or not isinstance(tasks, Sequence):
        raise TypeError("tasks must be a sequence of Task")
    if not all(isinstance(t, Task) for t in tasks):
        raise TypeError("tasks must be a sequence of Task")
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"tasks: task names must be unique, got {names}")
    nproc = jobs.default_nproc() if nproc is None else checks.integer("nproc", nproc)
    shared = dict(shared or {})
    try:
        json.dumps(shared)
    except (TypeError, ValueError) as error:
        raise TypeError(f"shared must be JSON-serialisable: {error}") from None
    check_lr(shared)
    deadline_s = checks.number("deadline_s", deadline_s, positive=True)
    startup_timeout_s = checks.number("startup_timeout_s", startup_timeout_s, positive=True)
    checks.flag("keep", keep)
    return nproc, shared, deadline_s, startup_timeout_s


def _result(task: Task, record: dict) -> TaskResult:
    return TaskResult(
        task.name,
        task.kind,
        bool(record.get("ok")),
        record.get("data") or {},
        record.get("error"),
        float(record.get("seconds", 0.0)),
    )


def _run_jobs(tasks, nproc, shared, out: Path, python, limits) -> tuple[dict, list, list, dict]:
    """One job per run of tasks with the same environment, a new job after a task that ended
    its job, until every task has a result or the deadline passes; returns the results, the
    command lines, the ends of the logs and the machine record."""
    begin, deadline_s, _ = limits
    results: dict[str, TaskResult] = {}
    commands, logs, machine = [], [], {}
    pending = list(tasks)
    while pending and time.monotonic() - begin <= deadline_s:
        group = jobs.next_group(pending)
        plan = out / f"plan{len(commands) + 1}.json"
        jobs.write_plan(plan, group, shared)
        for stale in out.glob("pid.*"):
            stale.unlink()
        argv = command(nproc, plan=str(plan), out=str(out), python=python)
        commands.append(shlex.join(["python", *argv[1:]]))
        log = out / f"launch{len(commands)}.log"
        env = worker_environment(dict(group[0].env))
        failure, code, tail = jobs.run_job(argv, env, ROOT, log, group, out, limits)
        logs.append(tail)
        machine = machine or jobs.read_json(out / "machine.json") or {}
        by_name = {t.name: t for t in group}
        for name, record in jobs.collect(group, out, failure, code, tail).items():
            results[name] = _result(by_name[name], record)
        pending = [t for t in pending if t.name not in results]
    for task in pending:
        results[task.name] = _result(task, {"error": "skipped: the run's deadline passed"})
    return results, commands, logs, machine


def launch(
    tasks: Sequence[Task],
    nproc: int | None = None,
    *,
    shared: Mapping[str, Any] | None = None,
    deadline_s: float = 1800.0,
    startup_timeout_s: float = 240.0,
    python: str | None = None,
    keep: bool = False,
) -> Run:
    """Run ``tasks`` on ``nproc`` processes (default: every GPU here, or 2 CPU processes).

    ``shared`` goes into every task's ``args`` (a task's own args win). Returns a :class:`Run`;
    a task that failed, timed out or was skipped has ``ok=False`` and its ``error``.
    """
    nproc, shared, deadline_s, startup_timeout_s = _check_launch(
        tasks, nproc, shared, deadline_s, startup_timeout_s, keep
    )
    begin = time.monotonic()
    out = Path(tempfile.mkdtemp(prefix="fp8lab-run-"))
    try:
        limits = (begin, deadline_s, startup_timeout_s)
        results, commands, logs, machine = _run_jobs(tasks, nproc, shared, out, python, limits)
    finally:
        if not keep:
            shutil.rmtree(out, ignore_errors=True)
    ordered = {t.name: results[t.name] for t in tasks}
    backend = machine.get("backend", "nccl" if machine.get("gpu_name") else "gloo")
    return Run(nproc, backend, ordered, machine, time.monotonic() - begin, commands, logs)


# --- results files -----------------------------------------------------------------------------


def _lane_stamp(machine: dict, preset: str) -> dict:
    """A stamp (:mod:`fp8lab.stamp`) for a file of results: the modules the worker imports."""
    from fp8lab import stamp

    notebook = {"cells": [{"cell_type": "code", "source": f"import {WORKER}, fp8lab.distributed"}]}
    keys = ("gpu_name", "gpu_count", "compute_capability", "torch", "cuda", "transformer_engine")
    keys += ("cudnn", "cudnn_torch")
    facts = {k: machine[k] for k in keys if k in machine}  # no cuDNN recorded: the stamp says so
    record = stamp.stamp_record(stamp.library_modules(notebook), facts)
    record["preset"] = preset
    return record


def save(run: Run, path: str | os.PathLike) -> dict:
    """Write ``run`` as JSON at ``path`` with a stamp (where and when it ran, and a hash of the
    fp8lab code behind it); return the stamp."""
    if not isinstance(run, Run):
        raise TypeError(f"run must be a distributed.Run, not {type(run).__name__}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path={path!r}: must be a file path")
    path = Path(path)
    preset = run.machine.get("preset", "smoke")
    stamp = {
        **run.machine,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if run.machine.get("gpu_name") and run.machine.get("transformer_engine"):
        stamp.update(_lane_stamp(run.machine, preset))
    payload = {
        "stamp": stamp,
        "nproc": run.nproc,
        "backend": run.backend,
        "seconds": run.seconds,
        "commands": run.commands,
        "results": {name: dataclasses.asdict(result) for name, result in run.results.items()},
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=1, default=float) + "\n")
    except OSError as error:
        raise ValueError(f"path={str(path)!r}: cannot write the results there ({error})") from None
    run.stamp = stamp
    return stamp


def load(path: str | os.PathLike) -> Run:
    """A :class:`Run` written by :func:`save`."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path={path!r}: must be a file path")
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path={str(path)!r}: no such results file")
    try:
        payload = json.loads(path.read_text())
        results = {name: TaskResult(**record) for name, record in payload["results"].items()}
        stamp = payload["stamp"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"path={str(path)!r}: not a results file of distributed.save ({error})"
        ) from None
    return Run(
        int(payload.get("nproc", stamp.get("gpu_count", 0))),
        payload.get("backend", ""),
        results,
        stamp,
        float(payload.get("seconds", 0.0)),
        list(payload.get("commands", [])),
        [],
        stamp,
    )
