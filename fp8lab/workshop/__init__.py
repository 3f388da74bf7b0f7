"""The workshop kit: timed agendas, graded exercises and the generated workshop pages.

* :mod:`fp8lab.workshop.outputs` -- what the committed chapters hold: glued values, stamped run
  times, headings and exercises (read from the ``.ipynb`` files, never typed)
* :mod:`fp8lab.workshop.plan` -- each chapter block (prediction, discussion, expected numbers)
  and four agendas timed from the stamps
* :mod:`fp8lab.workshop.answers` -- the exercises, and :func:`check`, the grader of numeric
  answers (the book's value within its measured spread)
* :mod:`fp8lab.workshop.pages` -- the generated workshop pages of the book

Nothing here imports torch.
"""

from fp8lab.workshop.answers import Grade, check, exercises, interval
from fp8lab.workshop.outputs import glued, reading, stamped_run
from fp8lab.workshop.pages import render, setup_timing_fragment
from fp8lab.workshop.plan import agenda, need, over_budget

__all__ = [
    "Grade",
    "agenda",
    "check",
    "exercises",
    "glued",
    "interval",
    "need",
    "over_budget",
    "reading",
    "render",
    "setup_timing_fragment",
    "stamped_run",
]
