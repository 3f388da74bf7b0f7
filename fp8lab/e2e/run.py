"""One long run of chapter 09: train one model in one setting and return its result record.

The step is :func:`fp8lab.e2e.steps.step`: the host never waits for the device inside an
evaluation interval (losses stay on the device, :class:`~fp8lab.e2e.steps.LossLog`), and the
learning-rate schedule advances on the host. After each interval the run reads the losses back,
measures the validation loss and the interval's wall time. Each record holds the training loss
of every step, the validation loss at the end of the warm-up, every ``eval_every`` steps and at
the end, the milliseconds per step of each interval (host and device together: a speed verdict
comes from :mod:`fp8lab.e2e.speed`, not from these), peak memory, what exactly ran (recipe,
calibration, optimizer, compilation) and the corpus and tokenizer it ran on.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict

import torch

from fp8lab import checks, flops
from fp8lab import corpus as text
from fp8lab.e2e import steps as stepping
from fp8lab.e2e.evaluation import evaluate
from fp8lab.e2e.results import finite, write_record
from fp8lab.e2e.settings import GROUPS, MODELS, SCHEMA, SETTINGS, SPLIT_BY, Setting
from fp8lab.speedometer import Clock


class FirstStepFailed(RuntimeError):
    """A setting could not take its first training step here."""


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".splitlines()[0][:300]


def _header(bench, model: str, setting: str, seed: int, steps: int) -> dict:
    """The part of a record that says what was asked for and on what data."""
    plan, cfg = bench.plan(model), bench.config(model)
    return {
        "schema": SCHEMA,
        "model": model,
        "setting": setting,
        "label": SETTINGS[setting].label,
        "seed": seed,
        "preset": bench.preset,
        "config": asdict(cfg),
        "parameters": flops.parameter_count(cfg),
        "plan": asdict(plan),
        "steps_planned": plan.steps,
        "steps_requested": steps,
        "corpus": {**bench.corpus.describe(), "split_by": SPLIT_BY},
        "tokenizer": {
            "vocab_size": bench.tokenizer.get_vocab_size(),
            "model_vocab_size": bench.vocab_size,
            "sha256": text.tokenizer_sha256(bench.tokenizer),
            "train_tokens": int(bench.train_tokens.size),
            "validation_tokens": int(bench.validation_tokens.size),
        },
        "device": torch.cuda.get_device_name() if bench.device.type == "cuda" else "cpu",
        "notes": [],
        "error": None,
    }


def run(bench, model: str, setting: str, seed: int = 0, steps: int | None = None) -> dict:
    """Train ``model`` in ``setting`` with data order ``seed`` for ``steps`` (default: the
    plan's) on ``bench`` (a :class:`~fp8lab.e2e.bench.Bench`); return the result record."""
    checks.choice("model", model, MODELS)
    checks.choice("setting", setting, SETTINGS)
    seed = checks.integer("seed", seed, minimum=0)
    plan, chosen = bench.plan(model), SETTINGS[setting]
    steps = plan.steps if steps is None else checks.integer("steps", steps, maximum=plan.steps)
    if chosen.gpu_only and not bench.on_gpu:
        raise ValueError(f"setting={setting!r}: needs a GPU with TE ({chosen.gpu_only})")
    begin = time.perf_counter()
    record = _header(bench, model, setting, seed, steps)
    try:
        record.update(train_setting(bench, model, chosen, seed, steps))
    except FirstStepFailed as failure:
        record["error"] = f"could not take a first step: {failure}"
    bench.release()
    record["wall_s"] = round(time.perf_counter() - begin, 1)
    record["stamp"] = bench._stamp(record)
    return record


def _interval(bench, model_name, built, scheduler, loader, span, fp8, log) -> float:
    """Train steps ``span[0]..span[1]`` without a host sync; return their seconds on the
    book's one clock."""
    _, optimizer, trained = built
    norm = bench.plan(model_name).max_grad_norm
    if bench.device.type == "cuda":
        torch.cuda.synchronize()
    clock = Clock(bench.device)
    for batch in loader.batches(span[1] - span[0], start=span[0]):
        log.add(stepping.step(trained, batch, optimizer, norm, fp8))
        scheduler.step()
    clock.mark()
    return clock.read()[0] / 1e3


def _train_and_validate(bench, model_name, setting, steps, built, fp8, loader) -> dict:
    """Train interval by interval, validating after each; stop at the first non-finite loss or
    error. ``first_failure`` is set when not even the first interval ran."""
    model, optimizer, trained = built
    plan = bench.plan(model_name)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, plan.lr_factor)
    validation = bench.validation_batches(model_name)
    log = stepping.LossLog(steps, bench.device)
    done = {"evaluated": [], "interval_ms": [], "error": None, "first_failure": None}
    if setting.calibrate:
        stepping.calibrate(trained, next(iter(loader.batches(1))), optimizer, fp8)
    start = 0
    for stop in plan.eval_points(steps):
        try:
            span = (start, stop)
            seconds = _interval(bench, model_name, built, scheduler, loader, span, fp8, log)
            chunk = log.read(start)
        except Exception as failure:
            key = "error" if start else "first_failure"
            done[key] = (f"step {start}..{stop}: " if start else "") + _one_line(failure)
            break
        value = evaluate(model, validation, **fp8)
        done["evaluated"].append((stop, value))
        done["interval_ms"].append((stop, round(seconds * 1e3 / (stop - start), 3)))
        bench.log(
            f"  {model_name} {setting.name}: step {stop}/{steps} train {chunk[-1]:.4f} "
            f"validation {value:.4f} ({seconds:.1f} s)"
        )
        start = stop
        if not (math.isfinite(value) and all(map(math.isfinite, chunk))):
            done["error"] = f"non-finite loss by step {stop}: stopped"
            break
    done["losses"] = log.read() if done["first_failure"] is None else []
    return done


