"""Run experiments on several GPUs (or CPU processes) and get their results back as data.

:func:`launch` starts ``torchrun --nproc-per-node N`` on :mod:`fp8lab.parallel_worker`, one
process per GPU -- or, on a machine without CUDA, N CPU processes on the gloo backend that run
the same code through fp8lab's CPU reference. One launch runs a list of :class:`Task`\\ s in
order; rank 0 writes each task's result (times, memory per rank, correctness checks) as a
JSON file under a temporary directory, and :func:`launch` returns them as a :class:`Run`.

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

import contextlib
import dataclasses
import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp8lab import checks

__all__ = [
    "Run",
    "Task",
    "TaskResult",
    "command",
    "launch",
    "load",
    "save",
    "source",
    "worker_environment",
]

WORKER = "fp8lab.parallel_worker"
# Kinds of task the worker runs (fp8lab.parallel_worker.TASKS has one function per kind).
KINDS = (
    "links",
    "amax",
    "ddp_check",
    "ddp",
    "fsdp",
    "tp_check",
    "tp",
    "cp_check",
    "cp",
    "timeline",
    "sleep",
)
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "UB_SKIPMC": "1",
}
ROOT = Path(__file__).resolve().parent.parent
LOG_TAIL = 4000
POLL_S = 0.25


@dataclass(frozen=True)
class Task:
    """One experiment of a launch: ``kind`` names the worker function, ``args`` its inputs.

    ``timeout_s`` bounds the task once it has started; ``env`` is extra environment for the
    processes (tasks with different environments run in different jobs).
    """

    name: str
    kind: str
    args: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = 300.0
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.replace("_", "").isalnum():
            raise ValueError(
                f"name={self.name!r}: must be a non-empty string of letters, digits and _"
            )
        checks.choice("kind", self.kind, KINDS)
        if not isinstance(self.args, Mapping):
            raise TypeError(f"args must be a mapping, not {type(self.args).__name__}")
        try:
            json.dumps(dict(self.args))
        except (TypeError, ValueError) as error:
            raise TypeError(f"args must be JSON-serialisable: {error}") from None
        checks.number("timeout_s", self.timeout_s, positive=True)
        if not isinstance(self.env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            raise TypeError("env must be a mapping of strings to strings")


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
    """The source code of a function of the worker (what a task runs), to show in a chapter."""
    import inspect

    from fp8lab import parallel_worker

    if not isinstance(name, str):
        raise TypeError(f"name={name!r}: must be the name of a function of {WORKER}")
    function = getattr(parallel_worker, name, None)
    if not callable(function):
        raise ValueError(f"name={name!r}: {WORKER} has no function of that name")
    return inspect.getsource(function)


# --- the launch ------------------------------------------------------------------------------


def _default_nproc() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 2
    except ImportError:
        return 2


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _is_worker(pid: int) -> bool:
    """True if ``pid`` is still a worker process of this package (not a reused id)."""
    try:
        return WORKER.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _end(process: subprocess.Popen, out: Path) -> None:
    """End a job: torchrun first (it stops its workers), then any worker still alive, by id."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=15)
    for pid_file in out.glob("pid.*"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(pid_file.read_text())
            if _is_worker(pid):
                os.kill(pid, signal.SIGKILL)
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait()


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-LOG_TAIL:]


