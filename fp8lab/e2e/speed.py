"""Chapter 09's speed ratios, measured in alternating rounds.

The long runs (:mod:`fp8lab.e2e.run`) run one setting after another, so a slow minute of a
shared machine lands on whichever setting ran then. :func:`measure` builds several settings of
one model side by side on one GPU and times them in rounds, in a rotating order: every round
times ``steps`` whole training steps of each setting (batch, forward, loss, backward, clipping,
optimizer, ``loss.item()``), so every ratio is taken from neighbouring minutes, and the spread
of a ratio over the rounds shows how far noise moved it.

Each group of settings starts with TE BF16, the anchor every ratio of the chapter is taken
against; settings that would not fit on the GPU together go into separate groups (the large
model's four groups each hold four models' weights and optimizer states at most). The steps
train at the plan's peak learning rate on the plan's batch shape, from the shared initial
weights. The file is stamped like the long runs (:func:`stamp`).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import numpy as np
import torch

from fp8lab import checks
from fp8lab.e2e.bench import Bench
from fp8lab.e2e.results import ROOT, result_modules
from fp8lab.e2e.settings import FASTEST_VARIANTS, MODELS, SETTINGS

RESULTS_FILE = ROOT / "tests" / "gpu_results" / "e2e_speed.json"
ANCHOR = "bf16"
GROUPS = {
    "small": (tuple(SETTINGS),),
    "large": (
        ("bf16", "te-delayed", "te-fastest"),
        ("bf16", "te-current", "te-block"),
        ("bf16", "torch-bf16", "torch-bf16-compiled"),
        ("bf16", "torch-bf16-compiled", "ao-tensorwise", "ao-rowwise"),
    ),
}
SCHEMA = 1


def first_step_that_runs(bench: Bench, model: str, name: str):
    """``(step, what ran)``: the fastest TE form tries its variants in the long runs' order
    (FP8 attention and FP8 weights, then each alone) and keeps the first that takes a step."""
    chosen = SETTINGS[name]
    variants = FASTEST_VARIANTS if name == "te-fastest" else ((None, None),)
    refused = []
    for fp8_attention, fp8_weights in variants:
        setting = chosen
        if fp8_attention is not None:
            setting = replace(chosen, fp8_attention=fp8_attention, fp8_weights=fp8_weights)
        try:
            step = bench.step_function(model, setting)
            step()
        except Exception as error:  # a variant this GPU or the reference cannot run
            refused.append(f"{type(error).__name__}: {error}".splitlines()[0][:200])
            bench.release()  # built first in its group (time_group): nothing else to lose
            continue
        what = {"fp8_attention": setting.fp8_attention, "fp8_weights": setting.fp8_weights}
        return step, {**what, "refused": refused}
    raise RuntimeError(f"{name}: no variant takes a step here: {' | '.join(refused)}")


def runs_on_the_reference(setting: str) -> bool:
    return SETTINGS[setting].gpu_only is None


def time_group(
    bench: Bench, model: str, settings: tuple[str, ...], rounds: int, steps: int, warmup: int
) -> dict:
    """Build ``settings`` of ``model`` side by side, warm each up, then time ``rounds`` rounds of
    ``steps`` steps each in a rotating order. Returns ``{"settings", "ms_per_step",
    "what_ran"}`` with one list per setting in ``ms_per_step``: its mean step time in each
    round. The fastest TE form is built first, so that a variant it gives up frees its memory
    before the others exist."""
    cuda = bench.device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    step_of, what_ran = {}, {}
    for name in sorted(settings, key=lambda n: n != "te-fastest"):
        step_of[name], what_ran[name] = first_step_that_runs(bench, model, name)
    for step in step_of.values():
        for _ in range(warmup):
            step()
    ms_per_step: dict[str, list[float]] = {name: [] for name in settings}
    for index in range(rounds):
        shift = index % len(settings)
        for name in settings[shift:] + settings[:shift]:
            sync()
            begin = time.perf_counter()
            for _ in range(steps):
                step_of[name]()
            sync()
            ms_per_step[name].append(round((time.perf_counter() - begin) * 1e3 / steps, 3))
    del step_of
    bench.release()
    return {"settings": list(settings), "ms_per_step": ms_per_step, "what_ran": what_ran}


def measure(
    bench: Bench,
    models: tuple[str, ...] = MODELS,
    rounds: int = 7,
    steps: int = 10,
    warmup: int = 5,
    log=print,
) -> dict:
    """Every group of every model in ``models``; off the GPU, the compiled settings are left
    out of their groups (the CPU lane does not compile)."""
    rounds = checks.integer("rounds", rounds, minimum=2)
    steps = checks.integer("steps", steps)
    warmup = checks.integer("warmup", warmup, minimum=0)
    record = {
        "schema": SCHEMA,
        "preset": bench.preset,
        "rounds": rounds,
        "steps": steps,
        "warmup": warmup,
        "models": {},
    }
    for model in models:
        checks.choice("model", model, MODELS)
        plan = bench.plan(model)
        groups = []
        for group in GROUPS[model]:
            runnable = tuple(n for n in group if bench.on_gpu or runs_on_the_reference(n))
            begin = time.perf_counter()
            groups.append(time_group(bench, model, runnable, rounds, steps, warmup))
            log(f"{model} {', '.join(runnable)}: {time.perf_counter() - begin:.0f} s")
        record["models"][model] = {"tokens_per_step": plan.tokens_per_step, "groups": groups}
    return record


def ratio(record: dict, model: str, setting: str, baseline: str = ANCHOR) -> dict | None:
    """How many times faster ``setting`` ran than ``baseline`` (time of ``baseline`` over time of
    ``setting``), per round, from the first group of ``model`` that holds both: ``{"median",
    "low", "high", "rounds"}``, or None where no group holds both."""
    for group in record["models"][model]["groups"]:
        times = group["ms_per_step"]
        if setting in times and baseline in times:
            per_round = np.array(times[baseline]) / np.array(times[setting])
            return {
                "median": float(np.median(per_round)),
                "low": float(per_round.min()),
                "high": float(per_round.max()),
                "rounds": len(per_round),
            }
    return None


def tokens_per_s(record: dict, model: str, setting: str) -> float | None:
    """The median over rounds of ``setting``'s tokens/s (its first group), or None."""
    entry = record["models"][model]
    for group in entry["groups"]:
        if setting in group["ms_per_step"]:
            return entry["tokens_per_step"] / (np.median(group["ms_per_step"][setting]) / 1e3)
    return None


