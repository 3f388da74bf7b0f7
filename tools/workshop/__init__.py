"""The workshop pages' machinery (not library): the plan of each chapter block and the four
timed agendas (:mod:`tools.workshop.plan`), what the pages read of the committed chapters
(:mod:`tools.workshop.chapters`), and the page writers (:mod:`tools.workshop.pages`), which
``python -m tools.workshop_pages write`` runs. The participant-facing grader,
:func:`fp8lab.workshop.check`, stays in the package.
"""
