"""What the grader holds answers to: the book's values, frozen when the chapters were stamped.

The answers live in ``answers.json`` beside this module, which ships with the package. It is
written from the committed, GPU-stamped notebooks by ``python -m tools.workshop_pages write``
(a test fails when it no longer matches them), so the grader never reads ``notebooks/*.ipynb``:
a participant's own run, autosaved over a chapter, cannot become the "right" answer, and the
grader works where no ``notebooks/`` folder exists at all. Nothing here imports torch.

For each chapter the file holds where its values were measured (GPU, its datasheet kind, the
date of the stamp), the glued values the exercises refer to (as the page shows them), and the
exercises with their hidden answers.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from fp8lab import checks

ROOT = Path(__file__).resolve().parents[2]
FROZEN = Path(__file__).with_name("answers.json")
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Reading:
    """A number as a glued text shows it: ``value`` (the first number), ``low``/``high`` (the
    two ends where the text is a range such as ``1.45–1.48``, else the value), and ``half_unit``,
    half the last shown digit (the rounding the text hides)."""

    text: str
    value: float
    low: float
    high: float
    half_unit: float


@dataclass(frozen=True)
class Exercise:
    """One exercise of a chapter: ``key`` such as ``"03.2"``, its question and its hidden answer
    (MyST markdown, glue roles unresolved)."""

    key: str
    question: str
    answer: str


@functools.lru_cache(maxsize=4)
def _load(path: Path, mtime: float) -> dict:
    return json.loads(path.read_text())


def frozen(path: Path | None = None) -> dict:
    """The frozen answers file as a dict (``path``: another copy of it, for tests)."""
    path = FROZEN if path is None else Path(path)
    if not path.is_file():
        raise ValueError(
            f"path={str(path)!r}: the frozen answers are missing; reinstall fp8lab "
            "(the file ships with the package)"
        )
    return _load(path, path.stat().st_mtime)


def chapter_key(chapter) -> str:
    """The two-digit key of a chapter (``"05"``), checked against the frozen answers."""
    if isinstance(chapter, bool) or not isinstance(chapter, (str, int)):
        raise TypeError(f"chapter={checks.show(chapter)}: must be a key such as '05'")
    key = f"{chapter:02d}" if isinstance(chapter, int) else chapter
    known = frozen()["chapters"]
    if key not in known:
        raise ValueError(
            f"chapter={checks.show(chapter)}: no such chapter (known: {', '.join(sorted(known))})"
        )
    return key


def stamp(chapter) -> dict:
    """Where the chapter's values were measured: ``gpu``, ``kind`` (its datasheet name, or
    the GPU's own name where the datasheet has none), ``gpus``, ``date`` and ``notebook``."""
    entry = frozen()["chapters"][chapter_key(chapter)]
    return {k: entry[k] for k in ("gpu", "kind", "gpus", "date", "notebook")}


def glued(chapter) -> dict[str, str]:
    """The frozen values of the chapter the exercises refer to, by glue name, as shown."""
    return dict(frozen()["chapters"][chapter_key(chapter)]["glued"])


def glued_text(chapter, name: str, used_by: str = "") -> str:
    """One frozen value; a name the file does not hold raises ``ValueError`` that says which
    chapter, glue name and user (``used_by``: an exercise, an agenda block)."""
    return pick(glued, chapter, name, used_by, "the frozen answers of chapter {chapter} do not "
                "hold (re-freeze after re-stamping the chapter)")


def pick(values_of, chapter, name: str, used_by: str, missing: str) -> str:
    """``values_of(chapter)[name]``, or a ``ValueError`` naming the glue, its user and where
    it is ``missing`` (a sentence with a ``{chapter}`` field)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name={checks.show(name)}: must be a glue name")
    values = values_of(chapter)
    if name not in values:
        who = f"{used_by} reads" if used_by else "reading"
        where = missing.format(chapter=chapter_key(chapter))
        raise ValueError(f"name={name!r}: {who} glue {name!r}, which {where}")
    return values[name]


def exercises(chapter) -> list[Exercise]:
    """The chapter's own exercises, frozen with its outputs."""
    rows = frozen()["chapters"][chapter_key(chapter)]["exercises"]
    return [Exercise(row["key"], row["question"], row["answer"]) for row in rows]


def reading(text: str) -> Reading:
    """The number in a glued text (``"1,468"``, ``"81%"``, ``"1.45–1.48"``, ``"2.8e-03"``)."""
    if not isinstance(text, str):
        raise TypeError(f"text={checks.show(text)}: must be the text of a glued value")
    found = list(_NUMBER.finditer(text))
    if not found:
        raise ValueError(f"text={text!r}: holds no number")
    values = [float(m.group().replace(",", "")) for m in found]
    first = found[0].group().replace(",", "")
    mantissa, _, exponent = first.lower().partition("e")
    digits = len(mantissa.partition(".")[2])
    half = 0.5 * 10.0 ** (-digits + (int(exponent) if exponent else 0))
    is_range = len(found) >= 2 and text[found[0].end() : found[1].start()].strip() in "–-"
    low, high = (min(values[:2]), max(values[:2])) if is_range else (values[0], values[0])
    return Reading(text, values[0], low, high, half)