def stamp(record: dict, seconds: float) -> dict | None:
    """The stamp of a full-preset measurement on a GPU with TE; None elsewhere."""
    from fp8lab import stamp as lane

    if not (record["preset"] == "full" and torch.cuda.is_available()):
        return None
    return lane.stamp_record(result_modules("tools.e2e_speed"), run_seconds=round(seconds, 1))


def measure_and_write(bench: Bench, models, out, rounds: int = 7, steps: int = 10, log=print):
    """:func:`measure`, with the corpus, the device and the :func:`stamp`, written to ``out``
    (JSON); returns the record."""
    begin = time.perf_counter()
    record = measure(bench, tuple(models), rounds=rounds, steps=steps, log=log)
    record["corpus"] = bench.corpus.describe()
    record["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    record["stamp"] = stamp(record, time.perf_counter() - begin)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    return record


def summary(record: dict, models) -> list[str]:
    """One line per measured setting: its median ratio to TE BF16 and the range over rounds."""
    lines = []
    for model in models:
        for name in SETTINGS:
            found = ratio(record, model, name)
            if found and name != ANCHOR:
                lines.append(
                    f"{model} {name}: {found['median']:.3f}x TE BF16 "
                    f"({found['low']:.3f}-{found['high']:.3f})"
                )
    return lines
