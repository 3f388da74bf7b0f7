"""The workshop kit's participant side: the exercises and the grader of numeric answers.

* :mod:`fp8lab.workshop.outputs` -- what the committed chapters hold: glued values and exercises
  (read from the ``.ipynb`` files, never typed)
* :mod:`fp8lab.workshop.answers` -- the exercises, and :func:`check`, the grader of numeric
  answers (the book's value within its measured spread)

``import fp8lab`` then ``fp8lab.workshop.check("03.4", 1.47)`` works: the package loads this
kit on first use. The agendas and the generated workshop pages are book machinery, in
``tools/workshop``. Nothing here imports torch.
"""

from fp8lab.workshop.answers import Grade, check, exercises, interval
from fp8lab.workshop.outputs import glued, reading

__all__ = ["Grade", "check", "exercises", "glued", "interval", "reading"]
