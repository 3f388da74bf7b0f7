"""The book helpers: glue without MyST-NB writes what MyST-NB's glue writes."""

import sys

import pytest

from fp8lab import book


def test_glue_writes_what_myst_nb_writes(monkeypatch):
    pytest.importorskip("myst_nb")
    import myst_nb.ext.glue as myst_glue

    shown_myst, shown_book = [], []
    monkeypatch.setattr(myst_glue, "ipy_display", lambda *a, **k: shown_myst.append((a, k)))
    monkeypatch.setattr(book, "ipy_display", lambda *a, **k: shown_book.append((a, k)))
    myst_glue.glue("answer", 42, display=False)
    book.glue("answer", 42, display=False)
    assert shown_book == shown_myst
    (bundle,), kwargs = shown_book[0]
    assert bundle == {"application/papermill.record/text/plain": "42"}
    assert kwargs["metadata"]["scrapbook"] == {"name": "answer", "mime_prefix": book.GLUE_PREFIX}


def test_a_glued_verdict_keeps_its_record(monkeypatch):
    from fp8lab import protocol
    from fp8lab.protocol.floor import Floor

    shown = []
    monkeypatch.setattr(book, "ipy_display", lambda *a, **k: shown.append((a, k)))
    floor = Floor("device", 0.02, 3, 1)
    verdict = protocol.Comparison("a", "b", (1.5, 1.5, 1.5), "wall", "device", floor)
    book.glue_verdict("gain", verdict)
    (bundle,), kwargs = shown[0]
    assert kwargs["metadata"]["fp8lab"] == verdict.record()
    assert verdict.phrase() in bundle["application/papermill.record/text/plain"]
    with pytest.raises(TypeError, match="verdict"):
        book.glue_verdict("gain", 1.5)


def test_number_formats():
    assert book.fmt(1234.6) == "1,235" and book.fmt(1234.4) == "1,234"
    assert book.fmt(4.2891, 2) == "4.29"
    assert book.pct(0.794) == "79%"
    assert book.fmt(float("nan")) == "n/a" and book.pct(float("inf")) == "n/a"
    with pytest.raises(TypeError, match="value='1'"):
        book.fmt("1")
    with pytest.raises(ValueError, match="digits=-1"):
        book.fmt(1.0, -1)


def test_progress_is_silent_inside_a_jupyter_kernel(monkeypatch):
    """A kernel forwards even the process's own stderr into the notebook: no bar there."""
    import types

    monkeypatch.delenv("FP8LAB_PROGRESS", raising=False)
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    assert book.progress(range(3)).disable is True
    monkeypatch.delitem(sys.modules, "ipykernel")
    assert book.progress(range(3)).disable is False
    assert list(book.progress(range(3))) == [0, 1, 2]


def test_glue_takes_several_values_at_once(monkeypatch):
    seen = {}
    monkeypatch.setattr(book, "_glue_one", lambda name, value, display: seen.update({name: value}))
    book.glue(speed="1.5", memory=3)
    assert seen == {"speed": "1.5", "memory": 3}
    with pytest.raises(TypeError, match="not both"):
        book.glue("x", 1, y=2)
    with pytest.raises(TypeError, match="name=value"):
        book.glue()


def test_no_chapter_builds_a_table_that_is_never_shown():
    """``book.table`` returns a Styler: Jupyter shows it only as a cell's last expression, so a
    call anywhere else (inside an ``if``, before other statements) needs ``display``."""
    import ast
    import json

    from tools import stamps

    dropped = []
    for path in stamps.toc_notebooks():
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] != "code":
                continue
            lines = [line for line in "".join(cell["source"]).splitlines()
                     if not line.lstrip().startswith(("%", "!"))]
            tree = ast.parse("\n".join(lines))
            last = tree.body[-1] if tree.body else None
            for node in ast.walk(tree):
                call = node.value if isinstance(node, ast.Expr) else None
                name = getattr(getattr(call, "func", None), "id", None)
                if name == "table" and node is not last:
                    dropped.append(f"{path.name} cell {index}, line {node.lineno}")
    assert not dropped, f"tables built but not displayed: {dropped}"
