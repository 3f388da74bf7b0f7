"""The estimator against committed measurements: the tables chapter 07 shows.

Measured peaks live in ``tests/gpu_results`` (written on a GPU by ``tools/memory_check``) and in
chapter 08's result file; this module reads them, re-predicts each configuration with
:func:`fp8lab.memory.estimate`, and returns errors as predicted over measured minus one:
per configuration, per measured phase (:func:`fp8lab.memory.phase_peaks`), for the allocator's
reserve beyond the allocated peak, and for chapter 08's parallel layouts. It also lists the
estimator's constants with their origin (:data:`fp8lab.memory.constants.ORIGIN`).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path

from fp8lab.config import TransformerConfig, preset_config
from fp8lab.memory import constants
from fp8lab.memory.estimator import estimate
from fp8lab.memory.fit import largest_micro_batch
from fp8lab.memory.layouts import Layout
from fp8lab.memory.phases import MEASURED_PHASES
from fp8lab.memory.sizes import step_sizes
from fp8lab.memory.spec import step_spec

__all__ = [
    "CONFIG_COLUMNS",
    "chapter08_options",
    "chapter08_rows",
    "constants_table",
    "fits_check",
    "heldout_errors",
    "layout_options",
    "layout_rows",
    "models_of",
    "phase_errors",
    "reserved_overhead",
    "results_dir",
    "summary",
]

# The columns that name a measured configuration in tools/memory_check's files
CONFIG_COLUMNS = ("model", "seq", "batch", "weights", "precision", "recompute", "accumulation")
# The measured phases of a two-step run, in order
PHASES = ("build", *(f"step {k} {p}" for k in (1, 2) for p in MEASURED_PHASES))


def results_dir(start: Path | None = None) -> Path:
    """``tests/gpu_results`` of the checkout holding ``start`` (the working directory by
    default); ``start`` itself if none is found above it."""
    here = Path.cwd().resolve() if start is None else Path(start).resolve()
    for folder in (here, *here.parents):
        if (folder / "tests" / "gpu_results").is_dir():
            return folder / "tests" / "gpu_results"
    return here


def _comment_above(lines: list[str], lineno: int) -> str:
    """The comment of the assignment at line ``lineno`` (1-based) of ``lines``: the block
    right above it, else its own trailing comment, else the block above a run of
    assignments it ends (constants that share one comment)."""
    index = lineno - 2
    trailing = lines[lineno - 1].partition("  # ")[2].strip()
    if trailing and not lines[index].lstrip().startswith("#"):
        return trailing
    while index >= 0 and lines[index].strip() and not lines[index].lstrip().startswith("#"):
        index -= 1  # an assignment sharing the comment above it
    found = []
    while index >= 0 and lines[index].lstrip().startswith("#"):
        found.insert(0, lines[index].lstrip("# ").rstrip())
        index -= 1
    return " ".join(found)


def constants_table(with_notes: bool = False):
    """Every number of :mod:`fp8lab.memory.constants` with its origin (source, measured or
    fitted), read from the module itself; ``with_notes`` adds each constant's comment."""
    import pandas as pd

    source = inspect.getsource(constants)
    lines = source.splitlines()
    rows = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.Assign) or not isinstance(node.targets[0], ast.Name):
            continue
        name = node.targets[0].id
        if name not in constants.ORIGIN:
            continue
        value = getattr(constants, name)
        in_mib = isinstance(value, int) and value > 2**16
        shown = f"{value / constants.MiB:g} MiB" if in_mib else value
        kind, _, where = constants.ORIGIN[name].partition(": ")
        row = {"constant": name, "value": str(shown), "origin": kind, "from": where}
        if with_notes:
            row["note"] = _comment_above(lines, node.lineno)
        rows.append(row)
    return pd.DataFrame(rows)


def models_of(frame) -> dict[str, TransformerConfig]:
    """The models of a measured file, by name, from its ``config`` column (JSON)."""
    return {
        name: TransformerConfig(**json.loads(text))
        for name, text in frame[["model", "config"]].drop_duplicates("model").values
    }


