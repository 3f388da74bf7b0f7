"""What the committed chapters hold for the grader: glued values and exercises.

What :func:`fp8lab.workshop.check` holds an answer to is read here from the chapter's committed
``.ipynb`` (the outputs of its last GPU run), never typed: when a chapter is re-run and
re-stamped, the graded answers follow. Nothing here imports torch. (The workshop pages read
more of a chapter, its stamped run time and headings, in ``tools/workshop``.)

A value glued with :func:`fp8lab.book.glue` is stored as a display output whose metadata names
it (``scrapbook.name``) and whose data is the value's ``text/plain`` form, under the
``application/papermill.record/`` prefix unless it was displayed.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from fp8lab import checks

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
_GLUE_MIME = "text/plain"
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


def chapter_key(chapter) -> str:
    """The two-digit key of a chapter (``"05"``), checked against the committed notebooks."""
    if isinstance(chapter, bool) or not isinstance(chapter, (str, int)):
        raise TypeError(f"chapter={checks.show(chapter)}: must be a key such as '05'")
    key = f"{chapter:02d}" if isinstance(chapter, int) else chapter
    if not re.fullmatch(r"\d\d", key) or not list(NOTEBOOKS.glob(f"{key}_*.ipynb")):
        known = ", ".join(sorted(p.name[:2] for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")))
        raise ValueError(f"chapter={checks.show(chapter)}: no such chapter (known: {known})")
    return key


def chapter_path(chapter) -> Path:
    """The committed notebook of ``chapter``."""
    return sorted(NOTEBOOKS.glob(f"{chapter_key(chapter)}_*.ipynb"))[0]


@functools.lru_cache(maxsize=32)
def _notebook(path: Path, mtime: float) -> dict:
    return json.loads(path.read_text())


def notebook(chapter) -> dict:
    """The committed notebook of ``chapter`` as a dict (read once per change of the file)."""
    path = chapter_path(chapter)
    return _notebook(path, path.stat().st_mtime)


def cell_source(cell: dict) -> str:
    """A notebook cell's source as one string (a notebook stores it as a list of lines)."""
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _plain(text) -> str:
    text = "".join(text) if isinstance(text, list) else str(text)
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return value if isinstance(value, str) else text


def glued(chapter) -> dict[str, str]:
    """Every value the chapter's committed outputs glue, by name, as the page shows it."""
    values = {}
    for cell in notebook(chapter)["cells"]:
        for output in cell.get("outputs", []):
            name = (output.get("metadata") or {}).get("scrapbook", {}).get("name")
            if not name:
                continue
            data = output.get("data", {})
            text = next((v for k, v in data.items() if k.endswith(_GLUE_MIME)), None)
            if text is not None:
                values[name] = _plain(text)
    return values


def glued_text(chapter, name: str, used_by: str = "") -> str:
    """One glued value; a name the committed outputs no longer glue raises ``ValueError`` that
    says which chapter, glue name and user (``used_by``: an exercise, an agenda block)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name={checks.show(name)}: must be a glue name")
    values = glued(chapter)
    if name not in values:
        who = f"{used_by} reads" if used_by else "reading"
        raise ValueError(
            f"name={name!r}: {who} glue {name!r}, which chapter {chapter_key(chapter)}'s "
            f"committed outputs ({chapter_path(chapter).name}) no longer hold"
        )
    return values[name]


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


def _exercise_markdown(chapter) -> str:
    """The markdown from ``## Exercises`` to the next ``#``/``##`` heading (code cells skipped)."""
    parts, inside = [], False
    for cell in notebook(chapter)["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = cell_source(cell)
        if not inside and "## Exercises" in text:
            inside, text = True, text.split("## Exercises", 1)[1]
        elif inside and re.search(r"^##? ", text, re.MULTILINE):
            parts.append(re.split(r"^##? ", text, flags=re.MULTILINE)[0])
            break
        if inside:
            parts.append(text)
    return "\n".join(parts)


def exercises(chapter) -> list[Exercise]:
    """The chapter's own exercises: each numbered question with its dropdown answer."""
    key = chapter_key(chapter)
    pattern = re.compile(
        r"^(\d+)\.\s+(.*?)\n:::\{admonition\} Answer\n:class: dropdown\n(.*?)\n:::",
        re.MULTILINE | re.DOTALL,
    )
    found = []
    for match in pattern.finditer(_exercise_markdown(key)):
        question = " ".join(line.strip() for line in match.group(2).strip().splitlines())
        found.append(Exercise(f"{key}.{match.group(1)}", question, match.group(3).strip()))
    return found
