"""The workshop's plan: what each chapter block asks of participants, and four timed agendas.

A chapter block's time is its **run time** (the GPU lane's stamped seconds for the whole chapter
on the ``full`` preset, rounded up to minutes) plus its **reading** minutes, derived from what
the block reads of the committed chapter (words, visible code lines, tables and figures, at the
rates :data:`RATES` declares), plus its **exercise** minutes (:data:`EXERCISE_MINUTES` per
exercise done). A short agenda reads only some of a chapter's sections (``Block.sections``).
The agenda allots each block a fixed number of minutes, and
:func:`over_budget` lists every block whose need exceeds its allotment (a test keeps it empty,
so a chapter that grows slower after a re-run cannot silently overrun its block).
The expected numbers are glue names; their values come from the committed outputs
(:mod:`tools.workshop.notebooks`), never from here; the run times from the stamps
(:func:`tools.workshop.chapters.stamped_run`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fp8lab import checks
from tools.workshop import chapters, notebooks

# Reading rates, each with its reason. Prose: 150 words a minute, below the ~240 of silent
# reading of non-fiction, because the chapters' prose carries numbers, formulas and API names.
# Code: 20 visible lines a minute (3 s a line: read, not typed; the cells run by Run All).
# A table: half a minute; a figure: a minute (axes, legend, what the text says of it).
RATES = {"words": 150.0, "code_lines": 20.0, "tables": 2.0, "figures": 1.0}
# An exercise: 4 minutes (read, compute or look up, compare with the hidden answer).
EXERCISE_MINUTES = 4

START = 9 * 60  # each day starts at 09:00


@dataclass(frozen=True)
class Chapter:
    """What one chapter block asks: the prediction made before running, the discussion
    question, the expected numbers (label, glue name, glue name of its spread or ``None``),
    and what changes without a GPU."""

    key: str
    predict: str
    discuss: str
    expected: tuple[tuple[str, str, str | None], ...]
    no_gpu: str = ""


CPU_FALLBACK = (
    "Run it on the CPU lane (`FP8LAB_PRESET=smoke`, the CPU reference of TE, under a minute) "
    "to see every cell work, then read the GPU numbers and figures on the chapter's page."
)
CHAPTERS: dict[str, Chapter] = {
    c.key: c
    for c in (
        Chapter("00",
                "your GPU's BF16 and FP8 GEMM rates from its datasheet, and the FP8/BF16 ratio",
                "Why does FP8's 2x on paper shrink at the layer's real shapes?",
                (("BF16 ceiling (TFLOP/s)", "bf16_ceiling", "bf16_spread"),
                 ("FP8 ceiling (TFLOP/s)", "fp8_ceiling", "fp8_spread"),
                 ("FP8/BF16 at the FC1 GEMM", "fp8_speedup_fc1", None),
                 ("copy bandwidth (TB/s)", "bw_ceiling", None),
                 ("FP8 ridge point (FLOP/byte)", "ridge_fp8", None))),
        Chapter("01",
                "the share of a real gradient's values that flush to zero in E4M3 unscaled",
                "Why one scale per tensor, and not one scale shared by all layers?",
                (("E4M3 maximum", "e4m3_max", None),
                 ("E5M2 maximum", "e5m2_max", None),
                 ("gradients flushed to zero in E4M3, unscaled", "grad_underflow_e4m3", None),
                 ("E5M2 error, own scale (median)", "grad_e5m2_own_median", None))),
        Chapter("02",
                "which recipe makes the layer fastest, and whether FP8 ends inside BF16's band",
                "When would you pick current scaling over delayed scaling, and why block?",
                (("delayed scaling over BF16", "speedup_delayed", None),
                 ("current scaling over BF16", "speedup_current", None),
                 ("block scaling over BF16", "speedup_block", None),
                 ("BF16 seed band of the final loss", "band", None),
                 ("output error at the spike, delayed", "spike_delayed", None))),
        Chapter("03",
                "the step-time speed-up of each form of the layer in FP8 over BF16",
                "Why does the whole layer gain less than its GEMMs do?",
                (("BF16 baseline step (ms)", "baseline_ms", None),
                 ("fastest FP8 form", "best_name", None),
                 ("its speed-up over eager BF16", "best_x_eager", "best_range_eager"),
                 ("GEMM-only speed-up", "gemm_speedup", None),
                 ("hidden sizes where FP8 loses", "fp8_loses_at", None)),
                "On a CPU, FP8 attention, CUDA graphs and `torch.compile` are skipped, each "
                "with a label."),
        Chapter("04",
                "the layer's MFU in BF16 and in FP8",
                "Which peak is the honest denominator of an FP8 run's MFU?",
                (("layer in BF16 (TFLOP/s)", "layer_bf16_tflops", None),
                 ("layer in FP8 (TFLOP/s)", "layer_fp8_tflops", None),
                 ("FP8 over BF16", "fp8_over_bf16", None),
                 ("GPT-3 on 1024 GPUs, BF16 (days)", "gpt3_bf16_days", None),
                 ("the same in FP8 (days)", "gpt3_fp8_days", None))),
        Chapter("05",
                "which backend TE picks by default, and what one scaling update does to FP8 "
                "attention's error with and without a causal mask",
                "Why does FP8 attention's error weigh more than its speed?",
                (("default backend, from TE's log", "log_default", None),
                 ("SDPA rival that tied or beat TE", "rival", None),
                 ("FP8 attention error, causal, after an update", "causal_after", None),
                 ("FP8 attention error, no mask, after an update", "nomask_after", None)),
                "On a CPU the FP8 attention rows stay empty."),
        Chapter("06",
                "the bytes per parameter of an FP8 weight at rest and during training",
                "When do FP8 weights save memory, and when do they save only time?",
                (("fastest setting over BF16 (step time)", "fastest_vs_bf16", None),
                 ("peak memory change", "peak_change", None),
                 ("fastest setting", "fastest", None)),
                "On a CPU the device-memory rows stay empty."),
        Chapter("07",
                "a training step's peak memory, and the event where it happens",
                "Which lever lowers the peak most for the least time?",
                (("bytes per parameter, mixed-precision Adam", "classic", None),
                 ("estimate vs measurement, median error", "heldout_median", None),
                 ("full recompute: memory saved", "full_saved", None),
                 ("the step without full recompute, against with it", "recompute_full",
                  None)),
                "Its measured memory comes from committed GPU results, shown beside the "
                "estimate."),
        Chapter("08",
                "DDP's scaling efficiency over the GPUs of your box (the book's: over the "
                "GPUs its stamp names), in BF16 and in FP8",
                "At the same batch, what pulls FP8's scaling efficiency below BF16's, and "
                "what pulls it above?",
                (("DDP efficiency over rounds (median rank), BF16", "fair_ddp_bf16", None),
                 ("DDP efficiency over rounds (median rank), FP8", "fair_ddp_fp8", None),
                 ("all-reduce bus bandwidth β (GB/s)", "ar_beta", None),
                 ("fastest FP8 layout per GPU", "best_layout", None)),
                "It needs two GPUs of one box: give those boxes to pairs. Without them it runs "
                "on two CPU processes; the context-parallel and Userbuffers rows need GPUs and "
                "come from the page."),
        Chapter("09",
                "whether each FP8 recipe trains the Llama-shaped model as well as BF16, and "
                "whether it pays on the whole training step",
                "What speed-up would pay for an FP8 recipe's accuracy cost, and which recipe "
                "would you pick?",
                (("delayed scaling: final validation loss against BF16", "accuracy_delayed",
                  None),
                 ("current scaling: final validation loss against BF16", "accuracy_current",
                  None),
                 ("block scaling: final validation loss against BF16", "accuracy_block", None),
                 ("trained model: TE delayed FP8 over TE BF16", "llama_te_delayed_x",
                  "llama_te_delayed_rounds"),
                 ("five Llama 3 8B layers: TE delayed FP8 over TE BF16", "large_te_delayed_x",
                  "large_te_delayed_rounds"),
                 ("BF16 seed band (final validation loss)", "band_range", None)),
                "Its accuracy runs and speed rounds are committed GPU results, which the page "
                "reads on any machine; the live steps and the first-update probe run on the "
                "CPU at smoke size."),
        Chapter("10",
                "FP8 GroupedLinear against BF16 at the base shape, and whether a small MoE "
                "model trains as well in FP8",
                "Why can FP8 lose on an MoE layer when it wins on a dense one?",
                (("FP8 delayed against BF16, base shape", "moe_base_delayed", None),
                 ("GroupedLinear against a loop of nn.Linear, BF16", "moe_grouped_vs_loop",
                  None),
                 ("FP8 current scaling: final loss against BF16", "moe_lm_fp8_current", None),
                 ("tokens a BF16 router sends elsewhere", "router_moved", None)),
                "It needs one FP8 GPU; its expert-parallel section uses two GPUs of one box "
                "where it finds them, else two CPU processes."),
    )
}  # fmt: skip


# What a short agenda keeps of a chapter: the sections read (heading prefixes; the chapter's
# opening is always read) and the exercises done (the first ones, the prediction included).
FOCUS: dict[str, tuple[tuple[str, ...], int]] = {
    "00": (("Measured: matrix products", "Ceilings"), 1),
    "01": (("Why scaling",), 1),
    "02": (("The recipes", "Step time", "Training curves"), 1),
    "03": (("Step time of each form", "The fastest form", "When FP8 does not pay"), 1),
    "04": (("MFU and HFU", "Arithmetic intensity"), 1),
    "05": (("Which backend runs", "Speed", "How to choose"), 1),
    "06": (("1. Where the weight bytes live", "2. Training with FP8 weights"), 1),
    "07": (("Where the bytes go", "Activations, recompute"), 1),
    "09": (("Does FP8 train", "How much faster"), 1),
    "10": (("The router", "Speed", "Accuracy"), 1),
}


@dataclass(frozen=True)
class Block:
    """One block of an agenda: ``minutes`` allotted, and a chapter key or an activity;
    ``focus`` reads only the chapter's :data:`FOCUS` sections and does its exercises."""

    minutes: int
    chapter: str | None = None
    activity: str = ""
    focus: bool = False


