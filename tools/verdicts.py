"""Do the chapters' verdicts survive a re-run? ``python -m tools.lane verdicts NOTEBOOK ...``.

On a GPU box, each chapter is executed again (full preset) into a copy beside it, in a GPU
session other than the one that stamped it, and every verdict its prose glues
(:func:`fp8lab.book.glue_verdict`) is compared with the stamped one. Each lands in one of:

* **held** -- the same word;
* **flipped** -- the re-run contradicts the stamped claim: a difference in the other direction
  (faster against slower, worse against better beyond the margin), a difference where the book
  claimed none (faster or slower against tied; worse or better against within the margin), or
  the reverse; a verdict present in one run only;
* **weakened** -- the re-run could not resolve what the stamp claimed (its word is "not
  resolved"), or **strengthened** -- the reverse: the text changes, the claim is not
  contradicted; both are listed;
* **moved** (beside any of these) -- the estimate moved by more than the floor it was judged
  against (a speed ratio beyond its session floor; an accuracy difference by more than its
  margin): the number the prose states as a result would read differently.

The report (one JSON file, ``tests/gpu_results/verdicts/``) names both sessions (GPU, date) and
the code hash of each chapter, so that a check on the CPU lane can tell whether it still
describes the committed chapters. The committed notebooks are left as stamped.

A speed verdict that flipped is not re-rolled: ``python -m tools.verdicts floors --write`` gives
it its own floor in :data:`fp8lab.protocol.floor.FLIPPED` (the widest departure from 1 of either
session's interval), so that the re-stamped chapter states it as "tied" with that floor.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOOR_MODULE = ROOT / "fp8lab" / "protocol" / "floor.py"
FLIPPED_PATTERN = re.compile(r"^FLIPPED: dict\[str, float\] = \{.*?^\}\n|"
                             r"^FLIPPED: dict\[str, float\] = \{\}\n", re.M | re.S)
FOLDER = ROOT / "tests" / "gpu_results" / "verdicts"
RERUN_SUFFIX = ".rerun.ipynb"
STAMP_KEY = "fp8lab"


def glued_records(notebook: dict) -> dict[str, dict]:
    """Every verdict a notebook glued: ``{name: {"text": ..., **record}}``, in cell order."""
    found = {}
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else ():
            metadata = output.get("metadata") or {}
            name = (metadata.get("scrapbook") or {}).get("name")
            record = metadata.get("fp8lab")
            if not name or not isinstance(record, dict):
                continue
            data = output.get("data") or {}
            text = next((v for k, v in data.items() if k.endswith("text/plain")), "")
            text = "".join(text) if isinstance(text, list) else text
            found[name] = {"text": text.strip("'\""), **record}
    return found


DIFFERENCES = {"faster", "slower", "worse beyond the margin", "better beyond the margin"}
NO_DIFFERENCE = {"tied", "within the margin", "identical"}
UNRESOLVED = "not resolved"


def outcome(before: str | None, after: str | None) -> str:
    """``held``, ``flipped``, ``weakened`` or ``strengthened``: what the re-run's word does to
    the stamped one (a verdict missing on either side counts as flipped)."""
    if before is None or after is None:
        return "flipped"
    same = {"identical": "within the margin"}
    before, after = same.get(before, before), same.get(after, after)
    if before == after:
        return "held"
    if after == UNRESOLVED:
        return "weakened"
    if before == UNRESOLVED:
        return "strengthened"
    return "flipped"  # two different claims: directions, or a difference against none


def _moved(stamped: dict, rerun: dict) -> bool:
    """Whether the estimate moved beyond what the verdict was judged against."""
    a, b = stamped.get("estimate"), rerun.get("estimate")
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return False
    if stamped.get("kind") == "speed":
        floor = stamped.get("floor")  # None: no floor measured, so nothing to move beyond
        return floor is not None and a > 0 and b > 0 and abs(math.log(b / a)) > math.log1p(floor)
    margin = stamped.get("margin")
    return margin is not None and abs(b - a) > margin


def compare(stamped: dict[str, dict], rerun: dict[str, dict]) -> list[dict]:
    """One row per verdict of either run: both words and estimates, flipped, moved."""
    rows = []
    for name in list(stamped) + [n for n in rerun if n not in stamped]:
        a, b = stamped.get(name), rerun.get(name)
        row = {"name": name, "kind": (a or b).get("kind")}
        row["stamped"] = None if a is None else {k: a.get(k) for k in ("verdict", "estimate",
                                                                        "low", "high", "text")}
        row["rerun"] = None if b is None else {k: b.get(k) for k in ("verdict", "estimate",
                                                                     "low", "high", "text")}
        row["outcome"] = outcome((a or {}).get("verdict"), (b or {}).get("verdict"))
        row["flipped"] = row["outcome"] == "flipped"
        row["moved"] = a is not None and b is not None and _moved(a, b)
        row["floor" if row["kind"] == "speed" else "margin"] = (a or b).get(
            "floor" if row["kind"] == "speed" else "margin")
        rows.append(row)
    return rows


def _execute(copy: Path, environment: dict[str, str]) -> tuple[bool, float]:
    from tools.lane import execute  # the lane's one executor (tools.lane imports this module)

    begin = time.perf_counter()
    done = execute(copy, environment)
    return done, time.perf_counter() - begin


def _same_cards(path: Path) -> tuple[dict, dict, dict, dict]:
    """The committed chapter, its stamp, its pinned environment and the GPUs it would re-run
    on; a ValueError when those are not the cards it was stamped on."""
    from tools import stamps

    committed = json.loads(path.read_text())
    record = committed["metadata"].get(STAMP_KEY) or {}
    environment = stamps.pinned_environment(
        path, dict(os.environ, FP8LAB_PRESET="full", **named_files(os.environ)))
    machine = stamps.machine_in(environment)  # the GPUs the chapter runs on, as it sees them
    stamped_on = (record.get("gpu_name"), record.get("gpu_count"))
    if stamped_on != (machine["gpu_name"], machine["gpu_count"]):
        raise ValueError(
            f"{path.name}: stamped on {stamped_on[1]} x {stamped_on[0]}, and this process sees "
            f"{machine['gpu_count']} x {machine['gpu_name']}: a verdict re-run compares like "
            "with like, so run it on the stamp's cards (or re-stamp here, then re-run in a "
            "later session)")
    return committed, record, environment, machine


def named_files(environment: dict[str, str]) -> dict[str, str]:
    """The ``FP8LAB_*_FILE`` variables of ``environment`` as absolute paths. The chapter's
    kernel runs in ``notebooks/``, so a path given relative to where the command runs would
    name nothing there, and the chapter would read no measurement; a ValueError when a named
    file does not exist."""
    named = {}
    for key, value in environment.items():
        if key.startswith("FP8LAB_") and key.endswith("_FILE") and value:
            target = Path(value).resolve()
            if not target.is_file():
                raise ValueError(f"{key}={value!r}: no such file (from {Path.cwd()})")
            named[key] = str(target)
    return named


def report_path(folder: Path, gpu: str, paths: list[Path]) -> Path:
    """A new report file in ``folder``: the minute, the GPU and the chapters' numbers, so that
    re-runs of other chapters in the same minute (on other GPUs of one box) keep their own
    reports; a second one of the same chapters in that minute gets a counter."""
    chapters = "-".join(path.stem.split("_")[0] for path in paths)
    stem = f"{datetime.datetime.now(datetime.timezone.utc):%Y%m%d-%H%M}_{gpu}_{chapters}"
    target, count = folder / f"{stem}.json", 1
    while target.exists():
        count += 1
        target = folder / f"{stem}-{count}.json"
    return target


def rerun(path: Path, checked: tuple | None = None) -> dict:
    """Execute ``path`` into a copy beside it and compare its verdicts with the stamped ones
    (``checked``: what :func:`_same_cards` already returned for it)."""
    committed, record, environment, machine = checked or _same_cards(path)
    copy = path.with_name(path.stem + RERUN_SUFFIX)
    copy.write_text(path.read_text())
    try:
        ok, seconds = _execute(copy, environment)
        again = json.loads(copy.read_text())
    finally:
        copy.unlink(missing_ok=True)
    rows = compare(glued_records(committed), glued_records(again)) if ok else []
    return {
        "stamp": {k: record.get(k) for k in ("gpu_name", "gpu_count", "date", "code_sha256",
                                             "library_sha256", "lane_seconds")},
        "rerun": {"gpu_name": machine["gpu_name"], "gpu_count": machine["gpu_count"],
                  "date": _now(), "seconds": round(seconds, 1), "executed": ok},
        "verdicts": rows,
        **{key: sum(r["outcome"] == key for r in rows) if ok else None
           for key in ("held", "flipped", "weakened", "strengthened")},
        "moved": sum(r["moved"] for r in rows) if ok else None,
    }


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def run(paths: list[Path], folder: Path = FOLDER) -> tuple[Path, int]:
    """Re-run every chapter in ``paths``; write the report; return it and the flips found."""
    checked = {path: _same_cards(path) for path in paths}  # refuse before anything runs
    chapters = {}
    for path in paths:
        chapters[path.name] = report = rerun(path, checked[path])
        state = "FAILED" if not report["rerun"]["executed"] else (
            f"{len(report['verdicts'])} verdicts: {report['held']} held, {report['flipped']} "
            f"flipped, {report['weakened']} weakened, {report['strengthened']} strengthened; "
            f"{report['moved']} moved beyond their floor")
        print(f"{path.name}: {state}", flush=True)
        for row in report["verdicts"]:
            if row["outcome"] != "held" or row["moved"]:
                before = (row["stamped"] or {}).get("text")
                after = (row["rerun"] or {}).get("text")
                print(f"  {row['outcome']}{' (moved)' if row['moved'] else ''} {row['name']}: "
                      f"{before!r} -> {after!r}", flush=True)
    names = [c["rerun"]["gpu_name"] for c in chapters.values()] or ["gpu"]
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", names[0]).strip("-").lower()
    folder.mkdir(parents=True, exist_ok=True)
    target = report_path(folder, gpu, paths)
    target.write_text(json.dumps({"chapters": chapters}, indent=1) + "\n")
    flips = sum(c["flipped"] or 0 for c in chapters.values())
    failed = sum(not c["rerun"]["executed"] for c in chapters.values())
    return target, flips + failed


def reports(folder: Path = FOLDER) -> list[tuple[Path, dict]]:
    """The committed reports, oldest first."""
    return [(p, json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))]


def current(path: Path, folder: Path = FOLDER) -> dict | None:
    """The newest report of chapter ``path`` that re-ran its committed stamp, or None."""
    record = json.loads(Path(path).read_text())["metadata"].get(STAMP_KEY) or {}
    for _, report in reversed(reports(folder)):
        chapter = report["chapters"].get(Path(path).name)
        if chapter and chapter["stamp"].get("code_sha256") == record.get("code_sha256") and (
            chapter["stamp"].get("date") == record.get("date")
        ):
            return chapter
    return None


def own_floors(folder: Path = FOLDER) -> dict[str, float]:
    """Every speed verdict that flipped in a committed report, with its own floor: the widest
    departure from 1 that an interval of either session reached, rounded up to half a percent
    (the largest over the reports). A flipped accuracy verdict is refused: its margin is
    declared before the runs, so it is re-thought, not widened by a rule."""
    from fp8lab.protocol.floor import round_up

    found: dict[str, float] = {}
    for path, report in reports(folder):
        for chapter, result in report["chapters"].items():
            for row in result["verdicts"]:
                if not row["flipped"]:
                    continue
                sides = [row["stamped"], row["rerun"]]
                if row["kind"] != "speed" or None in sides:
                    raise SystemExit(f"{path.name}: {chapter} {row['name']} flipped and is not "
                                     "a speed ratio read in both sessions; decide it by hand")
                ends = [v for side in sides for v in (side["low"], side["high"])]
                if any(not isinstance(v, (int, float)) or v <= 0 for v in ends):
                    raise SystemExit(f"{path.name}: {chapter} {row['name']} has no interval")
                widest = max(max(v, 1 / v) for v in ends) - 1
                found[row["name"]] = max(found.get(row["name"], 0.0), round_up(widest))
    return dict(sorted(found.items()))


def write_floors(folder: Path = FOLDER) -> dict[str, float]:
    """Put :func:`own_floors` into :data:`fp8lab.protocol.floor.FLIPPED`."""
    found = own_floors(folder)
    lines = ["FLIPPED: dict[str, float] = {", *(f"    {k!r}: {v!r}," for k, v in found.items())]
    block = "\n".join([*lines, "}"]) + "\n" if found else "FLIPPED: dict[str, float] = {}\n"
    text, count = FLIPPED_PATTERN.subn(block, FLOOR_MODULE.read_text(), count=1)
    if count != 1:
        raise SystemExit(f"no FLIPPED block found in {FLOOR_MODULE}")
    FLOOR_MODULE.write_text(text)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.verdicts",
                                     description="Own floors of the verdicts that flipped.")
    parser.add_argument("action", choices=("floors",))
    parser.add_argument("--write", action="store_true", help="update the library's table")
    args = parser.parse_args(argv)
    found = write_floors() if args.write else own_floors()
    for name, floor in found.items():
        print(f"{name:40s} own floor {floor:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
