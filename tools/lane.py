"""The GPU lane: execute the chapters on a GPU box and stamp them; report every stamp's state.

``python -m tools.lane run [NOTEBOOK ...]`` executes each chapter of ``_toc.yml`` (or the ones
named) in place, one at a time (nbmake ``--overwrite``, preset ``full``), and stamps it
(:mod:`tools.stamps`). ``python -m tools.lane verdicts [NOTEBOOK ...]``, in a GPU session other
than the stamp's, executes them again into copies and reports every glued verdict that flipped
(:mod:`tools.verdicts`; exit code 1 on a flip). ``python -m tools.lane check`` prints each
chapter's state (fresh, pending, broken) and whether its stamp was re-run, and exits non-zero
only when one is broken. ``list`` prints the chapters.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from fp8lab import stamp
from tools import stamps, verdicts

ROOT = stamps.ROOT


def run(paths: list[Path], python: str = sys.executable) -> int:
    """Execute and stamp each notebook; return the number that failed."""
    machine = stamp.where_it_runs()
    environment = dict(os.environ, FP8LAB_PRESET="full")
    failures = 0
    for path in paths:
        begin = time.perf_counter()
        command = [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--nbmake"]
        command += ["--nbmake-timeout=900", "--overwrite", str(path)]
        result = subprocess.run(command, env=environment, cwd=ROOT)
        seconds = time.perf_counter() - begin
        if result.returncode == 0:
            stamps.stamp_notebook(path, seconds, machine)
            print(f"stamped {path.name}: {seconds:.0f} s on {machine['gpu_name']}", flush=True)
        else:
            failures += 1
            print(f"FAILED {path.name} after {seconds:.0f} s (not stamped)", flush=True)
    return failures


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
        report, flips = verdicts.run(paths)
        print(f"report: {report.relative_to(ROOT)}")
        return 1 if flips else 0
    return check(paths)


if __name__ == "__main__":
    sys.exit(main())
