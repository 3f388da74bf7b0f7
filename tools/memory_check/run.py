"""Running a matrix: warm up, measure each configuration, write the CSV and its stamp."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

from tools.memory_check.fits import fits_row
from tools.memory_check.matrices import FITS, MATRICES, toy
from tools.memory_check.measure import attempt, row
from tools.memory_check.report import stamp


def warm_up(configs, te, recipe_module, device) -> None:
    """Create the one-off buffers (cuBLAS workspaces, FP8 and attention kernels, compiled TE
    functions) before any measurement, with a toy version of every layout and recompute mode."""
    seen = set()
    for config in configs:
        key = (config.cfg.position_embedding, config.weights, config.precision, config.recompute)
        if key in seen:
            continue
        seen.add(key)
        small = toy(replace(config, batch=max(1, config.batch), accumulation=1))
        result = attempt(small, te, recipe_module, device)
        if result["status"] != "ok":
            print(f"warm-up {key}: {result.get('error')}", file=sys.stderr, flush=True)


def run(matrix: str, csv: Path | None, dry_run: bool = False, limit: int | None = None):
    """Measure ``matrix`` (``limit``: its first configurations only); return the table."""
    import pandas as pd

    from fp8lab.environment import import_te

    te, recipe_module = import_te()  # TE before anything loads cuDNN
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not dry_run:
        raise SystemExit("no CUDA GPU here: measure on a GPU box, or pass --dry-run")
    for name in ("recompile_limit", "cache_size_limit"):  # TE's compiled element-wise functions
        if hasattr(torch._dynamo.config, name):  # see many shapes; keep them compiled
            setattr(torch._dynamo.config, name, 64)
    configs = list(FITS if matrix == "fits" else MATRICES[matrix])
    if limit is not None:
        configs = configs[:limit]
    if dry_run:
        configs = [toy(replace(c, batch=max(c.batch, 1))) for c in configs]
    begin = time.perf_counter()
    warm_up(configs, te, recipe_module, device)
    print(f"warm-up: {time.perf_counter() - begin:.0f} s", file=sys.stderr, flush=True)
    rows = []
    for index, config in enumerate(configs, start=1):
        started = time.perf_counter()
        if matrix == "fits":
            result = fits_row(config, te, recipe_module, device)
            note = f"predicted B={result['predicted_batch']}, actual {result['actual_batch']}"
        else:
            result = row(config, te, recipe_module, device)
            note = f"{result['status']} {result.get('measured_MiB', float('nan')):,.0f} MiB"
        rows.append(result)
        print(
            f"[{index}/{len(configs)}] {config.model} S={config.seq} B={config.batch} "
            f"{config.weights}/{config.precision}/{config.recompute}: {note} "
            f"({time.perf_counter() - started:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
    frame = pd.DataFrame(rows)
    seconds = time.perf_counter() - begin
    if csv is not None:
        csv.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(csv, index=False, float_format="%.1f")
        if device.type == "cuda" and not dry_run:
            print(f"stamp: {stamp(csv, matrix, seconds)}", file=sys.stderr)
    print(f"total: {seconds:.0f} s", file=sys.stderr)
    return frame

