"""Chapter 09's speed ratios, measured in alternating rounds, with the GPU setting the time.

:func:`measure` builds several settings of one model side by side on one GPU and times them
by the book's protocol (:func:`fp8lab.protocol.rounds`): every round times ``steps`` whole
training steps of each setting (batch, forward, loss, backward, clipping, optimizer), the order
reversed every other round, so every ratio is taken from neighbouring seconds; :func:`ratio`
judges it with its interval over the rounds against the session floor.

The host must not set the time. The small model's step is short enough that Python and the
kernel launches would (chapter 03), so its settings run as CUDA graphs: TE's model and loss
captured by ``te.make_graphed_callables``, PyTorch's compiled with
``mode="reduce-overhead"`` (:mod:`fp8lab.e2e.steps`). A capture that raises is recorded as
refused, with its reason, and the setting is timed without graphs (marked so). The large
model's step is long enough for the GPU to set the time without graphs; each round records
the host's time to issue the steps beside the device's time (CUDA events), which shows it.
Losses stay on the device: no step waits for the host.

Each group of settings starts with TE BF16, the anchor every ratio of the chapter is taken
against; the large model's groups hold two settings each, to fit one 80 GB GPU. The steps
train at the plan's peak learning rate on the plan's batch shape, from the shared initial
weights. The file is stamped like the long runs (:func:`stamp`).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict

import numpy as np
import torch

from fp8lab import checks, flops, protocol
from fp8lab import corpus as text
from fp8lab.e2e import steps as stepping
from fp8lab.e2e.bench import Bench
from fp8lab.e2e.results import ROOT, result_modules
from fp8lab.e2e.run import _one_line
from fp8lab.e2e.settings import MODELS, SETTINGS

RESULTS_FILE = ROOT / "tests" / "gpu_results" / "e2e_speed.json"
ANCHOR = "bf16"
GROUPS = {
    "small": (("bf16", "te-delayed", "te-current", "torch-bf16-compiled"),),
    "large": (("bf16", "te-current"), ("bf16", "te-delayed"), ("bf16", "torch-bf16-compiled")),
}
GRAPHED = {"small": True, "large": False}  # CUDA graphs where the host would set the time
ROUNDS = {"small": (7, 10), "large": (5, 5)}  # (rounds, steps per round)
SCHEMA = 2


def build_step(bench: Bench, model: str, name: str, graphs: bool):
    """``(step, what ran)``: one setting of ``model`` built from the shared weights, captured
    as CUDA graphs where ``graphs`` asks and this stack allows."""
    setting, plan = SETTINGS[name], bench.plan(model)
    fp8_recipe = bench._fp8_recipe(setting)
    fp8 = {"te": bench.te, "fp8_recipe": fp8_recipe} if fp8_recipe is not None else {}
    graphs = graphs and bench.on_gpu
    _, optimizer, trained = bench._build(model, setting, fp8_recipe, graphs=graphs)
    batches = iter(text.PackedLoader(bench.train_tokens, plan.batch, plan.seq, device=bench.device))
    what = {"graphs": None, "refused": None}
    if graphs and setting.form == "te_layer":
        try:
            trained = stepping.graph_te(trained, next(batches), bench.te, fp8_recipe)
            what["graphs"] = "te.make_graphed_callables"
        except Exception as error:  # a capture this stack refuses: timed without graphs
            what["refused"] = _one_line(error)
    elif graphs and setting.compile:
        what["graphs"] = 'torch.compile(mode="reduce-overhead")'

    def step():
        return stepping.step(trained, next(batches), optimizer, plan.max_grad_norm, fp8)

    return step, what


def _first_steps(bench: Bench, model: str, name: str, graphs: bool, warmup: int):
    """Build ``name`` and take its warm-up steps; where the graphed form fails on its first
    steps, record why and fall back to the form without graphs."""
    step, what = build_step(bench, model, name, graphs)
    try:
        for _ in range(max(1, warmup)):
            step()
        return step, what
    except Exception as error:
        if not (graphs and what["graphs"]):
            raise
        refused = f"{what['graphs']}: {_one_line(error)}"
    del step
    step, what = build_step(bench, model, name, graphs=False)
    for _ in range(max(1, warmup)):
        step()
    return step, {**what, "refused": refused}


def time_group(bench: Bench, model: str, settings, rounds: int, steps: int, warmup: int) -> dict:
    """Build ``settings`` of ``model`` side by side, warm each up, then time them in rounds
    (:func:`fp8lab.protocol.rounds`: ``steps`` steps of each per round, the order reversed every
    other round). Returns ``{"settings", "ms_per_step", "host_ms_per_step", "what_ran"}``, one
    list per setting: its device and host ms per step in each round (median over its steps)."""
    graphs = GRAPHED[model]
    step_of, what_ran = {}, {}
    for name in settings:
        step_of[name], what_ran[name] = _first_steps(bench, model, name, graphs, warmup)
    timed = protocol.rounds(
        step_of, rounds=rounds, calls=steps, warmup=0, kernel_time=None, device=bench.device
    )
    del step_of
    bench.release()
    return {
        "settings": list(settings),
        "ms_per_step": {n: [round(v, 3) for v in timed.round_ms(n)] for n in settings},
        "host_ms_per_step": {n: [round(v, 3) for v in timed.host[n]] for n in settings},
        "what_ran": what_ran,
    }


def measure(bench: Bench, models=MODELS, rounds=None, steps=None, warmup=5, log=print) -> dict:
    """Every group of every model in ``models`` (rounds and steps per round: :data:`ROUNDS`
    unless given); off the GPU, the compiled settings are left out of their groups."""
    rounds = None if rounds is None else checks.integer("rounds", rounds, minimum=2)
    steps = None if steps is None else checks.integer("steps", steps)
    warmup = checks.integer("warmup", warmup, minimum=0)
    record = {"schema": SCHEMA, "preset": bench.preset, "warmup": warmup, "models": {}}
    for model in models:
        checks.choice("model", model, MODELS)
        plan = bench.plan(model)
        model_rounds, model_steps = rounds or ROUNDS[model][0], steps or ROUNDS[model][1]
        groups = []
        for group in GROUPS[model]:
            runnable = tuple(n for n in group if bench.on_gpu or SETTINGS[n].gpu_only is None)
            begin = time.perf_counter()
            try:
                timed = time_group(bench, model, runnable, model_rounds, model_steps, warmup)
            except Exception as error:  # a group that cannot run here: on record, not fatal
                timed = {"settings": list(runnable), "ms_per_step": {}, "host_ms_per_step": {}}
                timed.update(what_ran={}, error=_one_line(error))
                bench.release()
            groups.append(timed)
            log(f"{model} {', '.join(runnable)}: {time.perf_counter() - begin:.0f} s")
        cfg = bench.config(model)
        record["models"][model] = {
            "config": asdict(cfg),
            "tokens_per_step": plan.tokens_per_step,
            "flops_per_step": flops.training_flops(cfg, plan.batch, plan.seq, causal=True),
            "graphs": GRAPHED[model] and bench.on_gpu,
            "rounds": model_rounds,
            "steps": model_steps,
            "groups": groups,
        }
    return record


def ratio(record: dict, model: str, setting: str, baseline: str = ANCHOR) -> dict | None:
    """How many times faster ``setting`` ran than ``baseline`` (time of ``baseline`` over time of
    ``setting``, round by round), from the first group of ``model`` that holds both, judged by
    the protocol (:meth:`fp8lab.protocol.Rounds.compare`): ``{"median"`` (of the per-round
    ratios), ``"estimate"``, ``"low"``, ``"high"`` (its 95% interval), ``"rounds"``,
    ``"verdict"}``, or None where no group holds both."""
    for group in record["models"][model]["groups"]:
        times = group["ms_per_step"]
        if setting in times and baseline in times:
            per_round = {n: [[ms] for ms in times[n]] for n in (setting, baseline)}
            found = protocol.Rounds.from_times(per_round).compare(setting, baseline)
            return {
                "median": statistics.median(found.ratios),
                "estimate": found.estimate,
                "low": found.low,
                "high": found.high,
                "rounds": len(found.ratios),
                "verdict": found.verdict,
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


def measure_and_write(bench: Bench, models, out, rounds=None, steps=None, log=print) -> dict:
    """:func:`measure`, with the corpus, the device and the :func:`stamp` (once every model is
    measured), written to ``out`` (JSON) after each model; returns the record."""
    begin, record = time.perf_counter(), None
    out.parent.mkdir(parents=True, exist_ok=True)
    for model in models:  # written after each model: a run cut short keeps what it measured
        part = measure(bench, (model,), rounds=rounds, steps=steps, log=log)
        record = (
            part if record is None else {**record, "models": {**record["models"], **part["models"]}}
        )
        record["corpus"] = bench.corpus.describe()
        record["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        record["stamp"] = None
        if model == models[-1]:
            record["stamp"] = stamp(record, time.perf_counter() - begin)
        out.write_text(json.dumps(record, indent=1) + "\n")
    return record


def summary(record: dict, models) -> list[str]:
    """One line per measured setting: its ratio to TE BF16, the interval and the verdict."""
    lines = []
    for model in models:
        for name in SETTINGS:
            found = ratio(record, model, name)
            if found and name != ANCHOR:
                lines.append(
                    f"{model} {name}: {found['estimate']:.3f}x TE BF16 "
                    f"({found['low']:.3f}-{found['high']:.3f}, {found['verdict']})"
                )
    return lines
