"""The launcher's side of one job (what :func:`fp8lab.distributed.launch` runs): the tasks a
launch runs (:class:`Task`), the tasks that share a job, its plan file, starting torchrun,
watching the tasks' files, ending the job (the worker processes by their ids) and reading back
what each task left.

Plain data in and out (no torch): :mod:`fp8lab.distributed` turns the records into results, and
the chapter's :mod:`fp8lab.parallel.plan` builds its tasks here, below the launcher.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp8lab import checks

WORKER = "fp8lab.parallel.worker"
LOG_TAIL = 4000
POLL_S = 0.25


# Kinds of task the worker runs (fp8lab.parallel.worker.TASKS has one function per kind).
KINDS = ("links", "amax", "ddp_check", "ddp", "fsdp", "tp_check", "tp", "cp_check", "cp")
KINDS += ("timeline", "rounds", "sleep")


def check_lr(args: Mapping) -> None:
    """What the worker would refuse only once started: a learning rate must be finite, > 0."""
    if "lr" in args:
        checks.number("lr", args["lr"], positive=True)


@dataclass(frozen=True)
class Task:
    """One experiment of a launch: ``kind`` names the worker function, ``args`` its inputs.

    ``timeout_s`` bounds the task once it has started; ``env`` is extra environment for the
    processes (tasks with different environments run in different jobs). A learning rate in
    ``args`` (``lr``) must be finite and positive.
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
        check_lr(self.args)
        checks.number("timeout_s", self.timeout_s, positive=True)
        if not isinstance(self.env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            raise TypeError("env must be a mapping of strings to strings")


def default_nproc() -> int:
    """Every GPU here, or 2 CPU processes where there is none."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 2
    except ImportError:
        return 2


def next_group(pending: list) -> list:
    """The first tasks of ``pending`` that share its first task's environment (one job)."""
    env = dict(pending[0].env)
    group = []
    for task in pending:
        if dict(task.env) != env:
            break
        group.append(task)
    return group


def write_plan(path: Path, group: list, shared: dict) -> None:
    """The plan file the worker reads: each task with ``shared`` under its own ``args``."""
    tasks = [
        {
            "name": t.name,
            "kind": t.kind,
            "args": {**shared, **dict(t.args)},
            "timeout_s": t.timeout_s,
        }
        for t in group
    ]
    path.write_text(json.dumps({"tasks": tasks}))


def read_json(path: Path) -> dict | None:
    """The JSON at ``path``, or None where it is missing or half written."""
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


def end(process: subprocess.Popen, out: Path) -> None:
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


def tail(path: Path) -> str:
    """The end of a job's log (what a failed task reports)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-LOG_TAIL:]


def watch(process, group, out: Path, begin: float, deadline_s: float, startup_timeout_s):
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


def run_job(argv: list[str], env: dict, cwd: Path, log: Path, group: list, out: Path, limits):
    """Start ``argv`` (torchrun), watch it, end it. ``limits`` is ``(begin, deadline_s,
    startup_timeout_s)``; returns ``(failure, exit code, end of the log)``."""
    with open(log, "wb") as stream:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=stream,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            failure = watch(process, group, out, *limits)
        finally:
            end(process, out)
    return failure, process.returncode, tail(log)


def collect(group: list, out: Path, failure, returncode: int | None, log_tail: str) -> dict:
    """What each task of a finished job left, as ``{name: record}`` with the worker's record
    keys (``ok``, ``data``, ``error``, ``seconds``): its result file, or the failure that
    stopped it; tasks after the one that stopped the job are left out (they run again)."""
    records = {}
    for task in group:
        record = read_json(out / f"{task.name}.json")
        if record is not None:
            records[task.name] = record
        elif (out / f"{task.name}.started").exists():
            why = failure[1] if failure and failure[0] in (task.name, None) else None
            why = why or f"the job ended (exit code {returncode}) during this task"
            records[task.name] = {"ok": False, "error": f"{why}\n{log_tail[-1500:]}"}
            break
    if not records:  # the job died before any task began: report them all
        why = failure[1] if failure else f"the job exited with {returncode}"
        for task in group:
            records[task.name] = {"ok": False, "error": f"{why}\n{log_tail[-1500:]}"}
    return records
