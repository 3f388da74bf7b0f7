"""The GPU lane: execute the chapters on a GPU box and stamp them; report every stamp's state.

``python -m tools.lane run [NOTEBOOK ...]`` executes each chapter of ``_toc.yml`` (or the ones
named) in place, one at a time (preset ``full``), on as many GPUs as the chapter needs (the
first ones; :func:`tools.stamps.pinned_environment`), and stamps it (:mod:`tools.stamps`). It prints
each cell's seconds as it goes and keeps the cells run so far in ``NAME.partial.ipynb`` beside
the chapter, so that a run stopped by a time limit still says where it got and what each cell
cost; the partial copy is removed when the chapter completes. A chapter longer than one
command allows runs in parts: with ``FP8LAB_JOB_CACHE`` and ``FP8LAB_JOB_BUDGET_S`` set
(:mod:`fp8lab.distributed`), the first run stops once its jobs have used the budget, and the
same command run again replays the finished jobs and runs the rest; the stamp then records
the seconds of all parts and their number (``lane_parts``).

``python -m tools.lane verdicts [NOTEBOOK ...]``, in a GPU session other than the stamp's,
executes them again into copies and reports every glued verdict that flipped
(:mod:`tools.verdicts`; exit code 1 on a flip). ``python -m tools.lane check`` prints each
chapter's state (fresh, pending, broken) and whether its stamp was re-run, and exits non-zero
only when one is broken. ``list`` prints the chapters.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from fp8lab import distributed
from tools import stamps, verdicts

ROOT = stamps.ROOT


def partial_path(path: Path) -> Path:
    """Where a running chapter keeps the cells executed so far."""
    return path.with_name(path.stem + ".partial.ipynb")


def execute(path: Path, environment: dict[str, str], cell_timeout_s: int = 900) -> bool:
    """Execute the notebook at ``path`` in place; print each cell's seconds; True on success."""
    import nbformat  # Jupyter's stack: needed to run a chapter, not to check its stamp
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook = nbformat.read(path, as_version=4)
    partial = partial_path(path)
    clock = {"cell": time.perf_counter()}

    def started(cell, cell_index):
        clock["cell"] = time.perf_counter()

    def finished(cell, cell_index, execute_reply):
        print(f"  cell {cell_index}: {time.perf_counter() - clock['cell']:.1f} s", flush=True)
        nbformat.write(notebook, partial)

    client = NotebookClient(
        notebook, timeout=cell_timeout_s, kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        on_cell_execute=started, on_cell_executed=finished,
    )
    try:
        client.execute(env=environment)
    except CellExecutionError as error:
        nbformat.write(notebook, partial)
        print(str(error)[-4000:], flush=True)
        return False
    nbformat.write(notebook, path)
    partial.unlink(missing_ok=True)
    return True


def run(paths: list[Path]) -> int:
    """Execute and stamp each notebook on the GPUs it needs; return the number that failed."""
    failures = 0
    for path in paths:
        environment = stamps.pinned_environment(path, dict(os.environ, FP8LAB_PRESET="full"))
        try:
            machine = stamps.machine_in(environment)
        except RuntimeError as error:
            failures += 1
            print(f"FAILED {path.name}: no GPU to stamp on ({error})", flush=True)
            continue
        needed = stamps.gpus_needed(path)
        if machine["gpu_count"] < needed:
            failures += 1
            print(f"FAILED {path.name}: it needs {needed} GPUs and this "
                  f"process sees {machine['gpu_count']} (CUDA_VISIBLE_DEVICES="
                  f"{environment['CUDA_VISIBLE_DEVICES']}); not run", flush=True)
            continue
        print(f"running {path.name} on {machine['gpu_count']} x {machine['gpu_name']} "
              f"(CUDA_VISIBLE_DEVICES={environment['CUDA_VISIBLE_DEVICES']})", flush=True)
        record = parts_record(path, environment)
        earlier = parts_so_far(record)
        begin = time.perf_counter()
        done = execute(path, environment)
        seconds = time.perf_counter() - begin
        total, parts = earlier["seconds"] + seconds, earlier["parts"] + 1
        if done:
            stamps.stamp_notebook(path, total, machine, lane_parts=parts if parts > 1 else None)
            if record is not None:
                record.unlink(missing_ok=True)
            print(f"stamped {path.name}: {total:.0f} s on {machine['gpu_name']}"
                  + (f", in {parts} parts" if parts > 1 else ""), flush=True)
        else:
            failures += 1
            if record is not None:  # the next run of the same command adds its time
                record.parent.mkdir(parents=True, exist_ok=True)
                record.write_text(json.dumps({"seconds": total, "parts": parts}))
            print(f"FAILED {path.name} after {seconds:.0f} s (not stamped; cells run so far in "
                  f"{partial_path(path).name})", flush=True)
    return failures


def parts_record(path: Path, environment: dict[str, str]) -> Path | None:
    """Where a chapter run in parts (``FP8LAB_JOB_CACHE`` set: finished jobs are replayed,
    :mod:`fp8lab.distributed`) keeps the seconds and parts of its unfinished runs."""
    cache = environment.get(distributed.JOB_CACHE_ENV)
    return Path(cache) / f"{path.stem}.lane.json" if cache else None


def parts_so_far(record: Path | None) -> dict:
    """The seconds and number of the earlier, unfinished runs of a chapter in parts, from its
    :func:`parts_record`."""
    if record is None or not record.is_file():
        return {"seconds": 0.0, "parts": 0}
    return json.loads(record.read_text())


def check(paths: list[Path]) -> int:
    """Print every chapter's state; return 1 if one is broken."""
    statuses = [stamps.notebook_status(path) for path in paths]
    for path, status in zip(paths, statuses, strict=True):
        print(status.summary())
        for reason in (status.broken or status.pending)[1:]:
            print(f"{'':9s}{reason}")
        again = verdicts.current(path) if status.state != stamps.BROKEN else None
        if again is not None:
            print(f"{'':9s}re-run on {again['rerun']['gpu_name']} ({again['rerun']['date']}): "
                  f"{again['flipped']} of {len(again['verdicts'])} verdicts flipped")
    counts = {state: sum(s.state == state for s in statuses) for state in ("fresh", "pending")}
    broken = len(statuses) - sum(counts.values())
    print(f"{counts['fresh']} fresh, {counts['pending']} pending, {broken} broken")
    return 1 if broken else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.lane", description=__doc__.splitlines()[0]
    )
    parser.add_argument("action", choices=("run", "verdicts", "check", "list"))
    parser.add_argument(
        "notebooks", nargs="*", type=Path, help="default: every chapter in _toc.yml"
    )
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.notebooks if not p.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    paths = [p.resolve() for p in args.notebooks] or stamps.toc_notebooks()
    if args.action == "list":
        print("\n".join(str(p.relative_to(ROOT)) for p in paths))
        return 0
    if args.action == "run":
        return 1 if run(paths) else 0
    if args.action == "verdicts":
        try:
            report, flips = verdicts.run(paths)
        except ValueError as error:
            print(f"refused: {error}", flush=True)
            return 2
        print(f"report: {report.relative_to(ROOT)}")
        return 1 if flips else 0
    return check(paths)


if __name__ == "__main__":
    sys.exit(main())
