"""The workshop pages: write them from the committed notebooks, or check the committed ones.

``python -m tools.workshop_pages write`` writes the frozen answers the grader reads
(``fp8lab/workshop/answers.json``) and the generated workshop pages (agendas, exercises, the
room split, the decision card, the measured set-up time) from the chapters' stamps and glued
outputs, the datasheet and the set-up timing file; run it after re-stamping a chapter.
``check`` exits 1 when a committed page or the answers file differs from what ``write``
would give, or when a chapter no longer fits its agenda block.
``time-setup COMMAND`` runs the set-up command on a bare GPU machine, times it, and writes
``tests/gpu_results/setup_timing.json`` (only when it succeeds), which the set-up page shows.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time

from fp8lab.workshop import outputs
from tools.workshop import freeze, pages, plan

ROOT = outputs.ROOT


def write() -> int:
    """Write the frozen answers, then every generated page (some read the answers); return 0."""
    frozen = ROOT / "fp8lab" / "workshop" / "answers.json"
    if not frozen.is_file() or frozen.read_text() != freeze.frozen_text():
        frozen.write_text(freeze.frozen_text())
        print(f"wrote {frozen.relative_to(ROOT)}")
    for relative, text in pages.render().items():
        path = ROOT / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {relative}")
    return 0


def check() -> int:
    """Print what is stale or over budget; return 1 if anything is."""
    stale = [
        relative
        for relative, text in pages.render().items()
        if not (ROOT / relative).is_file() or (ROOT / relative).read_text() != text
    ]
    problems = [f"stale: {r} (run: python -m tools.workshop_pages write)" for r in stale]
    problems += [f"over budget: {p}" for p in plan.over_budget()]
    print("\n".join(problems) or "workshop pages up to date; every block fits its stamps")
    return 1 if problems else 0


def _gpu_name() -> str:
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown GPU"
    names = result.stdout.strip().splitlines()
    return names[0].strip() if result.returncode == 0 and names else "unknown GPU"


def time_setup(command: str) -> int:
    """Run ``command`` in bash, time it and record the time; return its exit status."""
    begin = time.perf_counter()
    status = subprocess.run(["bash", "-c", command], cwd=ROOT).returncode
    seconds = time.perf_counter() - begin
    if status != 0:
        print(f"the set-up command failed (exit {status}) after {seconds:.0f} s: not recorded")
        return status
    record = {
        "seconds": round(seconds, 1),
        "what": command,
        "gpu": _gpu_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    pages.SETUP_TIMING.write_text(json.dumps(record, indent=1) + "\n")
    print(f"set-up took {seconds:.0f} s; wrote {pages.SETUP_TIMING.relative_to(ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.workshop_pages", description=__doc__.splitlines()[0]
    )
    parser.add_argument("action", choices=("write", "check", "time-setup"))
    parser.add_argument("command", nargs="?", help="time-setup: the set-up command to time")
    args = parser.parse_args(argv)
    if (args.action == "time-setup") != bool(args.command):
        parser.error("give a command with time-setup, and only with it")
    if args.action == "time-setup":
        return time_setup(args.command)
    return write() if args.action == "write" else check()


if __name__ == "__main__":
    sys.exit(main())
