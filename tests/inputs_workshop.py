"""Property-test entries for fp8lab.workshop and the workshop pages' machinery in tools/workshop
(read by tests/test_inputs.py)."""

from __future__ import annotations

import hypothesis.strategies as st

from fp8lab import workshop
from fp8lab.workshop import answers
from tests.property_support import Entry, maybe, reals
from tools.workshop import chapters, notebooks, pages, plan

CHAPTERS = st.sampled_from(sorted(plan.CHAPTERS))
GRADED = st.sampled_from(sorted(answers.NUMERIC))
TEXTS = st.sampled_from(["1,468", "81%", "1.45–1.48", "2.8e-03", "S = 16384", "0.5%"])

ENTRIES = {
    "workshop.check": Entry(
        lambda exercise, answer: workshop.check(exercise, answer).accepted,
        {"exercise": maybe(GRADED), "answer": maybe(reals(1e-3, 1e5))},
        signed=True,
        examples=30,
    ),
    "workshop.Grade": Entry(
        lambda exercise: workshop.check(exercise, workshop.interval(exercise)[0]),
        {"exercise": maybe(GRADED)},
        examples=10,
    ),
    "workshop.interval": Entry(
        lambda exercise: workshop.interval(exercise)[:3], {"exercise": maybe(GRADED)}
    ),
    "workshop.predictions": Entry(lambda: len(workshop.predictions()), {}, examples=2),
    "workshop.stamp": Entry(
        lambda chapter: workshop.stamp(chapter)["gpus"], {"chapter": maybe(CHAPTERS)}
    ),
    "tools.workshop.notebooks.material": Entry(
        lambda chapter: notebooks.material(chapter).words, {"chapter": maybe(CHAPTERS)}
    ),
    "workshop.exercises": Entry(
        lambda chapter: len(workshop.exercises(chapter)), {"chapter": maybe(CHAPTERS)}
    ),
    "workshop.glued": Entry(
        lambda chapter: len(workshop.glued(chapter)), {"chapter": maybe(CHAPTERS)}
    ),
    "tools.workshop.chapters.stamped_run": Entry(
        lambda chapter: chapters.stamped_run(chapter)["seconds"], {"chapter": maybe(CHAPTERS)}
    ),
    "tools.workshop.plan.need": Entry(
        lambda chapter, focus: plan.need(chapter, focus).total,
        {"chapter": maybe(CHAPTERS), "focus": maybe(st.booleans())},
    ),
    "tools.workshop.plan.agenda": Entry(
        lambda name: len(plan.agenda(name)),
        {"name": maybe(st.sampled_from(list(plan.AGENDAS)))},
    ),
    "tools.workshop.plan.over_budget": Entry(lambda: len(plan.over_budget()), {}, examples=2),
    "workshop.reading": Entry(
        lambda text: workshop.reading(text).value, {"text": maybe(TEXTS)}, signed=True
    ),
    "tools.workshop.pages.render": Entry(lambda: len(pages.render()), {}, examples=2),
    "tools.workshop.pages.setup_timing_fragment": Entry(
        lambda folder: len(pages.setup_timing_fragment(folder)),
        {"folder": maybe(st.just("tests/gpu_results"))},
        examples=10,
    ),
}
