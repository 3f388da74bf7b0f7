"""The workshop kit's participant side: the exercises and the grader of numeric answers.

* :mod:`fp8lab.workshop.outputs` -- the book's values and exercises, frozen from the stamped
  chapters into ``answers.json`` (shipped with the package; the notebooks are never read)
* :mod:`fp8lab.workshop.answers` -- the exercises, and :func:`check`, which grades exact and
  measured answers (measured ones against the participant's GPU kind where the book has it)
  and records predictions beside the book's value

``import fp8lab`` then ``fp8lab.workshop.check("00.1", 312)`` works: the package loads this
kit on first use. The agendas, the page writers and the freezing of the answers are book
machinery, in ``tools/workshop``. Nothing here imports torch at import time.
"""

from fp8lab.workshop.answers import Grade, check, exercises, interval, predictions
from fp8lab.workshop.outputs import glued, reading, stamp

__all__ = [
    "Grade", "check", "exercises", "glued", "interval", "predictions", "reading", "stamp",
]  # fmt: skip
