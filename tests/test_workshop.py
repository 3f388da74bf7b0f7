"""The workshop kit: agendas fit the chapters' stamps, every answer comes from the committed
outputs, the grader accepts the book's value within its spread, the pages are up to date."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest

import fp8lab
from fp8lab import datasheet, workshop
from fp8lab.workshop import answers, outputs
from tools import stamps, workshop_pages
from tools.workshop import chapters, pages, plan

CHAPTER_KEYS = [path.name[:2] for path in stamps.toc_notebooks()]


# --- agendas against the stamps ---------------------------------------------------------------


def test_every_chapter_of_the_book_has_a_block():
    assert sorted(plan.CHAPTERS) == sorted(CHAPTER_KEYS)


def test_every_block_fits_its_chapters_stamped_run_time():
    assert plan.over_budget() == []


@pytest.mark.parametrize("key", CHAPTER_KEYS)
def test_a_blocks_run_time_is_the_stamp(key):
    record = outputs.notebook(key)["metadata"]["fp8lab"]
    need = plan.need(key)
    assert need.seconds == record["lane_seconds"]
    assert need.run == max(1, math.ceil(record["lane_seconds"] / 60))


def test_a_slower_chapter_overruns_its_block(monkeypatch):
    real = chapters.stamped_run
    slow = lambda chapter: {**real(chapter), "seconds": 3600.0}  # noqa: E731
    monkeypatch.setattr(chapters, "stamped_run", slow)
    problems = plan.over_budget()
    assert problems and all("allotted" in p for p in problems)


def test_the_agendas_have_their_lengths():
    assert plan.agenda_minutes("taster") == 90
    assert plan.agenda_minutes("session") == 180
    assert plan.agenda_minutes("day") <= 8 * 60
    course = plan.agenda("course")
    assert {slot.day for slot in course} == {1, 2}
    assert "08" in {slot.block.chapter for slot in course}


def test_the_two_gpu_chapter_is_stamped_on_two_gpus():
    assert plan.need("08").gpus == 2


# --- exercises and answers --------------------------------------------------------------------


@pytest.mark.parametrize("key", CHAPTER_KEYS)
def test_each_chapter_has_three_exercises_with_answers(key):
    found = answers.exercises(key)
    assert len(found) >= 3, f"chapter {key}: {len(found)} exercises"
    for exercise in found:
        assert exercise.question.strip() and exercise.answer.strip(), exercise.key


@pytest.mark.parametrize("key", CHAPTER_KEYS)
def test_every_number_in_an_answer_comes_from_the_committed_outputs(key):
    """Every glue an exercise refers to is in the committed outputs (or it fails, naming it)."""
    for exercise in answers.exercises(key):
        text = chapters.resolve(exercise.question + exercise.answer, key, exercise.key)
        assert "{glue" not in text


@pytest.mark.parametrize("key", sorted(answers.NUMERIC))
def test_a_graded_answer_is_the_one_the_page_shows(key):
    """The grader reads the glue the answer shows, or (a value derived from a glue) the page
    states the graded value beside the answer."""
    exercise = next(e for e in answers.exercises(key[:2]) if e.key == key)
    rule = answers.NUMERIC[key]
    assert rule.glue in chapters.glue_names(exercise.answer) or rule.factor != 1.0
    expected = answers.interval(key)[0]
    assert f'check("{key}", answer)` accepts' in pages.exercises_page()
    assert f"(book: {expected:.4g};" in pages.exercises_page()


@pytest.mark.parametrize("key", sorted(answers.NUMERIC))
def test_the_grader_accepts_the_books_value_and_refuses_far_ones(key):
    expected, low, high, basis = answers.interval(key)
    glued = outputs.reading(outputs.glued_text(key[:2], answers.NUMERIC[key].glue))
    assert expected == pytest.approx(glued.value * answers.NUMERIC[key].factor)
    assert low <= expected <= high and basis
    assert workshop.check(key, expected)
    assert not workshop.check(key, high + abs(high) + 1)
    assert not workshop.check(key, low - abs(low) - 1)


def test_a_measured_range_widens_the_interval():
    expected, low, high, basis = answers.interval("03.4")
    spread = outputs.reading(outputs.glued_text("03", "best_range_eager"))
    assert low <= spread.low and high >= spread.high
    assert "best_range_eager" in basis


def test_a_declared_tolerance_says_why():
    for key, rule in answers.NUMERIC.items():
        assert rule.spread or rule.reason, f"{key}: a tolerance needs its reason"


def test_a_glue_that_disappears_fails_naming_exercise_and_glue(monkeypatch):
    real = outputs.glued
    monkeypatch.setattr(
        outputs,
        "glued",
        lambda chapter: {k: v for k, v in real(chapter).items() if k != "best_x_eager"},
    )
    with pytest.raises(ValueError, match=r"exercise 03\.4.*'best_x_eager'"):
        workshop.check("03.4", 1.4)
    with pytest.raises(ValueError, match=r"chapter 03 block.*'best_x_eager'"):
        pages.agendas_page()


@pytest.mark.parametrize(
    ("exercise", "answer", "error", "named"),
    [
        ("03.4", "1.4", TypeError, "answer"),
        ("03.4", True, TypeError, "answer"),
        ("03.4", float("nan"), ValueError, "answer"),
        ("03.4", float("inf"), ValueError, "answer"),
        ("99.1", 1.0, ValueError, "exercise"),
        ("03.9", 1.0, ValueError, "exercise"),
        (3.4, 1.0, TypeError, "exercise"),
        (None, 1.0, TypeError, "exercise"),
        ("02.1", 1.0, ValueError, "prose"),
    ],
)
def test_the_grader_refuses_bad_input_naming_the_argument(exercise, answer, error, named):
    with pytest.raises(error, match=named):
        workshop.check(exercise, answer)


@pytest.mark.parametrize(
    ("text", "value", "low", "high"),
    [
        ("1,468", 1468, 1468, 1468),
        ("81%", 81, 81, 81),
        ("1.45–1.48", 1.45, 1.45, 1.48),
        ("2.8e-03", 2.8e-3, 2.8e-3, 2.8e-3),
        ("S = 16384", 16384, 16384, 16384),
    ],
)
def test_a_glued_text_reads_as_a_number(text, value, low, high):
    found = outputs.reading(text)
    assert (found.value, found.low, found.high) == pytest.approx((value, low, high))


def test_a_text_without_a_number_is_refused():
    with pytest.raises(ValueError, match="text"):
        outputs.reading("n/a")


# --- pages ------------------------------------------------------------------------------------


def test_the_committed_pages_are_what_the_generator_writes():
    stale = [
        relative
        for relative, text in pages.render().items()
        if not (outputs.ROOT / relative).is_file() or (outputs.ROOT / relative).read_text() != text
    ]
    assert not stale, f"stale workshop pages {stale}: run python -m tools.workshop_pages write"


def test_the_cli_checks_and_refuses_bad_flags(capsys):
    assert workshop_pages.main(["check"]) == 0
    for argv in (["nonsense"], ["time-setup"], ["write", "extra"]):
        with pytest.raises(SystemExit) as stop:
            workshop_pages.main(argv)
        assert stop.value.code == 2
    capsys.readouterr()


def test_the_room_table_comes_from_the_datasheet():
    page = pages.rooms_page()
    for name in pages.ROOM_GPUS:
        spec = datasheet.gpu_spec(name)
        assert f"| {name} | {spec.architecture} | {spec.memory_gb:g} |" in page


def test_the_set_up_time_is_read_from_its_result_file(tmp_path):
    path = tmp_path / "setup_timing.json"
    assert "not yet measured" in pages.setup_timing_fragment(path)
    record = {"seconds": 312.0, "what": "make setup", "gpu": "NVIDIA H100", "date": "d"}
    path.write_text(json.dumps(record))
    assert "5.2 min (312 s)" in pages.setup_timing_fragment(path)
    path.write_text(json.dumps({"seconds": 1}))
    with pytest.raises(ValueError, match="path"):
        pages.setup_timing_fragment(path)


def test_the_pip_recipe_pins_the_stack_of_the_newest_stamp():
    records = [outputs.notebook(k)["metadata"]["fp8lab"] for k in CHAPTER_KEYS]
    newest = max((r for r in records if "cudnn" in r), key=lambda r: r["date"])
    recipe = (outputs.ROOT / "workshop" / "requirements-gpu.txt").read_text()
    pins = dict(re.findall(r"^([\w\-\[\],]+?)(?:\[[^\]]*\])?==(\S+)$", recipe, re.MULTILINE))
    assert pins["torch"] == newest["torch"].split("+")[0]
    assert pins["transformer-engine"] == newest["transformer_engine"]
    major_minor = ".".join(newest["cudnn"].split(".")[:2])
    assert pins["nvidia-cudnn-cu13"] == f"{major_minor}.*"


def test_the_grader_is_one_attribute_away_from_the_package():
    """``import fp8lab`` then ``fp8lab.workshop.check(...)``: the kit loads on first use, without
    the chapters' lazy names (whose modules every chapter's stamp hashes)."""
    code = (
        "import sys, fp8lab\n"
        "print('fp8lab.workshop' in sys.modules)\n"
        "print(fp8lab.workshop.check is sys.modules['fp8lab.workshop.answers'].check)\n"
        "print('tools' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True", "False"]
    assert "workshop" not in fp8lab._LAZY
    with pytest.raises(AttributeError, match="no_such_kit"):
        fp8lab.no_such_kit  # noqa: B018
