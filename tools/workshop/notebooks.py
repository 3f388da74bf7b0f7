"""What the committed notebooks hold, for the workshop's book machinery (not for the grader).

The pages, the reading-time counts and the frozen answers file are built from the committed,
GPU-stamped chapters read here. The participant-facing grader (:mod:`fp8lab.workshop`) reads
only the frozen file that :func:`freeze` builds, never these notebooks.

A value glued with :func:`fp8lab.book.glue` is stored as a display output whose metadata names
it (``scrapbook.name``) and whose data is the value's ``text/plain`` form, under the
``application/papermill.record/`` prefix unless it was displayed.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from fp8lab import checks
from fp8lab.workshop.outputs import ROOT, Exercise, pick

NOTEBOOKS = ROOT / "notebooks"
_GLUE_MIME = "text/plain"
_HIDDEN = {"hide-input", "hide-cell", "remove-input", "remove-cell"}
GLUE_ROLE = re.compile(r"\{glue(?::text)?\}`([^`]+)`")


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
    where = f"chapter {{chapter}}'s committed outputs ({chapter_path(chapter).name}) no longer hold"
    return pick(glued, chapter, name, used_by, where)


def glue_names(markdown: str) -> list[str]:
    """The glue names a piece of MyST markdown refers to, in order."""
    if not isinstance(markdown, str):
        raise TypeError(f"markdown={checks.show(markdown)}: must be a string")
    return GLUE_ROLE.findall(markdown)


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


def _question_text(markdown: str) -> str:
    """A question's prose on one line each paragraph; a fenced code block kept whole, on lines
    of its own, its list-item indent removed."""
    pieces = re.split(r"(^[ \t]*```.*?^[ \t]*```[ \t]*$)", markdown, flags=re.MULTILINE | re.DOTALL)
    text = []
    for number, piece in enumerate(pieces):
        if number % 2:
            text.append(textwrap.dedent(piece).strip())
        elif piece.strip():
            text.append(" ".join(line.strip() for line in piece.strip().splitlines()))
    return "\n\n".join(text)


def exercises(chapter) -> list[Exercise]:
    """The chapter's own exercises: each numbered question with its dropdown answer."""
    key = chapter_key(chapter)
    pattern = re.compile(
        r"^(\d+)\.\s+(.*?)\n:::\{admonition\} Answer\n:class: dropdown\n(.*?)\n:::",
        re.MULTILINE | re.DOTALL,
    )
    found = []
    for match in pattern.finditer(_exercise_markdown(key)):
        question = _question_text(match.group(2))
        found.append(Exercise(f"{key}.{match.group(1)}", question, match.group(3).strip()))
    return found


@dataclass(frozen=True)
class Material:
    """What a reader goes through in part of a chapter: prose ``words``, visible ``code_lines``
    (non-blank lines of cells not collapsed), ``tables`` (markdown and rendered) and
    ``figures`` (image outputs)."""

    words: int = 0
    code_lines: int = 0
    tables: int = 0
    figures: int = 0

    def __add__(self, other: Material) -> Material:
        return Material(self.words + other.words, self.code_lines + other.code_lines,
                        self.tables + other.tables, self.figures + other.figures)  # fmt: skip


def _cell_material(cell: dict) -> Material:
    text = cell_source(cell)
    if cell["cell_type"] == "markdown":
        prose = GLUE_ROLE.sub("x", re.sub(r"\{[a-z:]+\}", "", text))
        rows = [line for line in prose.splitlines() if line.lstrip().startswith("|")]
        rules = sum(bool(re.fullmatch(r"\s*\|[\s:|-]+\|\s*", line)) for line in rows)
        words = len(re.findall(r"[A-Za-z0-9][\w'.,·×-]*", prose))
        return Material(words=words, tables=rules)
    if cell["cell_type"] != "code":
        return Material()
    tags = set(cell.get("metadata", {}).get("tags", []))
    lines = 0 if tags & _HIDDEN else sum(bool(line.strip()) for line in text.splitlines())
    tables = figures = 0
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        if (output.get("metadata") or {}).get("scrapbook"):
            continue
        figures += any(k.startswith("image/") for k in data)
        tables += "<table" in "".join(data.get("text/html", ""))
    return Material(0, lines, tables, figures)


def material(chapter, sections: tuple[str, ...] | None = None) -> Material:
    """The reading material of ``chapter`` before its Exercises: all of it, or, with
    ``sections``, the opening (before the first ``##``) plus the ``##`` sections whose heading
    starts with one of ``sections`` (an unknown prefix raises ``ValueError``)."""
    if sections is not None and (
        not isinstance(sections, tuple) or not all(isinstance(s, str) and s for s in sections)
    ):
        raise TypeError(f"sections={checks.show(sections)}: must be a tuple of heading prefixes")
    total, heading, seen = Material(), None, set()
    for cell in notebook(chapter)["cells"]:
        text = cell_source(cell)
        markdown = cell["cell_type"] == "markdown"
        found = re.findall(r"^## (.+)$", text, re.MULTILINE) if markdown else []
        if found:
            heading = found[0].strip()
        if heading in ("Takeaways", "Exercises"):
            break
        wanted = [s for s in sections or () if heading and heading.startswith(s)]
        seen.update(wanted)
        if sections is None or heading is None or wanted:
            total = total + _cell_material(cell)
        heading = found[-1].strip() if found else heading
    missing = set(sections or ()) - seen
    if missing:
        raise ValueError(
            f"sections={sections!r}: chapter {chapter_key(chapter)} has no section starting "
            f"with {sorted(missing)}"
        )
    return total
