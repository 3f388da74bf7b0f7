"""The workshop kit: agendas fit the chapters' stamps and derived reading times, every answer
comes from the committed outputs frozen into the package, the grader accepts right answers and
refuses wrong ones without the notebooks, records predictions, and the pages are up to date."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest

import fp8lab
from fp8lab import datasheet, workshop
from fp8lab.workshop import answers, outputs
from tools import stamps, workshop_pages
from tools.workshop import card, chapters, freeze, notebooks, pages, plan

CHAPTER_KEYS = [path.name[:2] for path in stamps.toc_notebooks()]


# --- agendas against the stamps ---------------------------------------------------------------


def test_every_chapter_of_the_book_has_a_block():
    assert sorted(plan.CHAPTERS) == sorted(CHAPTER_KEYS)


def test_every_block_fits_its_chapters_stamped_run_time():
    assert plan.over_budget() == []


@pytest.mark.parametrize("key", CHAPTER_KEYS)
def test_a_blocks_run_time_is_the_stamp(key):
    record = notebooks.notebook(key)["metadata"]["fp8lab"]
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


def test_the_multi_gpu_chapter_is_stamped_on_several_gpus():
    assert plan.need("08").gpus >= 2  # two in the course's rooms; four where lent


@pytest.mark.parametrize("key", CHAPTER_KEYS)
def test_reading_minutes_are_derived_from_the_chapters_text(key):
    need = plan.need(key)
    material = notebooks.material(key)
    assert material.words > 0 and material.code_lines > 0
    assert need.reading == plan.reading_minutes(material)
    if key in plan.FOCUS:
        assert plan.need(key, focus=True).reading <= need.reading


def test_a_longer_chapter_needs_more_reading():
    base = notebooks.Material(1500, 150, 5, 2)
    longer = notebooks.Material(3000, 600, 13, 3)
    assert plan.reading_minutes(longer) > plan.reading_minutes(base)
    assert plan.need("03").reading >= 45  # ~2,900 words, ~590 code lines, 13 tables


def test_the_taster_has_a_formats_and_scaling_block():
    blocks = [slot.block for slot in plan.agenda("taster")]
    assert any(b.chapter is None and b.minutes == 10 and "Formats and scaling" in b.activity
               for b in blocks)


def test_bad_plan_input_is_refused():
    with pytest.raises(TypeError, match="focus"):
        plan.need("03", focus="yes")
    with pytest.raises(ValueError, match="focus"):
        plan.need("08", focus=True)
    with pytest.raises(ValueError, match="sections"):
        notebooks.material("03", ("No such heading",))
    with pytest.raises(TypeError, match="material"):
        plan.reading_minutes(12)


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


GRADED = sorted(k for k, r in answers.NUMERIC.items() if r.kind != "prediction")
PREDICTED = sorted(k for k, r in answers.NUMERIC.items() if r.kind == "prediction")


@pytest.mark.parametrize("key", sorted(answers.NUMERIC))
def test_a_graded_answer_is_the_one_the_page_shows(key):
    """The grader reads the glue the answer shows, or (a value derived from a glue) the page
    states the graded value beside the answer."""
    exercise = next(e for e in answers.exercises(key[:2]) if e.key == key)
    rule = answers.NUMERIC[key]
    assert rule.kind in answers.KINDS
    assert rule.glue in chapters.glue_names(exercise.answer) or rule.factor != 1.0
    expected = answers.interval(key)[0]
    page = pages.exercises_page()
    assert f'check("{key}", answer)`' in page
    assert pages.number_text(expected) in page


@pytest.mark.parametrize("key", GRADED)
def test_the_grader_accepts_the_books_value_and_refuses_far_ones(key):
    expected, low, high, basis = answers.interval(key)
    glued = outputs.reading(outputs.glued_text(key[:2], answers.NUMERIC[key].glue))
    assert expected == pytest.approx(glued.value * answers.NUMERIC[key].factor)
    assert low <= expected <= high and basis
    book = outputs.stamp(key[:2])["kind"]
    assert workshop.check(key, expected, gpu=book)
    assert not workshop.check(key, high + abs(high) + 1, gpu=book)
    assert not workshop.check(key, low - abs(low) - 1, gpu=book)


@pytest.mark.parametrize("key", GRADED)
def test_a_grade_never_shows_the_expected_value(key):
    expected = answers.interval(key)[0]
    grade = workshop.check(key, expected * 3 + 7)
    assert not hasattr(grade, "expected") and not hasattr(grade, "low")
    assert grade.book is None and grade.book_gpu is None
    shown = outputs.glued_text(key[:2], answers.NUMERIC[key].glue)
    assert shown not in str(grade).replace(f"{grade.answer:g}", "")


@pytest.mark.parametrize("key", PREDICTED)
def test_a_prediction_is_recorded_beside_the_books_value_not_graded(key):
    before = len(workshop.predictions())
    grade = workshop.check(key, 1.0)
    assert grade.kind == "prediction" and grade.accepted is None and not grade
    assert grade.book == outputs.glued_text(key[:2], answers.NUMERIC[key].glue)
    assert grade.book_gpu == outputs.stamp(key[:2])["gpu"]
    assert grade.book in str(grade) and grade.book_gpu in str(grade)
    assert workshop.predictions()[before:] == [grade]


def test_a_measurement_is_graded_against_the_participants_gpu_kind():
    expected, low, high, _ = answers.interval("00.1")
    _, far_low, far_high, far_basis = answers.interval("00.1", same_kind=False)
    assert far_low < low and far_high > high and "across GPU kinds" in far_basis
    answer = high * 1.5
    assert far_low <= answer <= far_high
    same = workshop.check("00.1", answer, gpu="NVIDIA H100 80GB HBM3")
    other = workshop.check("00.1", answer, gpu="L40S")
    assert not same and "the book's kind" in same.basis
    assert other and "cross-machine" in other.basis and "L40S" in other.basis


@pytest.mark.parametrize(("factor", "words"), [(1e3, "1000 times too large"),
                                               (1e-3, "1000 times too small"),
                                               (1e6, "10^6 times too large"),
                                               (1e2, "100 times too large"),
                                               (1e-2, "100 times too small")])  # fmt: skip
def test_a_slip_by_a_power_of_ten_gets_a_hint(factor, words):
    expected = answers.interval("04.1")[0]
    grade = workshop.check("04.1", expected * factor)
    assert not grade and words in grade.hint
    assert workshop.check("04.1", expected * 7).hint == ""


def _copy_package(tmp_path):
    root = tmp_path / "elsewhere"
    shutil.copytree(outputs.ROOT / "fp8lab", root / "fp8lab",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    return root


def _grade_in(root, key: str, answers_: list[float]) -> list[str]:
    code = ("import sys, fp8lab\n"
            f"for a in {answers_!r}:\n"
            f"    print(bool(fp8lab.workshop.check({key!r}, a)))")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.split()


def test_a_declared_tolerance_says_why():
    for key, rule in answers.NUMERIC.items():
        assert rule.spread or rule.reason, f"{key}: a tolerance needs its reason"
        if rule.kind == "measured":
            assert rule.across > 1 and rule.across_reason, key


def test_the_grader_works_with_the_notebooks_absent(tmp_path):
    root = _copy_package(tmp_path)
    assert not (root / "notebooks").exists()
    expected = answers.interval("04.1")[0]
    assert _grade_in(root, "04.1", [expected, expected * 2]) == ["True", "False"]


def test_the_grader_ignores_changed_notebooks(tmp_path):
    """A participant's run autosaved over a chapter does not become the right answer."""
    root = _copy_package(tmp_path)
    (root / "notebooks").mkdir()
    path = notebooks.chapter_path("04")
    text = path.read_text()
    shown = outputs.glued_text("04", "ex_s_causal")
    assert repr(shown) in text
    (root / "notebooks" / path.name).write_text(text.replace(repr(shown), "'803'"))
    expected = answers.interval("04.1")[0]
    assert _grade_in(root, "04.1", [expected, 803.0]) == ["True", "False"]