def train_setting(bench, model_name, setting: Setting, seed, steps):
    """The measured part of a record: ``setting`` trained for ``steps``. Raises
    :class:`FirstStepFailed` where it cannot be built or take its first steps."""
    plan, cuda = bench.plan(model_name), bench.device.type == "cuda"
    fp8_recipe = bench._fp8_recipe(setting)
    try:
        model, optimizer, trained = bench._build(model_name, setting, fp8_recipe)
    except Exception as error:  # a setting this machine cannot build
        raise FirstStepFailed(_one_line(error)) from None
    loader = text.PackedLoader(
        bench.train_tokens, plan.batch, plan.seq, seed=seed, device=bench.device
    )
    fp8 = {"te": bench.te, "fp8_recipe": fp8_recipe} if fp8_recipe is not None else {}
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    done = _train_and_validate(
        bench, model_name, setting, steps, (model, optimizer, trained), fp8, loader
    )
    optimizer_name = f"{type(optimizer).__module__}.{type(optimizer).__name__}"
    del model, optimizer, trained  # free this run before the next is built
    if done["first_failure"] is not None:
        raise FirstStepFailed(done["first_failure"])
    losses = done["losses"]
    return {
        "what_ran": {
            "form": setting.form,
            "recipe": None if fp8_recipe is None else repr(fp8_recipe),
            "calibration_step": setting.calibrate,
            "compiled": setting.compile,
            "optimizer": optimizer_name,
            "host_syncs": "at evaluation points only",
        },
        "steps_run": len(losses),
        "train_loss": finite(losses),
        "validation": {
            "step": [s for s, _ in done["evaluated"]],
            "loss": finite(v for _, v in done["evaluated"]),
        },
        "interval_ms_per_step": {
            "step": [s for s, _ in done["interval_ms"]],
            "ms": [ms for _, ms in done["interval_ms"]],
        },
        "memory": {
            "peak_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
            "peak_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None,
        },
        "non_finite_losses": int(sum(not math.isfinite(v) for v in losses)),
        "error": done["error"],
    }


def describe_plan(bench) -> str:
    """Both models, their plans and FLOPs per step, the corpus, and the commands of the plan."""
    lines = []
    for model in MODELS:
        cfg, plan = bench.config(model), bench.plan(model)
        step = flops.training_flops(cfg, plan.batch, plan.seq, causal=True)
        lines.append(
            f"{model}: H={cfg.hidden_size} L={cfg.num_layers} V={cfg.vocab_size}, "
            f"{flops.parameter_count(cfg) / 1e6:.0f}M parameters; B={plan.batch} S={plan.seq}, "
            f"{plan.steps} steps ({bench.epochs(model):.2f} epochs), "
            f"{step / 1e12:.2f} TFLOP per step ({step / 600e12 * 1e3:.0f} ms at 600 TFLOP/s)"
        )
    lines.append(f"corpus: {json.dumps(bench.corpus.describe())}, split by {SPLIT_BY}")
    lines.append("commands:")
    lines += [f"  python -m tools.train_e2e --group {g} --out DIR" for g in GROUPS]
    lines.append("  python -m tools.e2e_speed --out FILE")
    return "\n".join(lines)


def _report(path, record: dict) -> str:
    validation = (record.get("validation") or {}).get("loss") or [None]
    intervals = (record.get("interval_ms_per_step") or {}).get("ms") or [0.0]
    return (
        f"{path.name}: {record['wall_s']:.0f} s, {intervals[-1]:.1f} ms/step (last interval), "
        f"validation {validation[-1]}, peak "
        f"{(record.get('memory') or {}).get('peak_allocated_bytes') or 0:,} B, "
        f"stamped: {record['stamp'] is not None}, error: {record['error']}"
    )


def run_all(bench, model: str, runs, out, steps=None, budget_s: float = 540.0, log=print) -> int:
    """Run ``runs`` (``(setting, seed)`` pairs) of ``model`` and write each record to ``out``;
    runs that would not finish inside ``budget_s`` are not started (their command is printed).
    Returns 0, 1 if a run recorded an error, 2 if the budget left runs out."""
    begin, longest, failures = time.perf_counter(), 0.0, 0
    for index, (setting, seed) in enumerate(runs):
        elapsed = time.perf_counter() - begin
        if index and elapsed + 1.2 * longest > budget_s:
            rest = ",".join(f"{s}:{n}" for s, n in runs[index:])
            log(
                f"time budget: {elapsed:.0f} s used; not started: {rest}\n"
                f"  run: python -m tools.train_e2e --model {model} --runs {rest} --out DIR"
            )
            return 2
        if SETTINGS[setting].gpu_only and not bench.on_gpu:
            log(f"{setting}: skipped here ({SETTINGS[setting].gpu_only})")
            continue
        started = time.perf_counter()
        record = run(bench, model, setting, seed, steps=steps)
        longest = max(longest, time.perf_counter() - started)
        path = write_record(record, out)
        failures += record["error"] is not None
        log(_report(path, record))
    return 1 if failures else 0
