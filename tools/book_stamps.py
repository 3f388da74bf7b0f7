"""A Sphinx extension of the book: a chapter whose outputs are not fresh says so at its top.

The book shows committed outputs (``execute_notebooks: "off"``). Where a chapter's stamp is
pending (the library changed since its GPU run, or the run predates the one-cuDNN stack), the
page opens with a warning that names the date, the fp8lab hash and what changed
(:meth:`tools.stamps.Status.page_note`), so a reader never takes an old output for a current one.
"""

from __future__ import annotations

from pathlib import Path

from docutils import nodes

from tools import stamps

TITLES = {stamps.PENDING: "Outputs pending a re-run", stamps.BROKEN: "Outputs not from this code"}


def _note(status: stamps.Status) -> nodes.admonition:
    note = nodes.admonition(classes=["warning", f"fp8lab-{status.state}"])
    note += nodes.title(text=TITLES[status.state])
    note += nodes.paragraph(text=status.page_note())
    return note


def add_stamp_note(app, doctree) -> None:
    path = Path(app.srcdir) / f"{app.env.docname}.ipynb"
    if not path.is_file():
        return
    status = stamps.notebook_status(path)
    if status.state == stamps.FRESH:
        return
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None:
        doctree.insert(0, _note(status))
        return
    after_title = 1 if section.children and isinstance(section[0], nodes.title) else 0
    section.insert(after_title, _note(status))


def setup(app):
    app.connect("doctree-read", add_stamp_note)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