def _c(minutes: int, key: str, focus: bool = False) -> Block:
    return Block(minutes, key, focus=focus)


def _f(minutes: int, key: str) -> Block:
    return Block(minutes, key, focus=True)


def _a(minutes: int, activity: str) -> Block:
    return Block(minutes, None, activity)


_WELCOME = "Welcome; everyone runs the doctor"
_CARD = "The decision card; questions"
_FORMATS = (
    "Formats and scaling in ten minutes: E4M3 and E5M2, one scale per tensor, delayed "
    "against current scaling (the figures of chapters 01 and 02), which chapter 03 and the "
    "decision card assume"
)
AGENDAS: dict[str, tuple[str, tuple[tuple[Block, ...], ...]]] = {
    "taster": ("Taster", (
        (_a(10, _WELCOME), _f(25, "00"), _a(10, _FORMATS), _f(35, "03"), _a(10, _CARD)),)),
    "session": ("Half day", (
        (_a(15, _WELCOME), _f(25, "00"), _f(25, "01"), _f(30, "02"), _a(10, "Break"),
         _f(40, "03"), _f(25, "04"), _a(10, _CARD)),)),
    "day": ("Full day", (
        (_a(15, _WELCOME), _f(25, "00"), _f(25, "01"), _f(30, "02"), _a(10, "Break"),
         _f(40, "03"), _f(25, "04"), _a(45, "Lunch"), _f(35, "05"), _f(65, "06"),
         _a(15, "Break"), _f(25, "07"), _f(20, "09"), _a(15, _CARD)),)),
    "course": ("Two days, with the two-GPU chapter", (
        (_a(30, _WELCOME + "; set-up problems fixed"), _c(45, "00"), _c(40, "01"),
         _a(15, "Break"), _c(55, "02"), _a(45, "Lunch"), _c(90, "03"), _a(15, "Break"),
         _c(55, "04"), _a(10, "Break"), _c(90, "05"), _a(10, "Review of day 1")),
        (_a(10, "Recap; the doctor on the two-GPU boxes"), _c(125, "06"), _a(10, "Break"),
         _c(100, "07"), _a(40, "Lunch"), _c(150, "08"), _a(10, "Break"),
         _f(20, "09"), _f(40, "10"), _a(10, _CARD + "; what to measure at home")),
    )),
}  # fmt: skip


