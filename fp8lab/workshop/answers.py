"""The workshop's exercises and the grader of their numeric answers.

The exercises are the chapters' own (frozen from each notebook's "Exercises" section), plus a
few prediction exercises declared here (:data:`EXTRA`) so that every chapter has at least three.
Where an answer is a number, :data:`NUMERIC` names the glue that holds it and how it is treated:

* an **exact** answer (arithmetic on shapes and formats) is graded against the book's value,
  up to its rounding;
* a **measured** answer (from the participant's own run) is graded within the book's spread
  where the participant's GPU is of the kind the book was stamped on, else within a declared
  cross-machine factor; the grade says which;
* a **prediction** is recorded (:func:`predictions`) and shown beside the book's value and the
  GPU it came from, never graded.

``check("00.1", 300)`` returns a :class:`Grade`; it never shows the expected value of a graded
answer, and names a likely slip (a factor of 10^3, 10^6 or 100) where the answer has one. The
values come from the frozen answers file (:mod:`fp8lab.workshop.outputs`), not the notebooks.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from fp8lab import checks, datasheet
from fp8lab.workshop import outputs


@dataclass(frozen=True)
class Numeric:
    """Where a numeric answer lives: ``glue`` (its value, in ``unit``), times ``factor``; the
    spread: ``spread`` (a glue name) or ``tolerance`` (relative) with its ``reason``.

    ``kind`` says how an answer is treated: ``"exact"`` (arithmetic on shapes and formats: the
    same on every GPU), ``"measured"`` (from the participant's own measurement: graded against
    the book's value where the participant's GPU is of the book's kind, else within the
    cross-machine factor ``across``, with its ``across_reason``) or ``"prediction"`` (made
    before running: recorded beside the book's value and its GPU, never graded)."""

    glue: str
    unit: str
    spread: str | None = None
    tolerance: float = 0.0
    reason: str = ""
    factor: float = 1.0
    kind: str = "exact"
    across: float = 1.0
    across_reason: str = ""


_EXACT = "arithmetic on shapes and formats: exact up to the glued value's rounding"
_PREDICTED = "a prediction: recorded beside the book's value, not graded"
NUMERIC: dict[str, Numeric] = {
    "00.1": Numeric("exercise_tokens", "tokens", tolerance=0.05,
                    reason="the ridge divides two measured ceilings; the chapter glues the FP8 "
                           "ceiling's spread but not the bandwidth's, so 5% covers both",
                    kind="measured", across=2.0,
                    across_reason="the FP8 ridge point differs by GPU kind (the room table, "
                                  "from fp8lab.datasheet), which moves this answer by up to "
                                  "about 2x either way"),
    "00.4": Numeric("bf16_ceiling", "TFLOP/s", reason=_PREDICTED, kind="prediction"),
    "01.1": Numeric("e4m3_per_binade", "values", reason=_EXACT),
    "02.3": Numeric("speedup_delayed", "x", reason=_PREDICTED, kind="prediction"),
    "03.1": Numeric("full_square_extra", "%", reason=_EXACT),
    "03.4": Numeric("best_x_eager", "x", reason=_PREDICTED, kind="prediction"),
    "04.1": Numeric("ex_s_causal", "tokens", reason=_EXACT),
    "07.1": Numeric("ex_fp8w_total", "bytes per parameter", reason=_EXACT),
    "07.2": Numeric("ex_mb_per_token", "MB per token", reason=_EXACT),
    "08.1": Numeric("ex1_graph_mib", "MiB", tolerance=0.10,
                    reason="the chapter's own answer, 9·α·β from the graph-captured α–β fit; "
                           "the chapter glues no spread of α or β", kind="measured", across=3.0,
                    across_reason="α and β belong to the box's links (NVLink or PCIe) and "
                                  "NCCL's choices there; across boxes only the method carries, "
                                  "so within 3x either way"),
    "09.4": Numeric("large_te_delayed_x", "x", reason=_PREDICTED, kind="prediction"),
}  # fmt: skip
KINDS = ("exact", "measured", "prediction")
# Slips the grader names without giving the value away: a unit off by 10^3 or 10^6 (MB and
# GB, ms and s, bytes and MB), or a fraction given for a percentage (or the reverse).
SLIPS = ((1e3, "1000", "a unit off by 10^3 (MB and GB, ms and s?)"),
         (1e6, "10^6", "a unit off by 10^6 (bytes and MB?)"),
         (1e2, "100", "a fraction where a percentage is asked, or the reverse?"))  # fmt: skip


# Prediction exercises added for the workshop (numbered after each chapter's own).
EXTRA: dict[str, tuple[str, str]] = {
    "00.4": (
        "Before running the ceilings, predict the BF16 GEMM rate your GPU will reach, in "
        "TFLOP/s, from its datasheet peak.",
        "{glue:text}`bf16_ceiling` TFLOP/s on the book's {glue:text}`gpu_name`, "
        "{glue:text}`bf16_ratio` of the datasheet peak; repeats spread by "
        "{glue:text}`bf16_spread`.",
    ),
    "02.3": (
        "Predict the speed-up of delayed scaling over BF16 on the chapter's layer, then run "
        "the timing section.",
        "{glue:text}`speedup_delayed` ({glue:text}`ms_BF16` ms in BF16, {glue:text}`ms_delayed` "
        "ms with delayed scaling); current scaling {glue:text}`speedup_current`, block "
        "scaling {glue:text}`speedup_block`.",
    ),
    "03.4": (
        "Predict the speed-up of the fastest FP8 form of the layer over eager BF16.",
        "{glue:text}`best_x_eager` ({glue:text}`best_name`), across alternating rounds "
        "{glue:text}`best_range_eager`; its GEMMs alone gained {glue:text}`gemm_speedup`.",
    ),
    "09.4": (
        "Predict the speed-up of TE's delayed-scaling FP8 over TE BF16 on the larger shape, "
        "five layers of Llama 3 8B at S = 8192 (whole training step, same rounds).",
        "{glue:text}`large_te_delayed_x` across speed rounds "
        "{glue:text}`large_te_delayed_rounds`; the chapter's headline setting is "
        "{glue:text}`headline`.",
    ),
}


def exercises(chapter) -> list[outputs.Exercise]:
    """The chapter's exercises: its own, then the workshop's predictions for it."""
    key = outputs.chapter_key(chapter)
    own = outputs.exercises(key)
    extra = [
        outputs.Exercise(ex, question, answer)
        for ex, (question, answer) in EXTRA.items()
        if ex.startswith(key + ".")
    ]
    return own + extra


def _exercise_key(exercise) -> str:
    if not isinstance(exercise, str):
        raise TypeError(f"exercise={checks.show(exercise)}: must be a key such as '03.4'")
    chapter = exercise.partition(".")[0]
    try:
        known = [e.key for e in exercises(chapter)]
    except (TypeError, ValueError):
        known = []
    if exercise not in known:
        raise ValueError(f"exercise={exercise!r}: no such exercise (keys look like '03.4')")
    if exercise not in NUMERIC:
        raise ValueError(
            f"exercise={exercise!r}: its answer is prose, not a number; "
            f"graded ones: {', '.join(sorted(NUMERIC))}"
        )
    return exercise


@dataclass(frozen=True)
class Grade:
    """A graded (or recorded) answer. ``accepted`` is True or False for an exact or measured
    answer and None for a prediction; ``basis`` says what it was held to (never the value),
    ``hint`` names a likely slip. A prediction carries the book's value (``book``, as the page
    shows it) and the GPU it was measured on (``book_gpu``); a graded answer does not."""

    exercise: str
    answer: float
    kind: str
    accepted: bool | None
    unit: str
    basis: str
    hint: str = ""
    book: str | None = None
    book_gpu: str | None = None

    def __bool__(self) -> bool:
        return bool(self.accepted)

    def __str__(self) -> str:
        if self.kind == "prediction":
            return (f"{self.exercise}: your prediction {self.answer:g} {self.unit} is "
                    f"recorded; the book measured {self.book} on the {self.book_gpu}")
        verdict = "right" if self.accepted else "not accepted"
        hint = f" Hint: {self.hint}" if self.hint else ""
        return f"{self.exercise}: {self.answer:g} {self.unit} is {verdict} ({self.basis}).{hint}"


_PREDICTIONS: list[Grade] = []


def predictions() -> list[Grade]:
    """The predictions recorded in this session, in order."""
    return list(_PREDICTIONS)


def _book_interval(key: str) -> tuple[float, float, float, str]:
    rule, chapter = NUMERIC[key], key.partition(".")[0]
    used_by = f"exercise {key}"
    value = outputs.reading(outputs.glued_text(chapter, rule.glue, used_by))
    low, high = value.value - value.half_unit, value.value + value.half_unit
    basis = f"glue {rule.glue!r}"
    if rule.spread is not None:
        spread = outputs.reading(outputs.glued_text(chapter, rule.spread, used_by))
        if spread.text.strip().endswith("%") and spread.low == spread.high:
            relative = (spread.value + spread.half_unit) / 100
            low, high = low - abs(value.value) * relative, high + abs(value.value) * relative
        else:
            low = min(low, spread.low - spread.half_unit)
            high = max(high, spread.high + spread.half_unit)
        basis += f", measured spread {spread.text!r} (glue {rule.spread!r})"
    elif rule.tolerance:
        margin = abs(value.value) * rule.tolerance
        low, high = low - margin, high + margin
        basis += f", ±{rule.tolerance:.0%}: {rule.reason}"
    else:
        basis += f", {rule.reason}"
    scale = rule.factor
    return value.value * scale, low * scale, high * scale, basis


def interval(exercise: str, same_kind: bool = True) -> tuple[float, float, float, str]:
    """``(expected, low, high, basis)`` of a numeric exercise, from the frozen answers: for a
    GPU of the book's kind, or (``same_kind=False``) across kinds. For instructors: a
    participant's :class:`Grade` never shows these numbers."""
    key = _exercise_key(exercise)
    if not isinstance(same_kind, bool):
        raise TypeError(f"same_kind={checks.show(same_kind)}: must be True or False")
    expected, low, high, basis = _book_interval(key)
    rule = NUMERIC[key]
    if not same_kind and rule.kind == "measured":
        low, high = min(low, expected / rule.across), max(high, expected * rule.across)
        basis += f"; across GPU kinds within {rule.across:g}x: {rule.across_reason}"
    return expected, low, high, basis


def _gpu_kind(gpu) -> str | None:
    """The datasheet kind of ``gpu`` (a name); None asks torch for this machine's GPU."""
    if gpu is None:
        try:
            import torch
        except ImportError:
            return None
        if not torch.cuda.is_available():
            return None
        gpu = torch.cuda.get_device_name()
    if not isinstance(gpu, str) or not gpu.strip():
        raise TypeError(f"gpu={checks.show(gpu)}: must be a GPU name such as 'H100' or None")
    try:
        return datasheet.gpu_spec(gpu).name
    except ValueError:
        return gpu.strip()


def _hint(answer: float, low: float, high: float) -> str:
    if low <= answer <= high or answer == 0:
        return ""
    for factor, name, why in SLIPS:
        if low <= answer / factor <= high:
            return f"your answer is {name} times too large: {why}"
        if low <= answer * factor <= high:
            return f"your answer is {name} times too small: {why}"
    return ""


def check(exercise: str, answer, gpu: str | None = None) -> Grade:
    """Grade a numeric answer to ``exercise`` (e.g. ``"00.1"``) in the exercise's unit, or
    record it where the exercise is a prediction. ``gpu`` names the GPU a measured answer came
    from (default: this machine's, if it has one); the grade says which basis it used."""
    key = _exercise_key(exercise)
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real):
        raise TypeError(f"answer={checks.show(answer)}: must be a number")
    if not math.isfinite(float(answer)):
        raise ValueError(f"answer={answer!r}: must be a finite number")
    answer, rule = float(answer), NUMERIC[key]
    stamp = outputs.stamp(key[:2])
    if rule.kind == "prediction":
        book = outputs.glued_text(key[:2], rule.glue, f"exercise {key}")
        grade = Grade(key, answer, rule.kind, None, rule.unit, _PREDICTED, book=book,
                      book_gpu=stamp["gpu"])  # fmt: skip
        _PREDICTIONS.append(grade)
        return grade
    kind = _gpu_kind(gpu) if rule.kind == "measured" else stamp["kind"]
    same = kind == stamp["kind"]
    _, low, high, _ = interval(key, same_kind=same)
    if rule.kind == "exact":
        basis = "arithmetic: the same answer on every GPU, up to the book's rounding"
    elif same:
        basis = f"your GPU is the book's kind ({stamp['kind']}): within the book's spread"
    else:
        yours = kind or "no GPU found"
        basis = (f"your GPU ({yours}) is not the book's kind ({stamp['kind']}): within "
                 f"{rule.across:g}x of the book's value, the cross-machine tolerance")
    accepted = low <= answer <= high
    return Grade(key, answer, rule.kind, accepted, rule.unit, basis, _hint(answer, low, high))
