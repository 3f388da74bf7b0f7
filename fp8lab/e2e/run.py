"""One long run of chapter 09: train one model in one setting and return its result record.

The training step is :func:`fp8lab.training.train` (its :func:`~fp8lab.training.train_step`
with gradient clipping), called once per evaluation interval, with ``on_step`` advancing the
learning-rate schedule and taking the step's wall time. Each record holds the training loss of
every step, the validation loss every ``eval_every`` steps, the wall time of every step,
tokens/s and MFU of the whole step (data loading, forward, backward and optimizer; validation
excluded), peak memory, what exactly ran (recipe, attention and weight precision, optimizer,
compilation) and the corpus and tokenizer it ran on.

The fastest TE form tries its variants in order (:data:`~fp8lab.e2e.settings.FASTEST_VARIANTS`):
one that cannot take its first step here gives way to the next, and the record says why.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict

import numpy as np
import torch

from fp8lab import checks, flops, training
from fp8lab import corpus as text
from fp8lab.e2e.evaluation import evaluate
from fp8lab.e2e.results import finite, throughput, write_record
from fp8lab.e2e.settings import FASTEST_VARIANTS, GROUPS, MODELS, SCHEMA, SETTINGS, Setting


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
        "corpus": bench.corpus.describe(),
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
    variants = (
        FASTEST_VARIANTS
        if setting == "te-fastest"
        else ((chosen.fp8_attention, chosen.fp8_weights),)
    )
    for fp8_attention, fp8_weights in variants:
        try:
            record.update(
                train_setting(bench, model, chosen, seed, steps, fp8_attention, fp8_weights)
            )
            break
        except FirstStepFailed as failure:
            record["notes"].append(
                f"FP8 attention={fp8_attention}, FP8 weights={fp8_weights}: {failure}"
            )
            bench.release()
    else:
        record["error"] = "could not take a first step: " + " | ".join(record["notes"])
    bench.release()
    record["wall_s"] = round(time.perf_counter() - begin, 1)
    record["stamp"] = bench._stamp(record)
    return record


def _train_and_validate(bench, model_name, setting, steps, built, fp8, loader) -> dict:
    """Train in chunks of ``eval_every`` steps, validating after each; stop at the first
    non-finite loss or error. ``first_failure`` is set when not even the first step ran."""
    model, optimizer, trained = built
    plan = bench.plan(model_name)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, plan.lr_factor)
    validation = bench.validation_batches(model_name)
    options = training.StepOptions(max_grad_norm=plan.max_grad_norm)
    seconds: list[float] = []
    clock = [0.0]

    def on_step(_model, _step):
        seconds.append(time.perf_counter() - clock[0])
        scheduler.step()
        clock[0] = time.perf_counter()

    if bench.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    done = {"losses": [], "evaluated": [], "seconds": seconds, "error": None, "first_failure": None}
    losses, evaluated = done["losses"], done["evaluated"]
    for stop in plan.eval_points(steps):
        start = len(losses)
        try:
            clock[0] = time.perf_counter()
            batches = loader.batches(stop - start, start=start)
            chunk = training.train(
                trained, batches, optimizer, on_step=on_step, options=options, **fp8
            )
        except Exception as failure:
            key = "error" if losses else "first_failure"
            done[key] = (f"step {start}..{stop}: " if losses else "") + _one_line(failure)
            break
        losses.extend(chunk.tolist())
        value = evaluate(model, validation, **fp8)
        evaluated.append((stop, value))
        bench.log(
            f"  {model_name} {setting.name}: step {stop}/{steps} train {chunk[-1]:.4f} "
            f"validation {value:.4f} ({sum(seconds):.0f} s training)"
        )
        if not (math.isfinite(value) and np.isfinite(chunk).all()):
            done["error"] = f"non-finite loss by step {stop}: stopped"
            break
    return done


def train_setting(bench, model_name, setting: Setting, seed, steps, fp8_attention, fp8_weights):
    """The measured part of a record: one variant of ``setting`` trained for ``steps``. Raises
    :class:`FirstStepFailed` where the variant cannot be built or take its first step."""
    plan, cfg, cuda = bench.plan(model_name), bench.config(model_name), bench.device.type == "cuda"
    fp8_recipe = bench._fp8_recipe(setting, fp8_attention)
    try:
        model, optimizer, trained = bench._build(model_name, setting, fp8_recipe, fp8_weights)
    except Exception as error:  # a setting this machine cannot build
        raise FirstStepFailed(_one_line(error)) from None
    loader = text.PackedLoader(
        bench.train_tokens, plan.batch, plan.seq, seed=seed, device=bench.device
    )
    fp8 = {"te": bench.te, "fp8_recipe": fp8_recipe} if fp8_recipe is not None else {}
    built = (model, optimizer, trained)
    done = _train_and_validate(bench, model_name, setting, steps, built, fp8, loader)
    optimizer_name = f"{type(optimizer).__module__}.{type(optimizer).__name__}"
    del model, optimizer, trained, built  # free this run before the next is built
    if done["first_failure"] is not None:
        raise FirstStepFailed(done["first_failure"])
    peak_allocated = torch.cuda.max_memory_allocated() if cuda else None
    losses, seconds = done["losses"], done["seconds"]
    return {
        "what_ran": {
            "form": setting.form,
            "recipe": None if fp8_recipe is None else repr(fp8_recipe),
            "fp8_attention": fp8_attention,
            "fp8_weights": fp8_weights,
            "torchao": setting.torchao,
            "compiled": setting.compile,
            "optimizer": optimizer_name,
            "optimizer_master_weights": fp8_weights,
        },
        "steps_run": len(losses),
        "train_loss": finite(losses),
        "validation": {
            "step": [s for s, _ in done["evaluated"]],
            "loss": finite(v for _, v in done["evaluated"]),
        },
        "step_ms": [round(s * 1e3, 3) for s in seconds],
        "throughput": throughput(cfg, plan, setting, seconds, peak_allocated, bench.device),
        "memory": {
            "peak_allocated_bytes": peak_allocated,
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
    lines.append(f"corpus: {json.dumps(bench.corpus.describe())}")
    lines.append("commands:")
    lines += [
        f"  python -m tools.train_e2e --model {m} --group {g} --out DIR"
        for m in MODELS
        for g in GROUPS
    ]
    return "\n".join(lines)


def _report(path, record: dict) -> str:
    rate = record.get("throughput") or {}
    validation = (record.get("validation") or {}).get("loss") or [None]
    return (
        f"{path.name}: {record['wall_s']:.0f} s, "
        f"{(rate.get('tokens_per_s') or 0):,.0f} tokens/s, MFU {(rate.get('mfu') or 0):.1%}, "
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