def heldout_errors(frame, models: dict[str, TransformerConfig] | None = None):
    """The rows of a measured file that ran, with the current estimator's ``predicted_MiB`` and
    ``error`` (predicted / measured - 1). A row's model is its ``config`` column (JSON of a
    :class:`~fp8lab.config.TransformerConfig`) or, without one, ``models[row.model]``."""
    ran = frame[frame["status"] == "ok"].copy()
    ran["predicted_MiB"] = [_estimate(row, models).peak_mib for _, row in ran.iterrows()]
    ran["error"] = ran["predicted_MiB"] / ran["measured_MiB"] - 1
    return ran


def _estimate(row, models=None):
    if "config" in row and isinstance(row["config"], str):
        cfg = TransformerConfig(**json.loads(row["config"]))
    else:
        cfg = (models or {})[row["model"]]
    return estimate(
        cfg,
        int(row["batch"]),
        int(row["seq"]),
        precision=row["precision"],
        weights=row["weights"],
        recompute=row["recompute"],
        accumulation=int(row["accumulation"]),
    )


def summary(errors):
    """Count, median and worst absolute error, and the most under-predicted (<= 0)."""
    import pandas as pd

    errors = errors.dropna()
    return pd.Series(
        {
            "configs": len(errors),
            "median |error|": errors.abs().median(),
            "worst |error|": errors.abs().max(),
            "most under-predicted": min(0.0, errors.min()) if len(errors) else float("nan"),
        }
    )


def phase_errors(predictions, measured):
    """Per-phase errors of predictions committed before the measurements: one row per
    configuration and measured phase (``predicted``, ``measured`` in MiB, ``error``), plus a
    ``peak`` row per configuration whose ``same_phase`` says if the predicted peak's phase is
    the measured one (model forward, loss and backward or optimizer step, either step)."""
    import pandas as pd

    keys = list(CONFIG_COLUMNS)
    ran = measured[measured["status"] == "ok"]
    both = predictions.merge(ran, on=keys, suffixes=("", " (run)"))
    rows = []
    for _, row in both.iterrows():
        label = {k: row[k] for k in keys}
        for phase in PHASES:
            predicted, got = row.get(f"predicted {phase}_MiB"), row.get(f"{phase}_MiB")
            rows.append({**label, "phase": phase, "predicted": predicted, "measured": got})
        rows.append(
            {
                **label,
                "phase": "peak",
                "predicted": row["predicted_MiB"],
                "measured": row["measured_MiB"],
                "predicted_phase": row["predicted_phase"],
                "measured_phase": row["measured_phase"],
                "same_phase": _kind(row["predicted_phase"]) == _kind(row["measured_phase"]),
            }
        )
    table = pd.DataFrame(rows)
    table["error"] = table["predicted"] / table["measured"] - 1
    return table


def _kind(phase: str) -> str:
    """A measured phase without its step: ``"step 2 optimizer step"`` -> ``"optimizer step"``
    (the two steps' optimizer peaks can tie, so which step holds the peak is noise)."""
    return phase.split(" ", 2)[-1] if phase.startswith("step ") else phase


def reserved_overhead(frame):
    """``torch.cuda.max_memory_reserved`` over ``max_memory_allocated`` minus one, for each
    configuration of a measured file that ran (both above what was there before the model)."""
    ran = frame[frame["status"] == "ok"]
    return ran["reserved_MiB"] / ran["measured_MiB"] - 1


# Chapter 08's model and how its worker trains it (notebooks/08_parallelism.ipynb): two layers
# of TE's tutorial shape, no embeddings or head, no dropout; its precisions by their names here.
CH08_MODEL = {"preset": "te-tutorial", "num_layers": 2}
CH08_PRECISIONS = {"bf16": "bf16", "fp8": "fp8-delayed", "fp8_weights": "fp8-weights"}
# Chapter 08's DDP variants (fp8lab/parallel/layouts.py of the commit that wrote its result
# file, DDP_VARIANTS and ddp_model): "tuned" passes bucket_cap_mb=200 and
# gradient_as_bucket_view=True, "default" DDP's defaults, "no_overlap" wraps nothing (a plain
# model whose gradients one synchronous all-reduce averages after the backward).
CH08_DDP_NAMES = {"tuned": "DDP", "default": "DDP (defaults)",
                  "no_overlap": "DP, all-reduce after backward"}