@dataclass(frozen=True)
class Need:
    """Minutes a chapter block needs: ``run`` (stamped seconds, rounded up), ``reading``
    (derived from ``material``), ``exercises``; ``seconds``, ``gpu`` and ``gpus`` say where
    the run time was stamped."""

    chapter: str
    seconds: float
    gpu: str
    gpus: int
    run: int
    reading: int
    exercises: int
    material: notebooks.Material

    @property
    def total(self) -> int:
        return self.run + self.reading + self.exercises


def reading_minutes(material: notebooks.Material) -> int:
    """Minutes to read ``material`` at :data:`RATES` (rounded up)."""
    if not isinstance(material, notebooks.Material):
        raise TypeError(f"material={checks.show(material)}: must be a notebooks.Material")
    minutes = (material.words / RATES["words"] + material.code_lines / RATES["code_lines"]
               + material.tables / RATES["tables"] + material.figures / RATES["figures"])
    return max(1, math.ceil(minutes))


def _exercise_count(key: str) -> int:
    from fp8lab.workshop import answers

    return len(notebooks.exercises(key)) + sum(e.startswith(key + ".") for e in answers.EXTRA)


def need(chapter, focus: bool = False) -> Need:
    """The minutes ``chapter`` needs (only its :data:`FOCUS` with ``focus``), its run time read
    from its notebook's stamp and its reading time from its committed text."""
    key = notebooks.chapter_key(chapter)
    if key not in CHAPTERS:
        raise ValueError(f"chapter={key!r}: the workshop plan has no block for it")
    if not isinstance(focus, bool):
        raise TypeError(f"focus={checks.show(focus)}: must be True or False")
    if focus and key not in FOCUS:
        raise ValueError(f"focus=True: chapter {key} has no focus declared in FOCUS")
    stamped = chapters.stamped_run(key)
    sections, done = FOCUS[key] if focus else (None, _exercise_count(key))
    material = notebooks.material(key, sections)
    run = max(1, math.ceil(stamped["seconds"] / 60))
    return Need(key, stamped["seconds"], stamped["gpu"], stamped["gpus"], run,
                reading_minutes(material), done * EXERCISE_MINUTES, material)  # fmt: skip


