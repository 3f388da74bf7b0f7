"""The re-run check of the chapters' verdicts (tools/verdicts.py) and its committed reports."""

import json
from pathlib import Path

import pytest

from fp8lab import protocol
from fp8lab.protocol.floor import FLIPPED, Floor
from tools import stamps, verdicts

FLOOR = Floor("device", 0.03, 3, 2)


def glue_output(name, verdict):
    """The output fp8lab.book.glue_verdict writes for ``verdict`` under ``name``."""
    return {
        "output_type": "display_data",
        "data": {"application/papermill.record/text/plain": repr(verdict.phrase())},
        "metadata": {"scrapbook": {"name": name, "mime_prefix": "application/papermill.record/"},
                     "fp8lab": verdict.record()},
    }


def notebook_with(**glued):
    cell = {"cell_type": "code", "source": "", "metadata": {}, "execution_count": 1,
            "outputs": [glue_output(name, value) for name, value in glued.items()]}
    return {"cells": [cell], "metadata": {}}


def speed(ratios):
    return protocol.Comparison("FP8", "BF16", tuple(ratios), "wall", "device", FLOOR)


def accuracy(offset):
    base = {s: 2.0 for s in range(5)}
    treated = {s: 2.0 + offset + 0.001 * (s % 2) for s in range(5)}
    return protocol.paired(treated, base, margin=0.01)


def test_the_records_glued_by_the_book_are_read_back(monkeypatch):
    from fp8lab import book

    shown = []
    monkeypatch.setattr(book, "ipy_display", lambda data, raw, metadata: shown.append(
        {"output_type": "display_data", "data": data, "metadata": metadata}))
    book.glue_verdict("fp8_gain", speed([1.5, 1.52, 1.49]))
    book.glue("plain_number", 3)  # no record: not a verdict
    found = verdicts.glued_records(
        {"cells": [{"cell_type": "code", "outputs": shown, "source": ""}]})
    assert list(found) == ["fp8_gain"]
    assert found["fp8_gain"]["verdict"] == "faster"
    assert found["fp8_gain"]["text"].startswith("1.50× faster")


def test_a_changed_word_is_a_flip_and_a_large_move_is_reported():
    stamped = verdicts.glued_records(notebook_with(
        gain=speed([1.50, 1.51, 1.49]), tie=speed([1.00, 1.005, 0.998]),
        drift=speed([1.50, 1.51, 1.49]), acc=accuracy(0.0)))
    rerun = verdicts.glued_records(notebook_with(
        gain=speed([1.52, 1.51, 1.50]),  # same word, within the floor
        tie=speed([1.10, 1.11, 1.09]),  # tied -> faster
        drift=speed([1.70, 1.71, 1.69]),  # faster both times, but 13% apart: beyond 3%
        acc=accuracy(0.05)))  # within -> worse beyond the margin
    rows = {row["name"]: row for row in verdicts.compare(stamped, rerun)}
    assert rows["gain"]["outcome"] == "held" and not rows["gain"]["moved"]
    assert rows["tie"]["outcome"] == "flipped"
    assert rows["drift"]["moved"] and rows["drift"]["outcome"] == "held"
    assert rows["acc"]["outcome"] == "flipped"


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ("faster", "faster", "held"),
        ("faster", "slower", "flipped"),
        ("tied", "faster", "flipped"),
        ("slower", "tied", "flipped"),
        ("faster", "not resolved", "weakened"),
        ("not resolved", "tied", "strengthened"),
        ("within the margin", "identical", "held"),
        ("within the margin", "worse beyond the margin", "flipped"),
        ("worse beyond the margin", "not resolved", "weakened"),
        (None, "faster", "flipped"),
    ],
)
def test_what_a_changed_word_does_to_the_claim(before, after, expected):
    assert verdicts.outcome(before, after) == expected


def test_a_verdict_that_appears_or_vanishes_counts_as_flipped():
    rows = verdicts.compare(verdicts.glued_records(notebook_with(a=speed([1.5, 1.5]))),
                            verdicts.glued_records(notebook_with(b=speed([1.5, 1.5]))))
    assert [r["flipped"] for r in rows] == [True, True]