def _ch08_layout(kind: str, row: dict, as_run: bool = False) -> tuple[str, Layout, int] | None:
    """A chapter 08 row's layout name, estimator layout and micro-batch (a TP group shares
    ``tp`` times the per-GPU batch of DDP, as chapter 08 runs it); None for rows not compared
    (``as_run`` compares every DDP variant, else one GPU and the tuned DDP only)."""
    n, batch = int(row["n"]), int(row["batch"])
    if kind == "fsdp":
        return "FSDP2 (ZeRO-3)", Layout(dp=n, zero_stage=3), batch
    if kind == "tp":
        tp, sp = int(row["tp"]), row["layout"] == "TP+SP"
        return row["layout"], Layout(tp=tp, sequence_parallel=sp), batch * tp
    mode = row.get("mode")
    if kind != "ddp" or mode not in (*(CH08_DDP_NAMES if as_run else ["tuned"]), "single"):
        return None
    if n == 1:
        return "one GPU", Layout(), batch
    return CH08_DDP_NAMES[mode], Layout(dp=n) if mode != "no_overlap" else Layout(), batch


def chapter08_options(kind: str, row: dict) -> dict:
    """The estimator's options for a row of chapter 08's result file as its worker ran it
    (``fp8lab/parallel`` of the commit that wrote the file; ``kind`` is the task):

    * ``window="steady"``: ``measure.timed`` runs ``speedometer.time_callable``, whose
      ``_time_on_gpu`` resets the peak counter after the warm-up steps (5 in the plan) and
      reads it after the timed ones (20); the peak is taken above ``measure.memory_base``,
      read before the model is built;
    * ``comm_buffers=True``: the layouts' own buffers, with ``ddp_bucket_view`` where the DDP
      variant passes ``gradient_as_bucket_view=True`` (:data:`CH08_DDP_NAMES`);
    * ``stack_batch=True``: ``model.batch_data`` makes the input (BF16) and an FP32 target,
      which ``model.training_step``'s closure holds; under sequence parallelism
      ``tasks_speed._tp_step_time`` trains on ``x.chunk(tp, 0)[rank]``, a view of the group's
      whole batch (``whole_batch``).
    """
    sp = kind == "tp" and row.get("layout") == "TP+SP"
    return {
        "window": "steady",
        "comm_buffers": True,
        "ddp_bucket_view": kind == "ddp" and row.get("mode") == "tuned",
        "stack_batch": True,
        "whole_batch": sp,
    }


def chapter08_rows(path: Path, as_run: bool = False):
    """Chapter 08's measured peaks per GPU (one GPU, DDP, FSDP2, TP, TP+SP) beside the
    estimator's, as chapter 08 predicts them; an empty table if the file is absent.

    ``as_run=True`` predicts each row with the options its worker's code implies
    (:func:`chapter08_options`), compares every DDP variant, and adds what each row's baseline
    held that its run freed (``baseline_held_MiB``, :func:`_ch08_baseline_held`) with the
    error against the measured peak plus it (``error_held``)."""
    import pandas as pd

    path = Path(path)
    if not path.exists():
        return pd.DataFrame()
    results = json.loads(path.read_text())["results"]
    cfg = preset_config(CH08_MODEL["preset"]).replace(
        num_layers=CH08_MODEL["num_layers"], name="te-tutorial x 2"
    )
    rows = []
    for kind in ("ddp", "fsdp", "tp"):
        ran = [r for r in (results.get(kind) or {}).get("data", {}).get("rows", [])
               if r.get("peak_mib") is not None]
        held = _ch08_baseline_held(cfg, kind, ran) if as_run else [0.0] * len(ran)
        for row, row_held in zip(ran, held, strict=True):
            found = _ch08_layout(kind, row, as_run)
            if found is None:
                continue
            name, layout, batch = found
            options = chapter08_options(kind, row) if as_run else {}
            rows.append(
                {
                    "layout": name,
                    "GPUs": int(row["n"]),
                    "batch": int(row["batch"]),
                    "precision": row["precision"],
                    "measured_MiB": row["peak_mib"],
                    **({"baseline_held_MiB": row_held} if as_run else {}),
                    "predicted_MiB": _ch08_peak_mib(cfg, batch, row, layout, **options),
                }
            )
    table = pd.DataFrame(rows).drop_duplicates(["layout", "GPUs", "batch", "precision"])
    table = _with_error(table)
    if as_run:
        measured = table["measured_MiB"] + table["baseline_held_MiB"]
        table["error_held"] = table["predicted_MiB"] / measured - 1
    return table.reset_index(drop=True)