@dataclass(frozen=True)
class Slot:
    """One timed row of an agenda: day (1, 2, ...), start and end as ``"HH:MM"``, the block."""

    day: int
    start: str
    end: str
    block: Block


def _clock(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def agenda(name: str) -> list[Slot]:
    """The timed rows of agenda ``name`` (``"taster"``, ``"session"``, ``"day"``, ``"course"``)."""
    checks.choice("name", name, AGENDAS)
    slots = []
    for day, blocks in enumerate(AGENDAS[name][1], start=1):
        clock = START
        for block in blocks:
            slots.append(Slot(day, _clock(clock), _clock(clock + block.minutes), block))
            clock += block.minutes
    return slots


def agenda_minutes(name: str) -> int:
    """The total minutes of agenda ``name``, all days together."""
    return sum(slot.block.minutes for slot in agenda(name))


def over_budget() -> list[str]:
    """Every chapter block whose stamped run plus reading and exercises exceeds its minutes."""
    problems = []
    for name in AGENDAS:
        for slot in agenda(name):
            if slot.block.chapter is None:
                continue
            wanted = need(slot.block.chapter, slot.block.focus)
            if wanted.total > slot.block.minutes:
                problems.append(
                    f"{name}, day {slot.day}, chapter {wanted.chapter}: needs {wanted.total} min "
                    f"({wanted.run} run on {wanted.gpu} + {wanted.reading} reading + "
                    f"{wanted.exercises} exercises), allotted {slot.block.minutes}"
                )
    return problems