def test_the_report_of_the_committed_stamp_is_found(tmp_path):
    chapter = tmp_path / "00_x.ipynb"
    record = {"code_sha256": "abc", "date": "2026-11-27 10:00 UTC"}
    chapter.write_text(json.dumps({"cells": [], "metadata": {"fp8lab": record}}))
    report = {"chapters": {"00_x.ipynb": {"stamp": dict(record), "flipped": 0, "verdicts": [],
                                         "rerun": {"gpu_name": "H", "date": "d"}}}}
    (tmp_path / "20261127-1100_h.json").write_text(json.dumps(report))
    assert verdicts.current(chapter, tmp_path)["flipped"] == 0
    record["date"] = "2026-11-28 10:00 UTC"  # re-stamped since: the report is stale
    chapter.write_text(json.dumps({"cells": [], "metadata": {"fp8lab": record}}))
    assert verdicts.current(chapter, tmp_path) is None


@pytest.mark.parametrize("path", stamps.toc_notebooks(), ids=lambda p: p.name)
def test_no_committed_chapter_flipped_on_its_rerun(path):
    """A chapter whose committed stamp was re-run in another GPU session kept every verdict,
    or each verdict that flipped has its own floor in the library (the rule that fixes a flip)
    and the chapter, which imports that rule, awaits its re-stamp (it is no longer fresh)."""
    again = verdicts.current(path)
    if again is None:
        pytest.skip("this stamp has not been re-run in a second GPU session")
    assert again["rerun"]["executed"]
    flipped = [r["name"] for r in again["verdicts"] if r["flipped"]]
    unruled = [name for name in flipped if name not in FLIPPED]
    assert not unruled, f"{path.name}: verdicts flipped on re-run: {unruled}"
    if flipped:
        assert stamps.notebook_status(path).state == stamps.PENDING, (
            f"{path.name}: {flipped} flipped; the chapter must be re-stamped under their own floors")


def test_a_rerun_writes_a_report_and_leaves_the_chapter_as_stamped(tmp_path, monkeypatch):
    """The whole re-run path, with the execution replaced by one that changes one verdict."""
    chapter = tmp_path / "00_x.ipynb"
    stamped = notebook_with(gain=speed([1.5, 1.52, 1.49]), tie=speed([1.0, 1.005, 0.998]))
    stamped["metadata"]["fp8lab"] = {"code_sha256": "abc", "date": "2026-11-27 10:00 UTC",
                                     "gpu_name": "H100", "gpu_count": 1}
    chapter.write_text(json.dumps(stamped))
    again = notebook_with(gain=speed([1.5, 1.51, 1.50]), tie=speed([1.2, 1.21, 1.19]))

    def execute(copy, environment):
        assert copy.name == "00_x.rerun.ipynb" and copy.exists()
        assert environment["CUDA_VISIBLE_DEVICES"] == "0"  # a one-GPU chapter, on GPU 0
        assert environment["FP8LAB_PRESET"] == "full"
        copy.write_text(json.dumps({**again, "metadata": stamped["metadata"]}))
        return True, 12.0

    monkeypatch.setattr(verdicts, "_execute", execute)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(stamps, "machine_in", lambda env: {"gpu_name": "H100", "gpu_count": 1})
    report_path, flips = verdicts.run([chapter], tmp_path / "reports")
    assert flips == 1
    assert json.loads(chapter.read_text()) == stamped  # the committed chapter is untouched
    assert not (tmp_path / "00_x.rerun.ipynb").exists()
    report = json.loads(report_path.read_text())["chapters"]["00_x.ipynb"]
    assert (report["held"], report["flipped"]) == (1, 1)
    assert report["stamp"]["code_sha256"] == "abc" and report["rerun"]["executed"]
    assert verdicts.current(chapter, tmp_path / "reports")["flipped"] == 1


def test_a_rerun_on_other_cards_than_the_stamp_is_refused_before_anything_runs(
        tmp_path, monkeypatch):  # fmt: skip
    chapter = tmp_path / "00_x.ipynb"
    stamped = notebook_with(gain=speed([1.5, 1.52, 1.49]))
    stamped["metadata"]["fp8lab"] = {"code_sha256": "abc", "date": "2026-11-27 10:00 UTC",
                                     "gpu_name": "NVIDIA H200", "gpu_count": 1}
    chapter.write_text(json.dumps(stamped))
    ran = []
    monkeypatch.setattr(verdicts, "_execute", lambda copy, env: ran.append(copy) or (True, 1.0))
    monkeypatch.setattr(stamps, "machine_in",
                        lambda env: {"gpu_name": "NVIDIA H100 80GB HBM3", "gpu_count": 1})
    with pytest.raises(ValueError, match="stamped on 1 x NVIDIA H200.*1 x NVIDIA H100"):
        verdicts.run([chapter], tmp_path / "reports")
    assert not ran and not (tmp_path / "reports").exists()


