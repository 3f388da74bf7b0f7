"""Chapter 09's speed rounds: the trained model and a larger shape, timed by the protocol.

:func:`measure` builds the settings of one model side by side on one GPU from the chapter's
worker cells, and times whole training steps (batch, forward, loss, backward, clipping,
optimizer: the chapter's ``train_step``) with :func:`fp8lab.protocol.rounds`, the order reversed
every other round. The trained model (``llama``) is timed with its step captured as CUDA
graphs (the worker's ``capture``), so that the host does not set its time; a capture that fails
is recorded with its reason and the setting is timed without graphs, marked so. The larger
shape (``large``, five layers of Llama 3 8B at S = 8192) is timed for speed only; its step is
long enough for the GPU to set the time. Both time their settings in pairs, to fit one 80 GB
GPU (a captured graph keeps its activations in its own memory pool).

The PyTorch settings (the same Llama in plain PyTorch; torchao's float8 on it) are compiled
with ``torch.compile``, as torchao intends: with ``mode="reduce-overhead"`` (CUDA graphs)
where TE's side is captured, the default mode where it is not. Each group holds its family's
BF16, the baseline its ratio is taken against (:func:`comparison`): TE BF16 for TE's recipes,
PyTorch BF16 for torchao's; one group sets PyTorch BF16 against TE BF16, the question of
which BF16 baseline is the strong one. The file is stamped like the long runs.

On a GPU each group with a PyTorch setting runs in a process of its own
(:func:`time_group_in_child`): the first try of the compiled group on this stack ended the
whole process with a segmentation fault, after the TE groups and before any PyTorch step was
timed. A group whose process dies that way is timed again, every side without CUDA graphs
(``torch.compile``'s default mode, TE uncaptured), and the record says why.

The chapter reads :data:`RESULTS_FILE`: the committed measurement, or the file that
``FP8LAB_E2E_SPEED_FILE`` names, so that a verdict re-run in another session can measure
again into a file of its own and re-run the chapter on it, leaving the committed file as the
page's outputs show it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from fp8lab import checks, flops, protocol
from fp8lab.e2e.results import ROOT, result_modules
from fp8lab.e2e.run import one_line
from fp8lab.e2e.settings import MODELS, SETTINGS

COMMITTED_FILE = ROOT / "tests" / "gpu_results" / "e2e_speed.json"
RESULTS_ENV = "FP8LAB_E2E_SPEED_FILE"
RESULTS_FILE = Path(os.environ.get(RESULTS_ENV) or COMMITTED_FILE)  # what the chapter reads
ANCHOR = "bf16"
TORCH_GROUPS = (("bf16", "torch-bf16"), ("torch-bf16", "torchao-tensorwise"),
                ("torch-bf16", "torchao-rowwise"))
GROUPS = {
    "llama": (("bf16", "delayed"), ("bf16", "current"), ("bf16", "block"), *TORCH_GROUPS),
    "large": (("bf16", "current"), ("bf16", "delayed"), ("bf16", "block"), *TORCH_GROUPS),
}
BASELINES = {"te": "bf16", "torch": "torch-bf16"}  # each family's BF16
GRAPHED = {"llama": True, "large": False}
ROUNDS = {"llama": (7, 10), "large": (5, 5)}  # (rounds, steps per round)
SCHEMA = 3


def end_te_capture() -> None:
    """Clear TE's "capturing" flag. ``te.make_graphed_callables`` sets it when it starts and
    clears it only when it finishes; after a capture that raised it stays set, and TE then
    skips every backward scale update of delayed scaling (TE 2.20: ``graph.py``)."""
    graph = sys.modules.get("transformer_engine.pytorch.graph")
    end = getattr(graph, "set_capture_end", None)
    if end is not None:
        end()


@contextlib.contextmanager
def class_call_kept(cls: type):
    """Put ``cls.__call__`` back as it was on leaving, and TE's capturing flag down:
    ``te.make_graphed_callables`` wraps the class's ``__call__`` while it captures and undoes
    neither when the capture fails."""
    if not isinstance(cls, type):
        raise TypeError(f"cls={checks.show(cls)}: must be a class")
    own = "__call__" in cls.__dict__
    saved = cls.__dict__.get("__call__")
    try:
        yield
    finally:
        if own:
            cls.__call__ = saved
        elif "__call__" in cls.__dict__:
            del cls.__call__
        end_te_capture()


def build_step(bench, model: str, name: str, graphs: bool):
    """``(step, what ran)``: setting ``name`` of ``model`` from the worker cells, captured as
    CUDA graphs where ``graphs`` asks and this stack allows."""
    plan, code = bench.plan(model), bench.worker
    built, optimizer, fp8_recipe = bench.build(model, name)
    batches = iter(bench.loader(model))
    what = {"graphs": None, "refused": None}
    if SETTINGS[name].family == "torch":
        if bench.on_gpu:  # compiled as torchao intends; CUDA graphs where TE's side has them
            mode = "reduce-overhead" if graphs else "default"
            built = torch.compile(built, mode=mode)
            what["compiled"] = f"torch.compile(mode={mode!r})"
            what["graphs"] = what["compiled"] if graphs else None
    elif graphs and bench.on_gpu:
        with class_call_kept(type(built)):
            try:
                built = code.capture(built, next(batches), bench.te, fp8_recipe)
                what["graphs"] = "te.make_graphed_callables"
            except Exception as error:  # a capture this stack refuses: timed without graphs
                what["refused"] = one_line(error)

    def step():
        return code.train_step(built, next(batches), optimizer, bench.te, fp8_recipe,
                               plan.max_grad_norm)

    return step, what


def _first_steps(bench, model: str, name: str, graphs: bool, warmup: int):
    """Build ``name`` and take its warm-up steps; a graphed form that fails on them is
    recorded and replaced by the form without graphs."""
    step, what = build_step(bench, model, name, graphs)
    try:
        for _ in range(max(1, warmup)):
            step()
        return step, what
    except Exception as error:
        if not what["graphs"]:
            raise
        refused = f"{what['graphs']}: {one_line(error)}"
    del step
    bench.release()
    step, what = build_step(bench, model, name, graphs=False)
    for _ in range(max(1, warmup)):
        step()
    return step, {**what, "refused": refused}


def time_group(bench, model: str, settings, rounds: int, steps: int, warmup: int,
               graphs: bool | None = None) -> dict:
    """Build ``settings`` of ``model`` side by side, warm each up, then time them in rounds;
    ``{"settings", "ms_per_step", "host_ms_per_step", "what_ran"}`` per round and setting.
    ``graphs`` (default: :data:`GRAPHED` of ``model``) asks for CUDA graphs."""
    graphs = GRAPHED[model] if graphs is None else graphs
    step_of, what_ran = {}, {}
    for name in settings:
        step_of[name], what_ran[name] = _first_steps(bench, model, name, graphs, warmup)
    if len({bool(w["graphs"]) for w in what_ran.values()}) > 1:  # one side refused graphs:
        refused = {n: w["refused"] for n, w in what_ran.items()}  # time every side without
        del step_of
        bench.release()
        step_of = {}
        for name in settings:
            step_of[name], what_ran[name] = _first_steps(bench, model, name, False, warmup)
            what_ran[name]["refused"] = refused[name] or "graphs off: another side refused"
    timed = protocol.rounds(step_of, rounds=rounds, calls=steps, warmup=0, kernel_time=None,
                            device=bench.device)
    del step_of
    bench.release()
    return {
        "settings": list(settings),
        "ms_per_step": {n: [round(v, 3) for v in timed.round_ms(n)] for n in settings},
        "host_ms_per_step": {n: [round(v, 3) for v in timed.host[n]] for n in settings},
        "what_ran": what_ran,
    }


CHILD_TIMEOUT_S = 600.0


def run_child(job: dict) -> tuple[int | None, dict | None]:
    """Run :func:`child_main` on ``job`` in a fresh Python process: ``(exit status, its
    group's record or None)``; a negative status is the signal that ended it, None a process
    stopped at :data:`CHILD_TIMEOUT_S`."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "group.json"
        job = {**job, "out": str(out)}
        code = "from fp8lab.e2e import speed; speed.child_main()"
        try:
            done = subprocess.run([sys.executable, "-c", code, json.dumps(job)],
                                  timeout=CHILD_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return None, None
        found = json.loads(out.read_text()) if done.returncode == 0 and out.exists() else None
        return done.returncode, found


def child_main(argv: list[str] | None = None) -> None:
    """The child's side of :func:`run_child`: one group timed, its record written."""
    from tokenizers import Tokenizer

    from fp8lab.e2e.bench import Bench

    job = json.loads((sys.argv[1:] if argv is None else argv)[0])
    bench = Bench(job["preset"], device=job.get("device"), log=None,
                  tokenizer=Tokenizer.from_file(job["tokenizer"]))
    try:
        timed = time_group(bench, job["model"], tuple(job["group"]), job["rounds"],
                           job["steps"], job["warmup"], graphs=job["graphs"])
    except Exception as error:  # an error the group can be recorded with, not a death
        timed = {"error": one_line(error)}
    Path(job["out"]).write_text(json.dumps(timed))


def _died(status: int | None) -> str:
    if status is None:
        return f"the process ran past {CHILD_TIMEOUT_S:g} s and was stopped"
    try:
        return f"the process died with {signal.Signals(-status).name}"
    except ValueError:
        return f"the process ended with exit status {status}"


def time_group_in_child(bench, model: str, settings, rounds: int, steps: int,
                        warmup: int) -> dict:
    """:func:`time_group` in a process of its own. If that process dies with CUDA graphs on,
    the group is timed again in a fresh one without them, every side, and each setting's
    ``refused`` says what happened; a second death, or an exception in the child, raises
    ``RuntimeError``."""
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = Path(folder) / "tokenizer.json"
        bench.tokenizer.save(str(tokenizer))
        job = {"preset": bench.preset, "device": str(bench.device), "model": model,
               "group": list(settings), "rounds": rounds, "steps": steps, "warmup": warmup,
               "tokenizer": str(tokenizer), "graphs": GRAPHED[model]}
        status, timed = run_child(job)
        if timed is not None and "error" in timed:
            raise RuntimeError(timed["error"])
        if timed is not None:
            return timed
        if not GRAPHED[model]:
            raise RuntimeError(f"{', '.join(settings)}: {_died(status)}")
        first = f"with CUDA graphs {_died(status)}; timed without them"
        status, timed = run_child({**job, "graphs": False})
        if timed is not None and "error" in timed:
            raise RuntimeError(f"{first}: {timed['error']}")
        if timed is None:
            raise RuntimeError(f"{', '.join(settings)}: {first}, and then {_died(status)}")
    for ran in timed["what_ran"].values():
        ran["refused"] = first
    return timed


def chosen_groups(model: str, only=None) -> list[int]:
    """The indices into ``GROUPS[model]`` that ``only`` names (every group when None), in
    order; ``ValueError`` for an index the model does not have."""
    checks.choice("model", model, MODELS)
    if only is None:
        return list(range(len(GROUPS[model])))
    chosen = sorted({checks.integer("only", i, minimum=0) for i in only})
    if not chosen or chosen[-1] >= len(GROUPS[model]):
        raise ValueError(f"only={sorted(only)}: {model} has groups 0 to "
                         f"{len(GROUPS[model]) - 1}")
    return chosen


def measure(bench, models=MODELS, rounds=None, steps=None, warmup: int = 5, log=print,
            isolate: bool | None = None, only=None) -> dict:
    """Every group of every model in ``models`` (rounds and steps per round: :data:`ROUNDS`
    unless given), or only the groups ``only`` names (indices into :data:`GROUPS`, for a
    measurement split over GPUs and joined by :func:`merge`); a group that cannot run here is
    recorded with its error. With ``isolate`` (default: on a GPU) each group holding a PyTorch
    setting runs in its own process (:func:`time_group_in_child`)."""
    isolate = bench.on_gpu if isolate is None else isolate
    rounds = None if rounds is None else checks.integer("rounds", rounds, minimum=2)
    steps = None if steps is None else checks.integer("steps", steps)
    warmup = checks.integer("warmup", warmup, minimum=0)
    record = {"schema": SCHEMA, "preset": bench.preset, "warmup": warmup, "models": {}}
    for model in models:
        checks.choice("model", model, MODELS)
        indices = chosen_groups(model, only)
        plan, cfg = bench.plan(model), bench.config(model)
        model_rounds, model_steps = rounds or ROUNDS[model][0], steps or ROUNDS[model][1]
        groups = []
        for group in (GROUPS[model][i] for i in indices):
            begin = time.perf_counter()
            timer = time_group_in_child if isolate and any(
                SETTINGS[name].family == "torch" for name in group) else time_group
            try:
                timed = timer(bench, model, group, model_rounds, model_steps, warmup)
            except Exception as error:  # on record, not fatal
                timed = {"settings": list(group), "ms_per_step": {}, "host_ms_per_step": {},
                         "what_ran": {}, "error": one_line(error)}
                bench.release()
            groups.append(timed)
            log(f"{model} {', '.join(group)}: {time.perf_counter() - begin:.0f} s")
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


def baseline_of(setting: str) -> str:
    """The BF16 setting of ``setting``'s family, the one its speed is judged against."""
    checks.choice("setting", setting, SETTINGS)
    return BASELINES[SETTINGS[setting].family]


def comparison(record: dict, model: str, setting: str, baseline: str = ANCHOR):
    """``setting`` against ``baseline`` (a :class:`fp8lab.protocol.Comparison`, above 1:
    ``setting`` is faster) from the first group of ``model`` that timed both, or None (also
    where ``model`` was not measured). torchao's settings are read against
    ``baseline_of(setting)``, PyTorch BF16."""
    for group in record.get("models", {}).get(model, {}).get("groups", []):
        times = group["ms_per_step"]
        if setting in times and baseline in times:
            per_round = {n: [[ms] for ms in times[n]] for n in (setting, baseline)}
            return protocol.Rounds.from_times(per_round, cuda=record.get("device") != "cpu"
                                              ).compare(setting, baseline)
    return None


def stamp(record: dict, seconds: float) -> dict | None:
    """The stamp of a full-preset measurement on a GPU with TE; None elsewhere."""
    from fp8lab import stamp as lane
    from fp8lab.e2e.worker import TORCH_CELLS, source_sha256

    if not (record["preset"] == "full" and torch.cuda.is_available()):
        return None
    return lane.stamp_record(result_modules("tools.e2e_speed"), run_seconds=round(seconds, 1),
                             worker_sha256=source_sha256(tags=TORCH_CELLS))  # both kinds


def measure_and_write(bench, models, out, rounds=None, steps=None, log=print,
                      only=None) -> dict:
    """:func:`measure`, written to ``out`` (JSON) after each model, stamped once all are. A
    part (``only`` given) is not stamped: :func:`merge` stamps the whole."""
    begin, record = time.perf_counter(), None
    out.parent.mkdir(parents=True, exist_ok=True)
    for model in models:  # written after each model: a run cut short keeps what it measured
        part = measure(bench, (model,), rounds=rounds, steps=steps, log=log, only=only)
        if only is not None:
            part["models"][model]["group_indices"] = chosen_groups(model, only)
        record = part if record is None else {**record,
                                              "models": {**record["models"], **part["models"]}}
        record["corpus"] = bench.corpus.describe()
        record["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        record["seconds"] = round(time.perf_counter() - begin, 1)
        whole = only is None and model == models[-1]
        record["stamp"] = stamp(record, time.perf_counter() - begin) if whole else None
        out.write_text(json.dumps(record, indent=1) + "\n")
    return record


def merge(parts: list[dict]) -> dict:
    """One record from parts measured side by side (each ``measure_and_write(..., only=...)``,
    one GPU each): every group of :data:`GROUPS` exactly once, in its order, from parts of one
    preset, corpus and GPU kind. The record lists its parts (models, groups, seconds), and
    is stamped by the caller with the longest part's time (:func:`stamp`). ``ValueError`` for
    a group missing or measured twice, or parts that do not match."""
    if not parts:
        raise ValueError("parts=[]: nothing to merge")
    first = parts[0]
    for key in ("schema", "preset", "warmup", "corpus", "device"):
        values = {json.dumps(part.get(key), sort_keys=True) for part in parts}
        if len(values) > 1:
            raise ValueError(f"parts: their {key} differs ({', '.join(sorted(values))})")
    record = {k: first[k] for k in ("schema", "preset", "warmup")} | {"models": {}}
    for model in MODELS:
        found: dict[int, dict] = {}
        entry = None
        for part in parts:
            mine = part["models"].get(model)
            if mine is None:
                continue
            indices = mine.get("group_indices", list(range(len(GROUPS[model]))))
            for index, group in zip(indices, mine["groups"], strict=True):
                if index in found:
                    raise ValueError(f"parts: {model} group {index} measured twice")
                found[index] = group
            entry = entry or {k: v for k, v in mine.items() if k not in ("groups",
                                                                          "group_indices")}
        if entry is None:
            continue
        missing = [i for i in range(len(GROUPS[model])) if i not in found]
        if missing:
            raise ValueError(f"parts: {model} lacks group(s) {missing}")
        record["models"][model] = {**entry, "groups": [found[i] for i in sorted(found)]}
    record["corpus"], record["device"] = first["corpus"], first["device"]
    record["parts"] = [{"models": {m: v.get("group_indices") for m, v in p["models"].items()},
                        "seconds": p.get("seconds") or (p.get("stamp") or {}).get("run_seconds")}
                       for p in parts]
    return record


def summary(record: dict, models) -> list[str]:
    """One line per measured setting: its verdict against its family's BF16 (PyTorch BF16's
    against TE BF16)."""
    lines = []
    for model in models:
        for name in SETTINGS:
            base = ANCHOR if name == "torch-bf16" else baseline_of(name)
            found = comparison(record, model, name, base) if name != base else None
            if found is not None:
                lines.append(f"{model} {name} vs {base}: {found.phrase()}")
    return lines