def _ch08_baseline_held(cfg: TransformerConfig, kind: str, rows: list[dict]) -> list[float]:
    """For each row of one task of chapter 08's file, in the order its worker ran them (the
    order of the rows), what its baseline held that its run freed (MiB): the gradient buckets
    of a DDP run just before it on the same process group.

    ``ProcessGroupNCCL`` stashes the tensors of an asynchronous collective and lets go of them
    at the next collective on the same group once its watchdog has seen it finish
    (``collective()``, ``Watchdog::runLoop``, ``workEnqueue``); ``WorkNCCL::wait()`` would
    unstash at once (``synchronizeStream``), but DDP's reducer waits on each bucket's future
    (``finalize_backward``). So the last step's buckets outlive a DDP sub-run. Between
    sub-runs the worker runs no collective on that group (``process.sub_run`` gathers the
    results over a gloo group; ``process.clean`` frees caches only), and the next sub-run
    reads its baseline (``measure.memory_base``) before it builds anything: a sub-run on the
    same ranks then frees those buckets at its first collective (DDP's broadcast of the
    parameters, or the first all-reduce), before its timed steps, and its peak above the
    baseline falls short by them. A one-GPU sub-run uses a group of its own rank and frees
    nothing. The ddp task follows the links task, whose collectives are synchronous (nothing
    stashed). The fsdp and tp tasks are counted as holding nothing: on two GPUs they build no
    DDP model (tp = 2 leaves dp = 1), TE waits its asynchronous collectives with
    ``Work.wait()``, and the rounds task before them ends each round with FSDP2 steps whose
    FP8 forwards reduce amaxes over the same group; their FSDP2 rows match to 0.1 MiB those
    of ``tests/gpu_results/memory_layouts_h200_2gpu.csv``. A file whose tp task wraps DDP
    (dp > 1) is beyond this count."""
    held = [0.0] * len(rows)
    if kind != "ddp":
        return held
    stashed: dict[int, float] = {}  # bucket MiB left stashed on the group of the first n ranks
    for index, row in enumerate(rows):
        n = int(row["n"])
        if n == 1:
            continue
        held[index] = stashed.pop(n, 0.0)
        if row.get("mode") in ("default", "tuned"):
            sizes = step_sizes(step_spec(cfg, int(row["batch"]), int(row["seq"]), {
                "precision": CH08_PRECISIONS[row["precision"]], "layout": Layout(dp=n),
                "hidden_dropout": 0.0, **chapter08_options(kind, row)}))
            stashed[n] = sizes.ddp_buckets / constants.MiB
    return held


def _ch08_peak_mib(
    cfg: TransformerConfig, batch: int, row, layout: Layout, **options
) -> float:
    """The estimator's peak (MiB) for a measured row of chapter 08's stack (no dropout);
    ``options`` are more options of :func:`~fp8lab.memory.estimate`."""
    return estimate(cfg, batch, int(row["seq"]), precision=CH08_PRECISIONS[row["precision"]],
                    layout=layout, hidden_dropout=0.0, **options).peak_mib


