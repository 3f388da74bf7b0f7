"""The worker's command line: ``--plan PLAN.json --out FOLDER`` (what torchrun passes on)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROG = "python -m fp8lab.parallel.worker"


def parse(argv: list[str] | None = None) -> tuple[dict, Path]:
    """The plan (``{"tasks": [...]}``) and the output folder named by ``argv`` (default: this
    process's arguments); ``ValueError``/``TypeError`` naming ``argv`` when they are wrong."""
    if argv is not None and (
        not isinstance(argv, list) or not all(isinstance(a, str) for a in argv)
    ):
        raise TypeError(f"argv={argv!r}: must be a list of strings")
    given = sys.argv[1:] if argv is None else argv
    if "--plan" not in given or "--out" not in given:
        raise ValueError(f"argv={given!r}: needs --plan PLAN.json --out FOLDER")
    parser = argparse.ArgumentParser(prog=PROG)
    parser.add_argument("--plan", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    options, _ = parser.parse_known_args(argv)
    if not options.plan.exists():
        raise ValueError(f"argv: no plan file {options.plan}")
    return json.loads(options.plan.read_text()), options.out
