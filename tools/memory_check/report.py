"""Reading and recording the results: error summaries, the printed table, the CSV's stamp."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

# fp8lab modules the measurements run (the stamp hashes them; fp8lab.memory only predicts, and
# the CPU lane re-predicts from the measured columns, so it is left out)
MEASURED_WITH = ("fp8lab.models", "fp8lab.training", "fp8lab.environment")
# Columns of the printed table of a matrix
SHOWN = (
    "model",
    "seq",
    "batch",
    "weights",
    "precision",
    "recompute",
    "accumulation",
    "status",
    "predicted_MiB",
    "measured_MiB",
    "error_pct",
    "measured_phase",
)


def summarise(frame) -> dict:
    """Median and worst absolute error, and the worst under- and over-prediction."""
    error = frame["predicted_MiB"] / frame["measured_MiB"] - 1
    return {
        "configs": int(error.notna().sum()),
        "median_abs_error": float(error.abs().median()),
        "worst_abs_error": float(error.abs().max()),
        "worst_under_prediction": float(min(0.0, error.min())),
        "worst_over_prediction": float(max(0.0, error.max())),
    }


def by_layout(frame):
    """:func:`summarise` for each parameter layout."""
    import pandas as pd

    return pd.DataFrame(
        {weights: summarise(group) for weights, group in frame.groupby("weights")}
    ).T


def stamp(csv: Path, matrix: str, seconds: float, machine: dict | None = None) -> Path:
    """Write ``<csv>.stamp.json``: where and from which fp8lab code the measurements came
    (``machine``: :func:`fp8lab.stamp.where_it_runs` by default)."""
    from fp8lab import stamp as lane

    notebook = {
        "cells": [{"cell_type": "code", "source": "\n".join(f"import {m}" for m in MEASURED_WITH)}]
    }
    # fp8lab.memory is the estimator under test: the measured peaks do not depend on it (the tests
    # recompute its predictions from the committed measurements), so it is not part of the stamp
    record = lane.stamp_record(
        lane.library_modules(notebook, exclude=("fp8lab.memory",)),
        machine,
        matrix=matrix,
        command=f"python -m tools.memory_check --matrix {matrix} --csv {csv.as_posix()}",
        seconds=round(seconds, 1),
        csv_sha256=hashlib.sha256(csv.read_bytes()).hexdigest(),
    )
    path = stamp_path(csv)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def stamp_path(csv: Path) -> Path:
    return csv.with_name(csv.name + ".stamp.json")


# The code a prediction comes from: the estimator and what it reads (hashed into the stamp of a
# predictions file, so that a later change to any of them shows)
ESTIMATOR_FILES = ("fp8lab/memory", "fp8lab/parts.py", "fp8lab/config.py", "fp8lab/flops.py")


def estimator_sha256(root: Path | None = None) -> str:
    """SHA-256 over the estimator's source files (:data:`ESTIMATOR_FILES`), in name order."""
    root = Path(__file__).resolve().parents[2] if root is None else root
    digest = hashlib.sha256()
    for name in ESTIMATOR_FILES:
        path = root / name
        for file in sorted(path.glob("*.py")) if path.is_dir() else [path]:
            digest.update(file.relative_to(root).as_posix().encode() + b"\0")
            digest.update(file.read_bytes())
    return digest.hexdigest()


def write_predictions(matrix: str, csv: Path):
    """Predict every configuration of ``matrix`` (nothing measured) into ``csv``, with a side
    file ``<csv>.stamp.json`` holding the date and :func:`estimator_sha256`: a record, made
    before the measurements, of what the estimator said."""
    import datetime

    import pandas as pd

    from tools.memory_check.matrices import MATRICES
    from tools.memory_check.measure import describe

    frame = pd.DataFrame([describe(c, c.predict()) for c in MATRICES[matrix]])
    frame = frame.drop(columns=["config"])
    csv.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(csv, index=False, float_format="%.1f")
    record = {
        "matrix": matrix,
        "what": "predictions only, written before any measurement of these configurations",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "estimator_files": list(ESTIMATOR_FILES),
        "estimator_sha256": estimator_sha256(),
        "command": f"python -m tools.memory_check --matrix {matrix} --predict-only "
        f"--csv {csv.as_posix()}",
        "csv_sha256": hashlib.sha256(csv.read_bytes()).hexdigest(),
    }
    stamp_path(csv).write_text(json.dumps(record, indent=1) + "\n")
    return frame



def print_report(frame, matrix: str) -> int:
    """Print a matrix's table and, where peaks were measured, its error summaries; the exit
    status: 1 when no configuration has a measurement column to compare with."""
    import pandas as pd

    pd.set_option("display.width", 220)
    pd.set_option("display.max_columns", 30)
    if matrix == "fits" or "measured_MiB" not in frame:
        print(frame.to_string(index=False))
        return 0 if matrix == "fits" else 1
    frame["error_pct"] = 100 * (frame["predicted_MiB"] / frame["measured_MiB"] - 1)
    print(frame[[c for c in SHOWN if c in frame]].to_string(index=False))
    if frame["measured_MiB"].notna().any():
        print(json.dumps(summarise(frame), indent=1))
        print(by_layout(frame).to_string())
    return 0
