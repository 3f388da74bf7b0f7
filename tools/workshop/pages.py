"""The generated workshop pages: agendas, exercises, the room split and the set-up time.

:func:`render` returns each generated file's path (relative to the book's root) and text, built
from the committed notebooks (stamps and glued values), :mod:`fp8lab.datasheet` and the set-up
timing file; ``python -m tools.workshop_pages write`` writes them, and a test fails when the
committed pages differ from what :func:`render` gives now.
"""

from __future__ import annotations

import json
from pathlib import Path

from fp8lab import checks, datasheet
from fp8lab.weights import count_words
from fp8lab.workshop import answers
from fp8lab.workshop.outputs import ROOT
from tools.workshop import card, chapters, freeze, plan
from tools.workshop import notebooks as outputs

RESULTS = ROOT / "tests" / "gpu_results"
ROOM_GPUS = ("H100 SXM", "H200", "L40S", "RTX 4090")
HEADER = "<!-- Generated from the committed notebooks by `python -m tools.workshop_pages write`;"
HEADER += " edit tools/workshop/, not this file. -->\n\n"


def _link(key: str) -> str:
    return f"{{doc}}`chapter {key} <../notebooks/{outputs.chapter_path(key).stem}>`"


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header, rows) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows), ""]


def _agenda_rows(name: str) -> list[list[str]]:
    rows = []
    for slot in plan.agenda(name):
        block = slot.block
        day = f"day {slot.day}, " if len(plan.AGENDAS[name][1]) > 1 else ""
        when = f"{day}{slot.start}–{slot.end}"
        if block.chapter is None:
            rows.append([when, block.activity, block.minutes, "", "", "", ""])
            continue
        need = plan.need(block.chapter, block.focus)
        title = chapters.title(block.chapter).split(":")[0].replace("`", "")
        key = block.chapter
        part = " (its focus)" if block.focus else ""
        rows.append([when, f"{{ref}}`{key} · {title} <workshop-block-{key}>`{part}",
                     block.minutes, f"{need.seconds:.0f} s", need.reading,
                     need.exercises, block.minutes - need.total])  # fmt: skip
    return rows


def _expected(key: str) -> list[str]:
    rows = []
    for label, name, spread in plan.CHAPTERS[key].expected:
        used_by = f"the chapter {key} block"
        value = outputs.glued_text(key, name, used_by)
        spread_text = outputs.glued_text(key, spread, used_by) if spread else "—"
        rows.append([label, value, spread_text, f"`{name}`"])
    return _table(["Expected", "Book's value", "Spread", "Glue"], rows)


def _block(key: str) -> list[str]:
    chapter, need = plan.CHAPTERS[key], plan.need(key)
    gpus = f" on {need.gpus} GPUs" if need.gpus > 1 else ""
    lines = [f"(workshop-block-{key})=", f"### Chapter {key}: {chapters.title(key)}", ""]
    lines += [
        f"- **Run** {_link(key)} top to bottom (Run All): {need.seconds:.0f} s stamped on "
        f"{need.gpu}{gpus}. Its sections: " + "; ".join(chapters.sections(key)) + ".",
        f"- **Read:** {_material(need)}{_focus(key)}.",
        f"- **Predict first:** {chapter.predict}.",
        f"- **Discuss:** {chapter.discuss}",
        f"- **Exercises:** {{ref}}`{key}.1 onwards <workshop-exercises-{key}>`.",
        f"- **No GPU:** {plan.CPU_FALLBACK} {chapter.no_gpu}".rstrip(),
        "",
    ]
    return lines + _expected(key)


def _material(need: plan.Need) -> str:
    m = need.material
    return (f"{m.words:,} words, {m.code_lines:,} visible code lines, "
            f"{count_words(m.tables, 'table')} and {count_words(m.figures, 'figure')}: "
            f"{need.reading} min")  # fmt: skip


def _focus(key: str) -> str:
    if key not in plan.FOCUS:
        return ""
    sections, _ = plan.FOCUS[key]
    focused = plan.need(key, focus=True)
    return ("; its focus (short agendas): the opening and " + "; ".join(sections)
            + f", {_material(focused)}")


def agendas_page() -> str:
    """The four agendas, then each chapter block's plan and expected numbers."""
    lines = [HEADER + "# Agendas", ""]
    lines += [
        "Each chapter block needs the chapter's run on the `full` preset, in the seconds its "
        "GPU stamp records (counted as whole minutes, rounded up), plus its reading minutes, "
        "derived from what it reads of the chapter (prose at "
        f"{plan.RATES['words']:.0f} words, code at {plan.RATES['code_lines']:.0f} visible "
        f"lines, {plan.RATES['tables']:.0f} tables and {plan.RATES['figures']:.0f} figure a "
        f"minute), plus {plan.EXERCISE_MINUTES} minutes per exercise; *Slack* is what is left "
        "of the block for discussion. A block marked *its focus* reads the chapter's opening "
        "and the sections its block below names, and does its first exercise. A test fails "
        "when a re-stamped or rewritten chapter no longer fits its block. Every block starts "
        "with `make doctor` already run ({doc}`setup`); the welcome block is where "
        "the last `FAIL`s get fixed ({doc}`instructor`).",
        "",
    ]
    header = ["Time", "Block", "Min", "Run", "Read", "Exercise", "Slack"]
    for name, (title, _) in plan.AGENDAS.items():
        lines += [f"## {title} ({plan.agenda_minutes(name)} min)", ""]
        lines += _table(header, _agenda_rows(name))
    lines += ["## The chapter blocks", ""]
    for key in plan.CHAPTERS:
        lines += _block(key)
    return "\n".join(lines).rstrip() + "\n"


