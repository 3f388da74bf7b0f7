"""Stamps: every chapter's committed outputs came from a GPU with TE and from its current code
cells (else broken); a library change since the run makes them pending, not broken."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from fp8lab import stamp
from tools import stamps

CHAPTERS = stamps.toc_notebooks()


def test_the_toc_lists_chapters():
    assert CHAPTERS and CHAPTERS[0].name == "00_your_gpu.ipynb"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_committed_outputs_come_from_the_gpu_lane(path):
    """Fresh or pending; never broken (no stamp, CPU stamp, changed code cells, errors)."""
    assert stamps.notebook_status(path).broken == ()


def _copy_of_chapter(tmp_path):
    target = tmp_path / "chapter.ipynb"
    shutil.copy(CHAPTERS[0], target)
    notebook = stamps.read(target)
    for cell in notebook["cells"]:  # the copy may be unexecuted; give it execution counts
        if cell["cell_type"] == "code":
            cell["execution_count"] = cell.get("execution_count") or 1
            cell["outputs"] = [o for o in cell.get("outputs", []) if o["output_type"] != "error"]
    target.write_text(json.dumps(notebook))
    return target


def test_changing_a_code_cell_breaks_the_stamp(tmp_path, fake_machine):
    path = _copy_of_chapter(tmp_path)
    stamps.stamp_notebook(path, machine=fake_machine)
    assert stamps.notebook_status(path).state == stamps.FRESH
    notebook = stamps.read(path)
    code_cell = next(cell for cell in notebook["cells"] if cell["cell_type"] == "code")
    code_cell["source"] = "".join(code_cell["source"]) + "\nprint('changed')"
    path.write_text(json.dumps(notebook))
    status = stamps.notebook_status(path)
    assert status.state == stamps.BROKEN
    assert any("code cells changed" in reason for reason in status.broken)


def test_markdown_edits_and_trailing_space_keep_the_stamp(tmp_path):
    path = _copy_of_chapter(tmp_path)
    notebook = stamps.read(path)
    before = stamps.code_hash(notebook)
    next(c for c in notebook["cells"] if c["cell_type"] == "markdown")["source"] += "\nMore prose."
    next(c for c in notebook["cells"] if c["cell_type"] == "code")["source"] += "\n   \n"
    assert stamps.code_hash(notebook) == before


def test_missing_stamp_error_output_and_cpu_stamp_are_broken(tmp_path, fake_machine):
    path = _copy_of_chapter(tmp_path)
    notebook = stamps.read(path)
    notebook["metadata"].pop(stamps.STAMP_KEY, None)
    path.write_text(json.dumps(notebook))
    assert "no GPU stamp" in stamps.notebook_status(path).broken[0]

    stamps.stamp_notebook(path, machine=dict(fake_machine, transformer_engine=None))
    assert any("does not name a CUDA GPU" in p for p in stamps.notebook_status(path).broken)

    stamps.stamp_notebook(path, machine=fake_machine)
    notebook = stamps.read(path)
    cell = next(c for c in notebook["cells"] if c["cell_type"] == "code")
    cell["outputs"] = [
        {"output_type": "error", "ename": "RuntimeError", "evalue": "boom", "traceback": []}
    ]
    path.write_text(json.dumps(notebook))
    assert any("error output" in p for p in stamps.notebook_status(path).broken)


def test_stamping_refuses_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        stamp.where_it_runs()


def test_library_modules_follow_imports_transitively():
    notebook = {
        "cells": [
            {"cell_type": "code", "source": "from fp8lab.memory import estimate\nimport fp8lab"}
        ]
    }
    modules = stamp.library_modules(notebook)
    assert {"fp8lab", "fp8lab.memory", "fp8lab.flops", "fp8lab.config", "fp8lab.checks"} <= set(
        modules
    )
    assert {"fp8lab.environment", "fp8lab.book"} <= set(modules)  # the package's lazy names
    assert "fp8lab.reference" not in modules  # only import_te() reaches it, never on the GPU lane
    # the book's verdict glue judges by the protocol's rule (its own floors), lazily imported
    assert "fp8lab.protocol.floor" in modules


def test_relative_imports_inside_a_subpackage_are_followed(tmp_path):
    package = tmp_path / "fp8lab"
    (package / "kit").mkdir(parents=True)
    (package / "__init__.py").write_text("_LAZY = {}\n")
    (package / "kit" / "__init__.py").write_text("from .part import thing\n")
    (package / "kit" / "part.py").write_text("from ..base import x\nthing = x\n")
    (package / "base.py").write_text("x = 1\n")
    notebook = {"cells": [{"cell_type": "code", "source": "from fp8lab.kit import thing"}]}
    assert stamp.library_modules(notebook, root=tmp_path) == [
        "fp8lab",
        "fp8lab.base",
        "fp8lab.kit",
        "fp8lab.kit.part",
    ]


def test_library_hash_ignores_docstrings_and_comments_but_not_code(tmp_path):
    package = tmp_path / "fp8lab"
    package.mkdir()
    (package / "__init__.py").write_text('"""Doc."""\n_LAZY = {}\n')
    module = package / "thing.py"
    module.write_text('"""Module doc."""\n\ndef f(x):\n    """Doc."""\n    return x + 1  # one\n')
    before = stamp.library_hash(["fp8lab.thing"], root=tmp_path)
    module.write_text(
        '"""Other doc,\nlonger."""\n\n\ndef f(x):\n    """New doc."""\n    # a comment\n'
        "    return x + 1\n"
    )
    assert stamp.library_hash(["fp8lab.thing"], root=tmp_path) == before
    module.write_text('"""Module doc."""\n\ndef f(x):\n    return x + 2\n')
    assert stamp.library_hash(["fp8lab.thing"], root=tmp_path) != before


def test_a_changed_library_makes_the_outputs_pending_and_names_the_module(
    tmp_path, monkeypatch, fake_machine
):
    path = _copy_of_chapter(tmp_path)
    stamps.stamp_notebook(path, machine=fake_machine)
    record = stamps.read(path)["metadata"][stamps.STAMP_KEY]
    assert record["library_modules"] and len(record["library_sha256"]) == 64
    hashes = stamp.module_hashes

    def one_changed(modules, root=stamp.ROOT):
        return {**hashes(modules, root), "fp8lab.flops": "0" * 64}

    monkeypatch.setattr(stamp, "module_hashes", one_changed)
    status = stamps.notebook_status(path)
    assert status.state == stamps.PENDING and status.changed == ("fp8lab.flops",)
    assert "fp8lab.flops" in status.page_note() and "re-run pending" in status.page_note()


def test_a_module_gone_since_the_run_makes_a_result_pending_not_broken(fake_machine):
    """A module the stamp recorded that has moved (a module turned package, a split) is a
    change of the library: pending, named once, with or without per-module hashes."""
    record = stamp.stamp_record(["fp8lab.checks"], fake_machine)
    record["library_modules"].append("fp8lab.moved_away")
    record["module_sha256"]["fp8lab.moved_away"] = "0" * 64
    status = stamps.record_status(record, "result.csv")
    assert status.state == stamps.PENDING and status.changed == ("fp8lab.moved_away",)
    del record["module_sha256"]
    status = stamps.record_status(record, "result.csv")
    assert status.state == stamps.PENDING and status.changed == ("fp8lab.moved_away",)


def test_excluding_a_package_excludes_its_submodules():
    notebook = {"cells": [{"cell_type": "code", "source": "from fp8lab.memory import estimate"}]}
    modules = stamp.library_modules(notebook, exclude=("fp8lab.memory",))
    assert not [m for m in modules if m == "fp8lab.memory" or m.startswith("fp8lab.memory.")]


def test_a_stamp_without_one_cudnn_is_pending(tmp_path, fake_machine):
    path = _copy_of_chapter(tmp_path)
    old = {k: v for k, v in fake_machine.items() if not k.startswith("cudnn")}
    stamps.stamp_notebook(path, machine=old)
    assert "cuDNN" in stamps.notebook_status(path).pending[0]
    stamps.stamp_notebook(path, machine=dict(fake_machine, cudnn="9.14.0"))
    assert "two cuDNNs" in stamps.notebook_status(path).pending[0]


def test_a_stamp_must_record_the_gpus_a_chapter_needs(tmp_path, fake_machine):
    path = _copy_of_chapter(tmp_path)
    notebook = stamps.read(path)
    notebook["metadata"][stamps.GPUS_KEY] = 2
    path.write_text(json.dumps(notebook))
    stamps.stamp_notebook(path, machine=fake_machine)
    assert any("it needs 2" in p for p in stamps.notebook_status(path).broken)


def test_check_stamps_lists_every_chapter_and_passes_when_none_is_broken(root):
    done = subprocess.run(
        [sys.executable, "-m", "tools.lane", "check"], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for path in CHAPTERS:
        assert path.name in done.stdout
    assert "broken" in done.stdout.splitlines()[-1]


def test_the_lane_cli_refuses_a_missing_notebook(root):
    done = subprocess.run(
        [sys.executable, "-m", "tools.lane", "check", "notebooks/nope.ipynb"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "no such notebook" in done.stderr


def test_a_chapter_runs_on_the_first_gpus_it_needs_unless_the_caller_chose(tmp_path):
    path = _copy_of_chapter(tmp_path)
    assert stamps.pinned_environment(path, {"A": "1"}) == {"A": "1", "CUDA_VISIBLE_DEVICES": "0"}
    notebook = stamps.read(path)
    notebook["metadata"][stamps.GPUS_KEY] = 2
    path.write_text(json.dumps(notebook))
    assert stamps.pinned_environment(path, {})["CUDA_VISIBLE_DEVICES"] == "0,1"
    chosen = {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert stamps.pinned_environment(path, chosen) == chosen


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal off the GPU")
def test_the_lane_stamps_nothing_without_a_gpu(tmp_path, capsys):
    from tools import lane

    path = _copy_of_chapter(tmp_path)
    before = path.read_text()
    with pytest.raises(RuntimeError, match="CUDA"):
        stamps.machine_in(dict(os.environ))
    assert lane.run([path]) == 1
    assert "no GPU to stamp on" in capsys.readouterr().out
    assert path.read_text() == before  # not executed, not stamped


def test_a_chapter_run_in_parts_is_stamped_with_the_time_of_every_part(
        tmp_path, monkeypatch, fake_machine):
    from tools import lane

    path = _copy_of_chapter(tmp_path)
    cache = tmp_path / "jobs"
    monkeypatch.setenv("FP8LAB_JOB_CACHE", str(cache))
    monkeypatch.setattr(stamps, "machine_in", lambda environment: fake_machine)
    outcomes = iter([False, True])  # the first part stops on its budget, the second ends
    monkeypatch.setattr(lane, "execute", lambda path, environment: next(outcomes))
    clock = iter([0.0, 100.0, 200.0, 230.0])
    monkeypatch.setattr(lane.time, "perf_counter", lambda: next(clock))
    assert lane.run([path]) == 1
    assert json.loads((cache / f"{path.stem}.lane.json").read_text()) == {
        "seconds": 100.0, "parts": 1}
    assert lane.run([path]) == 0
    record = stamps.read(path)["metadata"][stamps.STAMP_KEY]
    assert record["lane_seconds"] == 130.0 and record["lane_parts"] == 2
    assert not (cache / f"{path.stem}.lane.json").exists()


def test_the_lane_refuses_a_chapter_on_fewer_gpus_than_it_needs(
        tmp_path, monkeypatch, fake_machine, capsys):  # fmt: skip
    from tools import lane

    path = _copy_of_chapter(tmp_path)
    before = path.read_text()
    monkeypatch.setattr(stamps, "machine_in", lambda environment: fake_machine)  # one GPU
    monkeypatch.setattr(stamps, "gpus_needed", lambda chapter: 2)
    ran = []
    monkeypatch.setattr(lane, "execute", lambda path, environment: ran.append(path) or True)
    assert lane.run([path]) == 1
    assert "needs 2 GPUs and this process sees 1" in capsys.readouterr().out
    assert not ran and path.read_text() == before
