"""The workshop's exercises and the grader of their numeric answers.

The exercises are the chapters' own (read from each notebook's "Exercises" section), plus a few
prediction exercises declared here (:data:`EXTRA`) so that every chapter has at least three.
Where an answer is a number, :data:`NUMERIC` names the glue that holds it in the committed
outputs and how wide the accepted interval is: the measured spread where the chapter glues one
(a range such as ``1.45–1.48``, or a relative spread such as ``0.5%``), else a declared relative
tolerance with its reason. The glue's own rounding (half its last digit) is always accepted.

``check("03.4", 1.47)`` grades one answer: ``Grade.accepted`` and the interval it was held to.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from fp8lab import checks
from fp8lab.workshop import outputs


@dataclass(frozen=True)
class Numeric:
    """Where a numeric answer lives: ``glue`` (its value, in ``unit``), times ``factor``; the
    spread: ``spread`` (a glue name) or ``tolerance`` (relative) with its ``reason``."""

    glue: str
    unit: str
    spread: str | None = None
    tolerance: float = 0.0
    reason: str = ""
    factor: float = 1.0


_EXACT = "arithmetic on shapes and formats: exact up to the glued value's rounding"
NUMERIC: dict[str, Numeric] = {
    "00.1": Numeric("exercise_tokens", "tokens", tolerance=0.05,
                    reason="the ridge divides two measured ceilings; the chapter glues the FP8 "
                           "ceiling's spread but not the bandwidth's, so 5% covers both"),
    "00.4": Numeric("bf16_ceiling", "TFLOP/s", spread="bf16_spread"),
    "01.1": Numeric("e4m3_per_binade", "values", reason=_EXACT),
    "02.3": Numeric("speedup_delayed", "x", tolerance=0.05,
                    reason="one timing per recipe, no spread glued; 5% is the run-to-run "
                           "spread the book's method allows a headline ratio"),
    "03.1": Numeric("full_square_extra", "%", reason=_EXACT),
    "03.4": Numeric("best_x_eager", "x", spread="best_range_eager"),
    "04.1": Numeric("ex_s_causal", "tokens", reason=_EXACT),
    "07.1": Numeric("ex_fp8w_total", "bytes per parameter", reason=_EXACT),
    "07.2": Numeric("ex_mb_per_token", "MB per token", reason=_EXACT),
    "08.1": Numeric("ar_bucket90_mib", "MiB", tolerance=0.10,
                    reason="the chapter's own answer, 9·α·β from one α–β fit; the chapter "
                           "glues no spread of α or β"),
    "09.4": Numeric("large_te_delayed_x", "x", spread="large_te_delayed_rounds"),
}  # fmt: skip

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
        "Predict the speed-up of TE's delayed-scaling FP8 over TE BF16 on the large model "
        "(whole training step, same rounds).",
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
    """A graded answer: ``accepted`` when ``low <= answer <= high``; ``expected`` is the
    committed value, ``basis`` says where the interval's width comes from."""

    exercise: str
    answer: float
    accepted: bool
    expected: float
    low: float
    high: float
    unit: str
    basis: str

    def __bool__(self) -> bool:
        return self.accepted


def interval(exercise: str) -> tuple[float, float, float, str]:
    """``(expected, low, high, basis)`` of a numeric exercise, read from the committed outputs."""
    key = _exercise_key(exercise)
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


def check(exercise: str, answer) -> Grade:
    """Grade a numeric answer to ``exercise`` (e.g. ``"03.4"``) in the exercise's unit."""
    expected, low, high, basis = interval(exercise)
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real):
        raise TypeError(f"answer={checks.show(answer)}: must be a number")
    if not math.isfinite(float(answer)):
        raise ValueError(f"answer={answer!r}: must be a finite number")
    answer = float(answer)
    unit = NUMERIC[exercise].unit
    return Grade(exercise, answer, low <= answer <= high, expected, low, high, unit, basis)