def _watch(process, group, out: Path, begin: float, deadline_s: float, startup_timeout_s):
    """Wait for a job; return ``(task name or None, why)`` if it has to be ended, else None."""
    started = time.monotonic()
    while process.poll() is None:
        time.sleep(POLL_S)
        now = time.monotonic()
        running = [
            t
            for t in group
            if (out / f"{t.name}.started").exists() and not (out / f"{t.name}.json").exists()
        ]
        if running:
            task = running[-1]
            since = (out / f"{task.name}.started").stat().st_mtime
            if time.time() - since > task.timeout_s:
                return task.name, f"timed out after {task.timeout_s:g} s"
        elif now - started > startup_timeout_s and not any(
            (out / f"{t.name}.started").exists() for t in group
        ):
            return None, f"no task started within {startup_timeout_s:g} s"
        if now - begin > deadline_s:
            return None, f"the run's deadline of {deadline_s:g} s passed"
    return None


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
    if isinstance(tasks, Task) or not isinstance(tasks, Sequence):
        raise TypeError("tasks must be a sequence of Task")
    if not all(isinstance(t, Task) for t in tasks):
        raise TypeError("tasks must be a sequence of Task")
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"tasks: task names must be unique, got {names}")
    nproc = _default_nproc() if nproc is None else checks.integer("nproc", nproc)
    shared = dict(shared or {})
    try:
        json.dumps(shared)
    except (TypeError, ValueError) as error:
        raise TypeError(f"shared must be JSON-serialisable: {error}") from None
    deadline_s = checks.number("deadline_s", deadline_s, positive=True)
    startup_timeout_s = checks.number("startup_timeout_s", startup_timeout_s, positive=True)
    checks.flag("keep", keep)

    begin = time.monotonic()
    out = Path(tempfile.mkdtemp(prefix="fp8lab-run-"))
    results: dict[str, TaskResult] = {}
    commands, logs, machine = [], [], {}
    pending = list(tasks)
    try:
        launches = 0
        while pending:
            if time.monotonic() - begin > deadline_s:
                break
            env = dict(pending[0].env)
            group = []
            for task in pending:
                if dict(task.env) != env:
                    break
                group.append(task)
            launches += 1
            plan = out / f"plan{launches}.json"
            plan.write_text(
                json.dumps(
                    {
                        "tasks": [
                            {
                                "name": t.name,
                                "kind": t.kind,
                                "args": {**shared, **dict(t.args)},
                                "timeout_s": t.timeout_s,
                            }
                            for t in group
                        ]
                    }
                )
            )
            for stale in out.glob("pid.*"):
                stale.unlink()
            argv = command(nproc, plan=str(plan), out=str(out), python=python)
            commands.append(shlex.join(["python", *argv[1:]]))
            log = out / f"launch{launches}.log"
            with open(log, "wb") as stream:
                process = subprocess.Popen(
                    argv,
                    cwd=ROOT,
                    env=worker_environment(env),
                    stdout=stream,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                try:
                    failure = _watch(process, group, out, begin, deadline_s, startup_timeout_s)
                finally:
                    _end(process, out)
            tail = _tail(log)
            logs.append(tail)
            machine = machine or _read_json(out / "machine.json") or {}
            progress = False
            for task in group:
                record = _read_json(out / f"{task.name}.json")
                if record is not None:
                    results[task.name] = TaskResult(
                        task.name,
                        task.kind,
                        bool(record.get("ok")),
                        record.get("data") or {},
                        record.get("error"),
                        float(record.get("seconds", 0.0)),
                    )
                    progress = True
                elif (out / f"{task.name}.started").exists():
                    why = failure[1] if failure and failure[0] in (task.name, None) else None
                    why = why or f"the job ended (exit code {process.returncode}) during this task"
                    results[task.name] = TaskResult(
                        task.name, task.kind, False, {}, f"{why}\n{tail[-1500:]}", 0.0
                    )
                    progress = True
                    break
            if not progress:  # the job died before any task began: report them all
                why = failure[1] if failure else f"the job exited with {process.returncode}"
                for task in group:
                    results[task.name] = TaskResult(
                        task.name, task.kind, False, {}, f"{why}\n{tail[-1500:]}", 0.0
                    )
            pending = [t for t in pending if t.name not in results]
        for task in pending:
            results[task.name] = TaskResult(
                task.name, task.kind, False, {}, "skipped: the run's deadline passed", 0.0
            )
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
    record = stamp.stamp_record(stamp.library_modules(notebook), {k: machine.get(k) for k in keys})
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