def test_the_frozen_answers_match_the_stamped_notebooks():
    assert outputs.FROZEN.read_text() == freeze.frozen_text()
    for key in CHAPTER_KEYS:
        entry = outputs.frozen()["chapters"][key]
        record = notebooks.notebook(key)["metadata"]["fp8lab"]
        assert entry["gpu"] == record["gpu_name"] and entry["date"] == record["date"]
        assert [e.key for e in outputs.exercises(key)] == [
            e.key for e in notebooks.exercises(key)
        ]


def test_the_grader_reads_no_notebook():
    source = (outputs.ROOT / "fp8lab" / "workshop").glob("*.py")
    assert not any("ipynb" in p.read_text().replace("notebooks/*.ipynb", "") for p in source)


def test_the_frozen_answers_ship_with_the_package():
    text = (outputs.ROOT / "pyproject.toml").read_text()
    assert '"fp8lab.workshop" = ["answers.json"]' in text


def test_a_glue_that_disappears_fails_naming_exercise_and_glue(monkeypatch):
    real = outputs.glued
    monkeypatch.setattr(
        outputs,
        "glued",
        lambda chapter: {k: v for k, v in real(chapter).items() if k != "ex_s_causal"},
    )
    with pytest.raises(ValueError, match=r"exercise 04\.1.*'ex_s_causal'"):
        workshop.check("04.1", 1.4)
    real_nb = notebooks.glued
    monkeypatch.setattr(
        notebooks,
        "glued",
        lambda chapter: {k: v for k, v in real_nb(chapter).items() if k != "best_x_eager"},
    )
    with pytest.raises(ValueError, match=r"chapter 03 block.*'best_x_eager'"):
        pages.agendas_page()


