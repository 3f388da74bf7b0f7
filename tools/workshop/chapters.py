"""What the workshop pages read of a committed chapter beyond its graded answers: the stamped
run time, the title and headings, and glue roles filled in with the committed values.

The glued values and exercises are read by :mod:`tools.workshop.notebooks`; this module
builds on it.
"""

from __future__ import annotations

import re

from tools.workshop import notebooks as outputs


def stamped_run(chapter) -> dict:
    """The GPU stamp's facts for planning: ``seconds`` (the GPU lane's run time), ``gpu``,
    ``gpus`` and ``date``; ``ValueError`` where the chapter has no stamped run time."""
    metadata = outputs.notebook(chapter).get("metadata", {})
    record = metadata.get("fp8lab") or {}
    if not isinstance(record.get("lane_seconds"), (int, float)):
        raise ValueError(
            f"chapter={outputs.chapter_key(chapter)!r}: its notebook has no stamped run time "
            "(metadata fp8lab.lane_seconds); run the GPU lane on it"
        )
    return {
        "seconds": float(record["lane_seconds"]),
        "gpu": str(record.get("gpu_name", "unknown GPU")),
        "gpus": int(record.get("gpu_count") or 1),
        "date": str(record.get("date", "")),
    }


def title(chapter) -> str:
    """The chapter's title (its first ``#`` heading, without a leading number)."""
    for cell in outputs.notebook(chapter)["cells"]:
        for line in outputs.cell_source(cell).splitlines():
            if cell["cell_type"] == "markdown" and line.startswith("# "):
                return re.sub(r"^\d\d\s*·\s*", "", line[2:].strip())
    return outputs.chapter_path(chapter).stem


def sections(chapter) -> list[str]:
    """The chapter's ``##`` headings in order, Takeaways and Exercises left out."""
    found = []
    for cell in outputs.notebook(chapter)["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        for line in outputs.cell_source(cell).splitlines():
            heading = line[3:].strip() if line.startswith("## ") else ""
            if heading and heading not in ("Takeaways", "Exercises"):
                found.append(heading)
    return found


glue_names = outputs.glue_names


def resolve(markdown: str, chapter, used_by: str = "") -> str:
    """``markdown`` with each ``{glue:text}`name``` replaced by the chapter's committed value."""
    names = outputs.glue_names(markdown)
    values = {name: outputs.glued_text(chapter, name, used_by) for name in names}
    return outputs.GLUE_ROLE.sub(lambda m: values[m.group(1)], markdown)