def _with_error(table):
    """``table`` with ``error``: predicted over measured, minus one."""
    table["error"] = table["predicted_MiB"] / table["measured_MiB"] - 1
    return table


# tools.layout_peaks: each layout's own peak per GPU on several GPUs, its estimator layout and
# the micro-batch the estimator takes (a TP group shares tp times the per-GPU batch of DDP).
def _layout_of(name: str, gpus: int, batch: int) -> tuple[Layout, int]:
    if name == "DDP":
        return Layout(dp=gpus), batch
    if name == "FSDP2":
        return Layout(dp=gpus, zero_stage=3), batch
    if name == "TP+SP":
        return Layout(tp=gpus, sequence_parallel=True), gpus * batch
    if name == "TP2 x DP2 (SP)":
        return Layout(tp=2, sequence_parallel=True, dp=gpus // 2), 2 * batch
    raise ValueError(f"layout={name!r}: not one tools.layout_peaks measures")


def layout_options(name: str) -> dict:
    """The estimator's options for a layout as ``tools/layout_peaks_worker.py`` builds it: the
    layouts' buffers, the batch and FP32 target each rank makes for its own share
    (``stack_batch``), DDP's ``gradient_as_bucket_view`` where the worker sets it (its DDP
    layout; TP2 x DP2 wraps the tensor-parallel stack in DDP with DDP's defaults), and the
    first steps as the window (``peak_above`` resets the peak counter before the build and
    keeps the largest of steps 1 to 3)."""
    _layout_of(name, 4, 1)  # refuses a layout the job does not measure
    return {"comm_buffers": True, "stack_batch": True, "ddp_bucket_view": name == "DDP",
            "window": "first-steps"}


def layout_rows(path: Path):
    """The measured peaks of a ``tools.layout_peaks`` file beside the estimator's, with the
    error (predicted over measured, minus one); an empty table if the file is absent.

    Files that record each step's peak (``step1_MiB``, ``step2_MiB``, ...) also give the
    first step's and the last step's peak, and the error against the last: a peak the
    largest only once (a one-time allocation) then shows as a gap between the two errors."""
    import pandas as pd

    path = Path(path)
    if not path.exists():
        return pd.DataFrame()
    measured = pd.read_csv(path)
    steps = sorted((c for c in measured.columns if re.fullmatch(r"step\d+_MiB", c)),
                   key=lambda c: int(c[4:-4]))
    rows = []
    for row in measured.to_dict("records"):
        cfg = preset_config(CH08_MODEL["preset"]).replace(
            num_layers=int(row["layers"]), name=f"te-tutorial x {int(row['layers'])}"
        )
        layout, batch = _layout_of(row["layout"], int(row["gpus"]), int(row["batch"]))
        rows.append(
            {
                "layout": row["layout"],
                "GPUs": int(row["gpus"]),
                "precision": row["precision"],
                "measured_MiB": row["peak_MiB"],
                "predicted_MiB": _ch08_peak_mib(
                    cfg, batch, row, layout, **layout_options(row["layout"])
                ),
                **({"step1_MiB": row[steps[0]], "last_step_MiB": row[steps[-1]]}
                   if len(steps) > 1 else {}),
            }
        )
    table = _with_error(pd.DataFrame(rows))
    if "last_step_MiB" in table:
        table["error_last_step"] = table["predicted_MiB"] / table["last_step_MiB"] - 1
    return table


def fits_check(frame, models: dict[str, TransformerConfig], gpu: str = "H200"):
    """The "fits?" runs (largest micro-batch that ran, of those tried) beside the calculator's
    answer for ``gpu`` under its own policy (:func:`fp8lab.memory.fits`: 90% of the memory,
    the CUDA context included): ``safe`` when the calculator's batch ran."""
    table = frame.copy()
    table["calculator"] = [
        largest_micro_batch(
            models[row["model"]],
            int(row["seq"]),
            gpu,
            weights=row["weights"],
            precision=row["precision"],
            recompute=row["recompute"],
        )
        for _, row in table.iterrows()
    ]
    table["safe"] = table["calculator"] <= table["actual_batch"]
    return table