def _grader_note(key: str) -> str:
    if key not in answers.NUMERIC:
        return ""
    rule, call = answers.NUMERIC[key], f'`fp8lab.workshop.check("{key}", answer)`'
    expected, low, high, basis = answers.interval(key)
    if rule.kind == "prediction":
        return (f"\n\n*Recorded, not graded:* {call} records a prediction and shows the "
                f"book's value ({expected:.4g} {rule.unit}) beside it.")
    note = (f"\n\n*Graded:* {call} accepts {_span(low, high)} {rule.unit} "
            f"(book: {number_text(expected)}; {basis})")
    if rule.kind == "measured":
        _, far_low, far_high, _ = answers.interval(key, same_kind=False)
        note += (f" on a GPU of the book's kind; on another kind, "
                 f"{_span(far_low, far_high)} {rule.unit} ({rule.across_reason})")
    return note + "."


def number_text(value: float) -> str:
    """A value as the pages print it: from 1,000 up whole, with separators; else 4 digits."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _span(low: float, high: float) -> str:
    """An accepted range, or the one value when both ends agree as printed."""
    low, high = number_text(low), number_text(high)
    return low if low == high else f"{low}–{high}"


def exercises_page() -> str:
    """Every chapter's exercises with hidden answers, the book's numbers filled in."""
    lines = [HEADER + "# Exercises and answers", ""]
    lines += [
        "Each chapter's own exercises, with the prediction exercises of the agendas. Numbers in "
        "the answers are the committed outputs of the chapters' last GPU run, frozen into the "
        "file the grader reads (`fp8lab/workshop/answers.json`). `fp8lab.workshop.check` "
        "grades an exact answer against the book's value, a measured one within the book's "
        "spread on a GPU of the book's kind or a stated cross-machine factor on another kind "
        "(it says which), and records a prediction beside the book's value without grading "
        "it. A grade never shows the expected value; it names a slip by 10^3, 10^6 or 100.",
        "",
    ]
    for key in plan.CHAPTERS:
        lines += [f"(workshop-exercises-{key})=", f"## Chapter {key}: {chapters.title(key)}", ""]
        own = outputs.exercises(key)
        extra = [e for e in answers.exercises(key) if e.key in answers.EXTRA]
        for exercise in own + extra:
            where = f"exercise {exercise.key}"
            question = chapters.resolve(exercise.question, key, where)
            answer = chapters.resolve(exercise.answer, key, where) + _grader_note(exercise.key)
            lines += [f"**{exercise.key}** {question}", "", ":::{admonition} Answer",
                      ":class: dropdown", answer, ":::", ""]  # fmt: skip
        lines += [f"Back to {_link(key)}.", ""]
    return "\n".join(lines).rstrip() + "\n"


def _room_rows() -> list[list[str]]:
    base = datasheet.gpu_spec(ROOM_GPUS[0])
    rows = []
    for name in ROOM_GPUS:
        gpu = datasheet.gpu_spec(name)
        ridge = gpu.ridge_point("fp8") / base.ridge_point("fp8")
        rows.append([name, gpu.architecture, f"{gpu.memory_gb:g}", f"{gpu.bandwidth_gbs:,.0f}",
                     f"{gpu.bf16_tflops:,.0f}", f"{gpu.fp8_tflops:,.0f}",
                     f"{gpu.ridge_point('bf16'):.0f}", f"{gpu.ridge_point('fp8'):.0f}",
                     f"{ridge:.2f}x", f"{gpu.memory_gb / base.memory_gb:.2f}x"])  # fmt: skip
    return rows


def _room_sentences() -> list[str]:
    specs = [datasheet.gpu_spec(name) for name in ROOM_GPUS]
    high = max(specs, key=lambda g: g.ridge_point("fp8"))
    low = min(specs, key=lambda g: g.ridge_point("fp8"))
    small = [g.name for g in specs if g.memory_gb < specs[0].memory_gb]
    return [
        f"The FP8 ridge point (peak rate over bandwidth) runs from {low.ridge_point('fp8'):.0f} "
        f"FLOP/byte on the {low.name} to {high.ridge_point('fp8'):.0f} on the {high.name}: a "
        "GEMM that is compute-bound on one kind can be memory-bound on another, so FP8's gain on "
        "small and skinny products ({doc}`chapter 00 <../notebooks/00_your_gpu>`, "
        "{doc}`chapter 04 <../notebooks/04_performance_math>`) differs by kind. "
        f"The {' and '.join(small)} hold less memory than the {specs[0].name}: the sizes at "
        "which {doc}`chapter 05 <../notebooks/05_attention_backends>` and {doc}`chapter 07 "
        "<../notebooks/07_memory>` run out of memory come sooner than on the book's pages.",
        "",
    ]


def rooms_page() -> str:
    """How the GPU kinds of a mixed room differ, from the datasheet."""
    lines = [HEADER + "# Splitting a room across GPU kinds", ""]
    lines += ["Dense datasheet peaks of the kinds a room is likely to mix, from "
              "`fp8lab.datasheet` (its sources are NVIDIA's datasheets and whitepapers); the "
              f"ridge points are in FLOP per byte, and the last two columns compare each kind "
              f"with the {ROOM_GPUS[0]}.", ""]  # fmt: skip
    header = ["GPU", "Arch.", "GB", "GB/s", "BF16 TFLOP/s", "FP8 TFLOP/s", "Ridge BF16",
              "Ridge FP8", "FP8 ridge vs H100", "Memory vs H100"]  # fmt: skip
    lines += _table(header, _room_rows())
    lines += _room_sentences()
    lines += [ROOM_ADVICE]
    return "\n".join(lines).rstrip() + "\n"


ROOM_ADVICE = """\
- **Group by kind**, one kind per table, so every group compares its own BF16 with its own
  FP8; pool the groups' ratios at the end, and discuss why they differ.
