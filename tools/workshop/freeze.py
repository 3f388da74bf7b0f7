"""The frozen answers: what the grader holds answers to, written from the stamped chapters.

:func:`frozen_text` builds ``fp8lab/workshop/answers.json`` from the committed notebooks: for
each chapter, where it was stamped (GPU, its datasheet kind, date), the glued values the
exercises and the grader refer to, and the exercises with their hidden answers.
``python -m tools.workshop_pages write`` writes it with the pages after a chapter is
re-stamped, and the page test fails while it differs from what the notebooks hold, so the
shipped file always matches the book.
"""

from __future__ import annotations

import json

from fp8lab import datasheet
from fp8lab.workshop import answers
from tools.workshop import notebooks, plan


def _kind(gpu: str) -> str:
    try:
        return datasheet.gpu_spec(gpu).name
    except ValueError:
        return gpu


def chapter_entry(key: str) -> dict:
    """The frozen record of one chapter (see the module's docstring)."""
    record = notebooks.notebook(key).get("metadata", {}).get("fp8lab") or {}
    own = notebooks.exercises(key)
    extra = [(q, a) for ex, (q, a) in answers.EXTRA.items() if ex.startswith(key + ".")]
    texts = [e.question + "\n" + e.answer for e in own] + [q + "\n" + a for q, a in extra]
    names = [n for text in texts for n in notebooks.glue_names(text)]
    for ex, rule in answers.NUMERIC.items():
        if ex.startswith(key + "."):
            names += [rule.glue] + ([rule.spread] if rule.spread else [])
    glued = {
        name: notebooks.glued_text(key, name, "the frozen answers")
        for name in sorted(set(names))
    }
    gpu = str(record.get("gpu_name", "unknown GPU"))
    return {
        "notebook": notebooks.chapter_path(key).name,
        "gpu": gpu,
        "kind": _kind(gpu),
        "gpus": int(record.get("gpu_count") or 1),
        "date": str(record.get("date", "")),
        "code_sha256": str(record.get("code_sha256", "")),
        "glued": glued,
        "exercises": [
            {"key": e.key, "question": e.question, "answer": e.answer} for e in own
        ],
    }


def frozen_text() -> str:
    """The text of ``fp8lab/workshop/answers.json`` as the committed notebooks give it now."""
    body = {
        "about": "The workshop's answers, frozen from the GPU-stamped chapters; written by "
        "python -m tools.workshop_pages write, read by fp8lab.workshop.check.",
        "chapters": {key: chapter_entry(key) for key in plan.CHAPTERS},
    }
    return json.dumps(body, indent=1, ensure_ascii=False, sort_keys=False) + "\n"