def _report_with(tmp_path, stamped, rerun):
    rows = verdicts.compare(verdicts.glued_records(notebook_with(**stamped)),
                            verdicts.glued_records(notebook_with(**rerun)))
    report = {"chapters": {"00_x.ipynb": {"verdicts": rows}}}
    (tmp_path / "20261127-1100_h.json").write_text(json.dumps(report))
    return tmp_path


def test_a_flipped_speed_verdict_gets_its_own_floor_from_both_readings(tmp_path):
    folder = _report_with(tmp_path, {"tie": speed([1.0, 1.005, 0.998]),
                                     "gain": speed([1.5, 1.52, 1.49])},
                          {"tie": speed([1.05, 1.048, 1.046]), "gain": speed([1.5, 1.5, 1.5])})
    found = verdicts.own_floors(folder)
    assert list(found) == ["tie"]  # the held verdict keeps its regime's floor
    high = speed([1.05, 1.048, 1.046]).high
    assert high - 1 <= found["tie"] < high - 1 + 0.005


def test_a_flipped_accuracy_verdict_is_left_to_a_person(tmp_path):
    folder = _report_with(tmp_path, {"acc": accuracy(0.0)}, {"acc": accuracy(0.05)})
    with pytest.raises(SystemExit, match="decide it by hand"):
        verdicts.own_floors(folder)


def test_a_comparison_judged_against_its_own_floor_reads_tied_in_both_sessions(monkeypatch):
    from fp8lab.protocol import floor as floor_module

    before, after = speed([1.0, 1.005, 0.998]), speed([1.05, 1.048, 1.046])
    assert (before.verdict, after.verdict) == ("tied", "faster")
    monkeypatch.setitem(floor_module.FLIPPED, "tie", 0.055)
    for reading in (before, after):
        again = protocol.judged("tie", reading)
        assert again.verdict == "tied" and again.floor.own
        assert "own session floor 5.5%" in again.phrase()
    assert protocol.judged("other", after) is after
    assert protocol.judged("tie", accuracy(0.0)).margin == 0.01


def test_the_library_holds_the_own_floors_of_the_committed_reports():
    assert verdicts.own_floors() == FLIPPED, "run python -m tools.verdicts floors --write"


@pytest.mark.parametrize("name", sorted(FLIPPED))
def test_each_own_floor_belongs_to_one_glued_verdict(name):
    """Own floors are keyed by glue name, so the name must be glued by one chapter only."""
    glued_by = [path.name for path in stamps.toc_notebooks()
                if name in verdicts.glued_records(json.loads(path.read_text()))]
    assert len(glued_by) == 1, f"{name} is glued by {glued_by or 'no chapter'}"


def test_a_named_file_reaches_the_kernel_as_an_absolute_path(tmp_path, monkeypatch):
    """The kernel runs in notebooks/: a relative path would name nothing there."""
    (tmp_path / "rerun.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    named = verdicts.named_files({"FP8LAB_E2E_SPEED_FILE": "rerun.json", "FP8LAB_PRESET": "x"})
    assert named == {"FP8LAB_E2E_SPEED_FILE": str(tmp_path / "rerun.json")}
    with pytest.raises(ValueError, match="FP8LAB_E2E_SPEED_FILE='gone.json': no such file"):
        verdicts.named_files({"FP8LAB_E2E_SPEED_FILE": "gone.json"})


def test_reports_of_one_minute_keep_their_own_files(tmp_path):
    chapters = [Path("07_memory.ipynb")], [Path("10_moe.ipynb")]
    first = verdicts.report_path(tmp_path, "nvidia-h200", chapters[0])
    first.write_text("{}")
    other = verdicts.report_path(tmp_path, "nvidia-h200", chapters[1])
    again = verdicts.report_path(tmp_path, "nvidia-h200", chapters[0])
    assert first.name.endswith("_nvidia-h200_07.json") and other.name.endswith("_10.json")
    assert again.name.endswith("_07-2.json")