- **Predict from this table** before chapter 00: each group's ridge points and peak ratio.
- **Chapter 08 needs two GPUs of one box**; give those boxes to pairs.
- A GPU below compute capability 8.9 (A100 and older) has no FP8: its participants run the CPU
  lane and read the book's figures, or join a group with an FP8 GPU.
"""


def _stacks() -> str:
    """The software stacks the chapters' stamps record, with the chapters of each."""
    stacks: dict[str, list[str]] = {}
    for key in plan.CHAPTERS:
        record = outputs.notebook(key).get("metadata", {}).get("fp8lab") or {}
        stack = (
            f"{record.get('gpu_name', 'an unknown GPU')}, torch {record.get('torch', '?')}, "
            f"Transformer Engine {record.get('transformer_engine', '?')}, "
            f"cuDNN {record.get('cudnn', 'not recorded')}"
        )
        stacks.setdefault(stack, []).append(key)
    return "; ".join(f"{stack} (chapter{'s' if len(keys) > 1 else ''} {', '.join(keys)})"
                     for stack, keys in stacks.items())


def setup_records(folder: Path = RESULTS) -> list[dict]:
    """The successful bare-machine set-up records (``setup_bare_*.json``), oldest first."""
    if isinstance(folder, bool) or not isinstance(folder, (str, Path)):
        raise TypeError(f"folder={checks.show(folder)}: must be a folder path")
    found = []
    for path in sorted(Path(folder).glob("setup_bare_*.json")):
        record = json.loads(path.read_text())
        try:
            seconds, ok = float(record["seconds"]), bool(record["ok"])
            steps = [(str(s["step"]), float(s["seconds"])) for s in record["steps"]]
            where, date = str(record["gpu"]), str(record["date"])
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"folder={str(folder)!r}: {path.name} is not a set-up record "
                             f"({error})") from None  # fmt: skip
        if ok:
            found.append({"seconds": seconds, "steps": steps, "gpu": where, "date": date,
                          "file": path.name,
                          "system_site": bool(record.get("system_site"))})  # fmt: skip
    return sorted(found, key=lambda r: r["date"])


def setup_timing_fragment(folder: Path = RESULTS) -> str:
    """The newest measured bare-machine set-up (a committed result file), or "not yet
    measured"."""
    records = setup_records(folder)
    stacks = f"\n\n**The stacks the book's outputs were measured on:** {_stacks()}.\n"
    if not records:
        return HEADER + "**Measured set-up time:** not yet measured." + stacks
    last = records[-1]
    steps = "; ".join(f"{name} {seconds:.0f} s" for name, seconds in last["steps"])
    card, _, driver = last["gpu"].partition(", ")
    where = f"{card} machine (driver {driver})" if driver else f"{card} machine"
    return (
        HEADER + f"**Measured set-up time:** {last['seconds'] / 60:.1f} min "
        f"({last['seconds']:.0f} s) from a bare {where} without network, "
        f"{last['date']}, by `tools/setup_bare.py` ({last['file']}): {steps}."
        + (" PyTorch was the machine's own (`--system-site`), not installed from the wheelhouse."
           if last["system_site"] else "")
        + stacks
    )


def render() -> dict[str, str]:
    """Each generated page's path (relative to the book's root) and its text."""
    return {
        "workshop/agendas.md": agendas_page(),
        "workshop/exercises.md": exercises_page(),
        "workshop/rooms.md": rooms_page(),
        "workshop/_setup_timing.md": setup_timing_fragment(),
        "workshop/decision-card.md": card.card_page(),
        "fp8lab/workshop/answers.json": freeze.frozen_text(),
    }
