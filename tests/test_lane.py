"""The GPU-lane stamp: every chapter's committed outputs came from a GPU with TE, from its current
code and from the fp8lab code it imports now."""

import json
import shutil

import pytest

from tools import lane

CHAPTERS = lane.toc_notebooks()


def test_the_toc_lists_chapters():
    assert CHAPTERS and CHAPTERS[0].name == "00_your_gpu.ipynb"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_committed_outputs_come_from_the_gpu_lane(path):
    assert lane.problems(path) == []


def _copy_of_chapter(tmp_path):
    target = tmp_path / "chapter.ipynb"
    shutil.copy(CHAPTERS[0], target)
    return target


def test_changing_a_code_cell_breaks_the_stamp(tmp_path, fake_machine):
    path = _copy_of_chapter(tmp_path)
    lane.stamp(path, machine=fake_machine)
    notebook = lane.read(path)
    for cell in notebook["cells"]:  # the copy may be unexecuted; give it execution counts
        if cell["cell_type"] == "code":
            cell["execution_count"] = cell.get("execution_count") or 1
    path.write_text(json.dumps(notebook))
    assert lane.problems(path) == []
    code_cell = next(cell for cell in notebook["cells"] if cell["cell_type"] == "code")
    code_cell["source"] = "".join(code_cell["source"]) + "\nprint('changed')"
    path.write_text(json.dumps(notebook))
    assert any("code cells changed" in problem for problem in lane.problems(path))


def test_markdown_edits_and_trailing_space_keep_the_stamp(tmp_path):
    path = _copy_of_chapter(tmp_path)
    notebook = lane.read(path)
    before = lane.code_hash(notebook)
    next(c for c in notebook["cells"] if c["cell_type"] == "markdown")["source"] += "\nMore prose."
    next(c for c in notebook["cells"] if c["cell_type"] == "code")["source"] += "\n   \n"
    assert lane.code_hash(notebook) == before


def test_missing_stamp_error_output_and_cpu_stamp_are_reported(tmp_path, fake_machine):
    path = _copy_of_chapter(tmp_path)
    notebook = lane.read(path)
    notebook["metadata"].pop(lane.STAMP_KEY, None)
    path.write_text(json.dumps(notebook))
    assert "no GPU stamp" in lane.problems(path)[0]

    lane.stamp(path, machine=dict(fake_machine, transformer_engine=None))
    assert any("does not name a CUDA GPU" in p for p in lane.problems(path))

    lane.stamp(path, machine=fake_machine)
    notebook = lane.read(path)
    cell = next(c for c in notebook["cells"] if c["cell_type"] == "code")
    cell["outputs"] = [
        {"output_type": "error", "ename": "RuntimeError", "evalue": "boom", "traceback": []}
    ]
    path.write_text(json.dumps(notebook))
    assert any("error output" in p for p in lane.problems(path))


def test_stamping_refuses_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        lane.where_it_runs()


def test_library_modules_follow_imports_transitively():
    notebook = {
        "cells": [
            {"cell_type": "code", "source": "from fp8lab.memory import estimate\nimport fp8lab"}
        ]
    }
    modules = lane.library_modules(notebook)
    assert {"fp8lab", "fp8lab.memory", "fp8lab.flops", "fp8lab.config", "fp8lab.checks"} <= set(
        modules
    )
    assert {"fp8lab.environment", "fp8lab.book"} <= set(modules)  # the package's lazy names
    assert "fp8lab.reference" not in modules  # only import_te() reaches it, never on the GPU lane
    assert "fp8lab.speedometer" not in modules


def test_library_hash_ignores_docstrings_and_comments_but_not_code(tmp_path):
    package = tmp_path / "fp8lab"
    package.mkdir()
    (package / "__init__.py").write_text('"""Doc."""\n_LAZY = {}\n')
    module = package / "thing.py"
    module.write_text('"""Module doc."""\n\ndef f(x):\n    """Doc."""\n    return x + 1  # one\n')
    before = lane.library_hash(["fp8lab.thing"], root=tmp_path)
    module.write_text(
        '"""Other doc,\nlonger."""\n\n\ndef f(x):\n    """New doc."""\n    # a comment\n'
        "    return x + 1\n"
    )
    assert lane.library_hash(["fp8lab.thing"], root=tmp_path) == before
    module.write_text('"""Module doc."""\n\ndef f(x):\n    return x + 2\n')
    assert lane.library_hash(["fp8lab.thing"], root=tmp_path) != before


def test_a_changed_library_breaks_the_stamp(tmp_path, monkeypatch, fake_machine):
    path = _copy_of_chapter(tmp_path)
    lane.stamp(path, machine=fake_machine)
    record = lane.read(path)["metadata"][lane.STAMP_KEY]
    assert record["library_modules"] and len(record["library_sha256"]) == 64
    monkeypatch.setattr(lane, "library_hash", lambda modules, root=lane.ROOT: "0" * 64)
    assert any("fp8lab modules it imports" in p for p in lane.problems(path))


def test_a_stamp_must_record_the_gpus_a_chapter_needs(tmp_path, fake_machine):
    path = _copy_of_chapter(tmp_path)
    notebook = lane.read(path)
    notebook["metadata"][lane.GPUS_KEY] = 2
    path.write_text(json.dumps(notebook))
    lane.stamp(path, machine=fake_machine)
    assert any("it needs 2" in p for p in lane.problems(path))
