"""One long run of chapter 09: train one model in one setting and return its result record.

The step is the chapter's own (``train_step`` of its worker cells, :mod:`fp8lab.e2e.worker`):
its loss stays on the device (:class:`LossLog`) and the host never waits for the GPU inside an
evaluation interval; the learning-rate schedule advances on the host. After each interval the
run reads the losses back and measures the validation loss. A record holds the training loss of
every step, the validation loss at every evaluation point, the milliseconds per step of each
interval (a speed verdict comes from :mod:`fp8lab.e2e.speed`, not from these), peak memory and
what exactly ran.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict

import torch

from fp8lab import checks, flops
from fp8lab import corpus as text
from fp8lab.e2e import worker
from fp8lab.e2e.evaluation import evaluate
from fp8lab.e2e.results import finite, write_record
from fp8lab.e2e.settings import (
    COMMAND_SEEDS,
    GROUPS,
    MODELS,
    SCHEMA,
    SETTINGS,
    SPLIT_BY,
)
from fp8lab.speedometer import Clock


class FirstStepFailed(RuntimeError):
    """A setting could not take its first training step here."""


class LossLog:
    """The loss of every step, written on the device; :meth:`read` waits for it."""

    def __init__(self, steps: int, device: torch.device):
        self.values = torch.full((steps,), float("nan"), device=device)
        self.count = 0

    def add(self, loss: torch.Tensor) -> None:
        self.values[self.count].copy_(loss.detach(), non_blocking=True)
        self.count += 1

    def read(self, start: int = 0) -> list[float]:
        """The losses from step ``start`` on (one host sync)."""
        return self.values[start : self.count].float().cpu().tolist()


def one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".splitlines()[0][:300]


def _header(bench, model: str, setting: str, seed: int, steps: int) -> dict:
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
        "worker_sha256": worker_sha256(setting),
        "device": torch.cuda.get_device_name() if bench.device.type == "cuda" else "cpu",
        "error": None,
    }


def worker_sha256(setting: str) -> str:
    """The hash of the worker cells a run of ``setting`` executes: TE's settings the ``worker``
    cells, the PyTorch settings those and the ``worker-torch`` cells."""
    checks.choice("setting", setting, SETTINGS)
    torch_family = SETTINGS[setting].family == "torch"
    return worker.source_sha256(tags=worker.TORCH_CELLS if torch_family else worker.TE_CELLS)


def run(bench, model: str, setting: str, seed: int = 0, steps: int | None = None) -> dict:
    """Train ``model`` in ``setting`` with data order ``seed`` for ``steps`` (default: the
    plan's) on ``bench`` (a :class:`~fp8lab.e2e.bench.Bench`); return the result record."""
    checks.choice("model", model, MODELS)
    checks.choice("setting", setting, SETTINGS)
    seed = checks.integer("seed", seed, minimum=0)
    plan = bench.plan(model)
    steps = plan.steps if steps is None else checks.integer("steps", steps, maximum=plan.steps)
    begin = time.perf_counter()
    record = _header(bench, model, setting, seed, steps)
    try:
        record.update(_train(bench, model, setting, seed, steps))
    except FirstStepFailed as failure:
        record["error"] = f"could not take a first step: {failure}"
    bench.release()
    record["wall_s"] = round(time.perf_counter() - begin, 1)
    record["stamp"] = bench._stamp(record)
    return record


def _interval(bench, built, scheduler, batches, norm, log) -> float:
    """Train on ``batches`` without a host sync; their seconds on the book's one clock."""
    model, optimizer, fp8_recipe = built
    if bench.device.type == "cuda":
        torch.cuda.synchronize()
    clock = Clock(bench.device)
    for batch in batches:
        log.add(bench.worker.train_step(model, batch, optimizer, bench.te, fp8_recipe, norm))
        scheduler.step()
    clock.mark()
    return clock.read()[0] / 1e3


def _train(bench, model_name: str, setting: str, seed: int, steps: int) -> dict:
    plan, cuda = bench.plan(model_name), bench.device.type == "cuda"
    try:
        built = bench.build(model_name, setting)
    except Exception as error:  # a setting this machine cannot build
        raise FirstStepFailed(one_line(error)) from None
    model, optimizer, fp8_recipe = built
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    loader, validation = bench.loader(model_name, seed), bench.validation_batches(model_name)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, plan.lr_factor)
    log = LossLog(steps, bench.device)
    evaluated, interval_ms, error, start = [], [], None, 0
    for stop in plan.eval_points(steps):
        try:
            seconds = _interval(bench, built, scheduler, loader.batches(stop - start, start),
                                plan.max_grad_norm, log)
            chunk = log.read(start)
        except Exception as failure:
            if not start:
                raise FirstStepFailed(one_line(failure)) from None
            error = f"step {start}..{stop}: {one_line(failure)}"
            break
        value = evaluate(model, validation, bench.te, fp8_recipe)
        evaluated.append((stop, value))
        interval_ms.append((stop, round(seconds * 1e3 / (stop - start), 3)))
        bench.log(f"  {model_name} {setting}: step {stop}/{steps} train {chunk[-1]:.4f} "
                  f"validation {value:.4f} ({seconds:.1f} s)")
        start = stop
        if not (math.isfinite(value) and all(map(math.isfinite, chunk))):
            error = f"non-finite loss by step {stop}: stopped"
            break
    losses = log.read()
    return {
        "what_ran": {"recipe": None if fp8_recipe is None else repr(fp8_recipe),
                     "optimizer": f"{type(optimizer).__module__}.{type(optimizer).__name__}",
                     "host_syncs": "at evaluation points only"},
        "steps_run": len(losses),
        "train_loss": finite(losses),
        "validation": {"step": [s for s, _ in evaluated],
                       "loss": finite(v for _, v in evaluated)},
        "interval_ms_per_step": {"step": [s for s, _ in interval_ms],
                                 "ms": [ms for _, ms in interval_ms]},
        "memory": {"peak_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None},
        "non_finite_losses": int(sum(not math.isfinite(v) for v in losses)),
        "error": error,
    }


def commands() -> list[str]:
    """The commands that make every result file of the plan, one GPU command each."""
    return [
        f"python -m tools.train_e2e --group {group} --seeds "
        f"{','.join(map(str, seeds))} --out DIR"
        for group in GROUPS
        for seeds in COMMAND_SEEDS
    ]


def describe_plan(bench) -> str:
    """Both models, their plans and FLOPs per step, the corpus, and the commands."""
    lines = []
    for model in MODELS:
        cfg, plan = bench.config(model), bench.plan(model)
        step = flops.training_flops(cfg, plan.batch, plan.seq, causal=True)
        lines.append(
            f"{model}: H={cfg.hidden_size} L={cfg.num_layers} V={cfg.vocab_size}, "
            f"{flops.parameter_count(cfg) / 1e6:.0f}M parameters; B={plan.batch} S={plan.seq}, "
            f"{plan.steps} steps ({bench.epochs(model):.2f} epochs), "
            f"{step / 1e12:.2f} TFLOP per step ({step / 400e12 * 1e3:.0f} ms at 400 TFLOP/s)"
        )
    lines.append(f"corpus: {json.dumps(bench.corpus.describe())}, split by {SPLIT_BY}")
    lines.append(f"settings: {', '.join(SETTINGS)}")
    lines += ["commands:", *(f"  {c}" for c in commands()),
              "  python -m tools.e2e_speed --out FILE"]
    return "\n".join(lines)


def _report(path, record: dict) -> str:
    validation = (record.get("validation") or {}).get("loss") or [None]
    intervals = (record.get("interval_ms_per_step") or {}).get("ms") or [0.0]
    return (f"{path.name}: {record['wall_s']:.0f} s, {intervals[-1]:.1f} ms/step (last "
            f"interval), validation {validation[-1]}, stamped: {record['stamp'] is not None}, "
            f"error: {record['error']}")


def run_all(bench, model: str, runs, out, steps=None, budget_s: float = 500.0, log=print) -> int:
    """Run ``runs`` (``(setting, seed)`` pairs) of ``model`` and write each record to ``out``;
    a run that would not finish inside ``budget_s`` is not started (its command is printed).
    Returns 0, 1 if a run recorded an error, 2 if the budget left runs out."""
    begin, longest, failures = time.perf_counter(), 0.0, 0
    for index, (setting, seed) in enumerate(runs):
        elapsed = time.perf_counter() - begin
        if index and elapsed + 1.2 * longest > budget_s:
            rest = ",".join(f"{s}:{n}" for s, n in runs[index:])
            log(f"time budget: {elapsed:.0f} s used; not started: {rest}\n"
                f"  run: python -m tools.train_e2e --runs {rest} --out DIR")
            return 2
        started = time.perf_counter()
        record = run(bench, model, setting, seed, steps=steps)
        longest = max(longest, time.perf_counter() - started)
        path = write_record(record, out)
        failures += record["error"] is not None
        log(_report(path, record))
    return 1 if failures else 0
