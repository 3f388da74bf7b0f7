"""The workshop pages: write them from the committed notebooks, or check the committed ones.

``python -m tools.workshop_pages write`` writes the frozen answers the grader reads
(``fp8lab/workshop/answers.json``) and the generated workshop pages (agendas, exercises, the
room split, the decision card, the measured set-up time) from the chapters' stamps and glued
outputs, the datasheet and the set-up timing file; run it after re-stamping a chapter.
``check`` exits 1 when a committed page or the answers file differs from what ``write``
would give, or when a chapter no longer fits its agenda block.
The set-up time the pages show is measured by ``tools/setup_bare.py``.
"""

from __future__ import annotations

import argparse
import sys

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.workshop_pages", description=__doc__.splitlines()[0]
    )
    parser.add_argument("action", choices=("write", "check"))
    args = parser.parse_args(argv)
    return write() if args.action == "write" else check()


if __name__ == "__main__":
    sys.exit(main())
