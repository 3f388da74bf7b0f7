"""The workshop's plan: what each chapter block asks of participants, and four timed agendas.

A chapter block's time is its **run time** (the GPU lane's stamped seconds for the whole chapter
on the ``full`` preset, rounded up to minutes) plus the **reading** and **exercise** minutes
declared here; the agenda allots each block a fixed number of minutes, and
:func:`over_budget` lists every block whose need exceeds its allotment (a test keeps it empty,
so a chapter that grows slower after a re-run cannot silently overrun its block).
The expected numbers are glue names; their values come from the committed outputs
(:mod:`fp8lab.workshop.outputs`), never from here; the run times from the stamps
(:func:`tools.workshop.chapters.stamped_run`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fp8lab import checks
from fp8lab.workshop import outputs
from tools.workshop import chapters

START = 9 * 60  # each day starts at 09:00


@dataclass(frozen=True)
class Chapter:
    """What one chapter block asks: minutes to read and to do the exercises, the prediction made
    before running, the discussion question, the expected numbers (label, glue name, glue name
    of its spread or ``None``), and what changes without a GPU."""

    key: str
    reading: int
    exercises: int
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
        Chapter("00", 10, 10,
                "your GPU's BF16 and FP8 GEMM rates from its datasheet, and the FP8/BF16 ratio",
                "Why does FP8's 2x on paper shrink at the layer's real shapes?",
                (("BF16 ceiling (TFLOP/s)", "bf16_ceiling", "bf16_spread"),
                 ("FP8 ceiling (TFLOP/s)", "fp8_ceiling", "fp8_spread"),
                 ("FP8/BF16 at the FC1 GEMM", "fp8_speedup_fc1", None),
                 ("copy bandwidth (TB/s)", "bw_ceiling", None),
                 ("FP8 ridge point (FLOP/byte)", "ridge_fp8", None))),
        Chapter("01", 10, 10,
                "the share of a real gradient's values that flush to zero in E4M3 unscaled",
                "Why one scale per tensor, and not one scale shared by all layers?",
                (("E4M3 maximum", "e4m3_max", None),
                 ("E5M2 maximum", "e5m2_max", None),
                 ("gradients flushed to zero in E4M3, unscaled", "grad_underflow_e4m3", None),
                 ("E5M2 error, own scale (median)", "grad_e5m2_own_median", None))),
        Chapter("02", 12, 10,
                "which recipe makes the layer fastest, and whether FP8 ends inside BF16's band",
                "When would you pick current scaling over delayed scaling, and why block?",
                (("delayed scaling over BF16", "speedup_delayed", None),
                 ("current scaling over BF16", "speedup_current", None),
                 ("block scaling over BF16", "speedup_block", None),
                 ("BF16 seed band of the final loss", "band", None),
                 ("output error at the spike, delayed", "spike_delayed", None))),
        Chapter("03", 20, 15,
                "the step-time speed-up of each form of the layer in FP8 over BF16",
                "Why does the whole layer gain less than its GEMMs do?",
                (("BF16 baseline step (ms)", "baseline_ms", None),
                 ("fastest FP8 form", "best_name", None),
                 ("its speed-up over eager BF16", "best_x_eager", "best_range_eager"),
                 ("GEMM-only speed-up", "gemm_speedup", None),
                 ("hidden sizes where FP8 loses", "fp8_loses_at", None)),
                "On a CPU, FP8 attention, CUDA graphs and `torch.compile` are skipped, each "
                "with a label."),
        Chapter("04", 12, 10,
                "the layer's MFU in BF16 and in FP8",
                "Which peak is the honest denominator of an FP8 run's MFU?",
                (("layer in BF16 (TFLOP/s)", "layer_bf16_tflops", None),
                 ("layer in FP8 (TFLOP/s)", "layer_fp8_tflops", None),
                 ("FP8 over BF16", "fp8_over_bf16", None),
                 ("GPT-3 on 1024 GPUs, BF16 (days)", "gpt3_bf16_days", None),
                 ("the same in FP8 (days)", "gpt3_fp8_days", None))),
        Chapter("05", 15, 10,
                "how much faster fused attention is than the math path, and where FP8 pays",
                "Why does FP8 attention's error weigh more than its speed?",
                (("fastest backend", "top_backend", None),
                 ("its rate (TFLOP/s)", "top_tflops", None),
                 ("math path over TE at S = 4096", "math_vs_te_4k", None),
                 ("FP8 attention pays from", "fp8_pays_from", None)),
                "On a CPU the FP8 attention rows stay empty."),
        Chapter("06", 15, 12,
                "the bytes per parameter of an FP8 weight at rest and during training",
                "When do FP8 weights save memory, and when do they save only time?",
                (("fastest setting over BF16 (step time)", "fastest_vs_bf16", None),
                 ("peak memory change", "peak_change", None),
                 ("fastest setting", "fastest", None)),
                "On a CPU the device-memory rows stay empty."),
        Chapter("07", 12, 12,
                "a training step's peak memory, and the event where it happens",
                "Which lever lowers the peak most for the least time?",
                (("bytes per parameter, mixed-precision Adam", "classic", None),
                 ("estimate vs measurement, median error", "heldout_median", None),
                 ("full recompute: memory saved", "full_saved", None),
                 ("full recompute: slower by", "full_slower", None)),
                "Its measured memory comes from committed GPU results, shown beside the "
                "estimate."),
        Chapter("08", 15, 15,
                "DDP's scaling efficiency over two GPUs, in BF16 and in FP8",
                "Why does FP8 lower the scaling efficiency at the same batch?",
                (("DDP efficiency over rounds, BF16", "fair_ddp_bf16", None),
                 ("DDP efficiency over rounds, FP8", "fair_ddp_fp8", None),
                 ("all-reduce bus bandwidth β (GB/s)", "ar_beta", None),
                 ("best layout", "best_layout", None)),
                "It needs two GPUs of one box: give those boxes to pairs. Without them it runs "
                "on two CPU processes; the context-parallel and Userbuffers rows need GPUs and "
                "come from the page."),
        Chapter("09", 15, 15,
                "whether FP8 trains as well as BF16, and whether it pays on each model",
                "What would make FP8 pay on the small model, and at what cost?",
                (("small model: TE delayed FP8 over TE BF16", "small_te_delayed_x",
                  "small_te_delayed_rounds"),
                 ("large model: TE delayed FP8 over TE BF16", "large_te_delayed_x",
                  "large_te_delayed_rounds"),
                 ("small model: BF16 seed band (validation loss)", "band_range", None)),
                "Its long training runs and speed rounds are committed results, shown beside "
                "the CPU lane's own."),
    )
}  # fmt: skip


@dataclass(frozen=True)
class Block:
    """One block of an agenda: ``minutes`` allotted, and a chapter key or an activity."""

    minutes: int
    chapter: str | None = None
    activity: str = ""


def _c(minutes: int, key: str) -> Block:
    return Block(minutes, key)


def _a(minutes: int, activity: str) -> Block:
    return Block(minutes, None, activity)


_WELCOME = "Welcome; everyone runs the doctor"
_CARD = "The decision card; questions"
AGENDAS: dict[str, tuple[str, tuple[tuple[Block, ...], ...]]] = {
    "taster": ("Taster", (
        (_a(10, _WELCOME), _c(25, "00"), _c(45, "03"), _a(10, _CARD)),)),
    "session": ("Half day", (
        (_a(15, _WELCOME), _c(25, "00"), _c(25, "01"), _c(30, "02"), _a(10, "Break"),
         _c(45, "03"), _c(25, "04"), _a(5, _CARD)),)),
    "day": ("Full day", (
        (_a(20, _WELCOME), _c(25, "00"), _c(25, "01"), _c(30, "02"), _a(15, "Break"),
         _c(45, "03"), _c(25, "04"), _a(60, "Lunch"), _c(35, "05"), _c(35, "06"),
         _a(15, "Break"), _c(30, "07"), _c(40, "09"), _a(20, _CARD)),)),
    "course": ("Two days, with the two-GPU chapter", (
        (_a(30, _WELCOME + "; set-up problems fixed"), _c(40, "00"), _c(40, "01"),
         _a(15, "Break"), _c(45, "02"), _a(60, "Lunch"), _c(60, "03"), _a(15, "Break"),
         _c(40, "04"), _a(20, "Review of day 1")),
        (_a(15, "Recap; the doctor on the two-GPU boxes"), _c(45, "05"), _c(45, "06"),
         _a(15, "Break"), _c(40, "07"), _a(60, "Lunch"), _c(50, "08"), _a(15, "Break"),
         _c(50, "09"), _a(30, _CARD + "; what to measure at home")),
    )),
}  # fmt: skip


@dataclass(frozen=True)
class Need:
    """Minutes a chapter block needs: ``run`` (stamped seconds, rounded up), ``reading``,
    ``exercises``; ``seconds``, ``gpu`` and ``gpus`` say where the run time was stamped."""

    chapter: str
    seconds: float
    gpu: str
    gpus: int
    run: int
    reading: int
    exercises: int

    @property
    def total(self) -> int:
        return self.run + self.reading + self.exercises


def need(chapter) -> Need:
    """The minutes ``chapter`` needs, its run time read from its notebook's stamp."""
    key = outputs.chapter_key(chapter)
    if key not in CHAPTERS:
        raise ValueError(f"chapter={key!r}: the workshop plan has no block for it")
    stamped = chapters.stamped_run(key)
    plan = CHAPTERS[key]
    run = max(1, math.ceil(stamped["seconds"] / 60))
    return Need(key, stamped["seconds"], stamped["gpu"], stamped["gpus"], run, plan.reading,
                plan.exercises)  # fmt: skip


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
            wanted = need(slot.block.chapter)
            if wanted.total > slot.block.minutes:
                problems.append(
                    f"{name}, day {slot.day}, chapter {wanted.chapter}: needs {wanted.total} min "
                    f"({wanted.run} run on {wanted.gpu} + {wanted.reading} reading + "
                    f"{wanted.exercises} exercises), allotted {slot.block.minutes}"
                )
    return problems