def test_the_decision_card_states_the_chapters_numbers():
    page = card.card_page()
    for name in card.GEMMS_8:
        text = notebooks.glued_text("04", name)
        assert f"{outputs.reading(text).value:.2f}" in page or "–" in page
    for name in ("acc_layer_fp8_grad", "acc_layer_fp8_attn_grad"):
        assert notebooks.glued_text("03", name) in page
    assert "is safe with causal masks" not in page and "gains little" not in page


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
    with pytest.raises(TypeError, match="gpu"):
        workshop.check("00.1", 300, gpu=123)
    with pytest.raises(TypeError, match="same_kind"):
        workshop.interval("00.1", same_kind="no")


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


def test_the_set_up_time_is_read_from_its_result_files(tmp_path):
    assert "not yet measured" in pages.setup_timing_fragment(tmp_path)
    steps = [{"step": "fresh virtual environment", "seconds": 2.0},
             {"step": "offline install", "seconds": 300.0},
             {"step": "make doctor", "seconds": 10.0}]  # fmt: skip
    record = {"ok": True, "seconds": 312.0, "gpu": "NVIDIA H100 80GB HBM3, 580.95",
              "date": "2026-11-28 10:00 UTC", "steps": steps}  # fmt: skip
    (tmp_path / "setup_bare_h100_20261128.json").write_text(json.dumps(record))
    failed = {**record, "ok": False, "date": "2026-11-29 10:00 UTC"}
    (tmp_path / "setup_bare_h100_20261129.json").write_text(json.dumps(failed))
    text = pages.setup_timing_fragment(tmp_path)
    assert "5.2 min (312 s)" in text and "offline install 300 s" in text
    (tmp_path / "setup_bare_bad.json").write_text(json.dumps({"seconds": 1}))
    with pytest.raises(ValueError, match="folder"):
        pages.setup_timing_fragment(tmp_path)


def test_setup_bare_refuses_a_missing_wheelhouse(tmp_path):
    from tools import setup_bare

    with pytest.raises(SystemExit):
        setup_bare.main(["--wheelhouse", str(tmp_path / "none")])


def test_setup_bare_refuses_chapters_the_book_does_not_have(tmp_path, capsys):
    from tools import setup_bare

    for named in ("99", "00,3", ""):
        with pytest.raises(SystemExit):
            setup_bare.main(["--wheelhouse", str(tmp_path), "--chapters", named])
        assert "--chapters" in capsys.readouterr().err


def test_the_set_up_targets_exist():
    text = (outputs.ROOT / "Makefile").read_text()
    for target in ("doctor:", "wheelhouse:", "install-offline:", "te-wheel:"):
        assert f"\n{target}" in text, target
    plan = subprocess.run(["make", "-n", "install-offline", "WHEELHOUSE=/w"], cwd=outputs.ROOT,
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert plan.count("--no-index") >= 3 and "pip download" not in plan
    assert (outputs.ROOT / ".dockerignore").is_file()


def test_the_pip_recipe_pins_the_stack_of_the_newest_stamp():
    records = [notebooks.notebook(k)["metadata"]["fp8lab"] for k in CHAPTER_KEYS]
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


def test_a_questions_code_block_stays_a_block():
    from tools.workshop.notebooks import _question_text

    text = "Time this:\n   more words.\n\n   ```python\n   a = 1\n   b = 2\n   ```\n"
    assert _question_text(text) == "Time this: more words.\n\n```python\na = 1\nb = 2\n```"
    assert _question_text("one\n   line") == "one line"



def test_machine_packages_links_the_running_venv_only(tmp_path, monkeypatch):
    import site
    import sys

    from tools import machine_packages

    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (tmp_path / "lib" / version / "site-packages").mkdir(parents=True)
    monkeypatch.setattr(sys, "prefix", sys.base_prefix)
    assert machine_packages.link(tmp_path) is None
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "machine-venv"))
    target = machine_packages.link(tmp_path)
    assert target.name == machine_packages.PTH
    assert target.read_text().split() == site.getsitepackages()
    with pytest.raises(ValueError, match="venv="):
        machine_packages.link(tmp_path / "absent")
