"""The "fits?" check: the largest micro-batch that runs, against the estimator's prediction."""

from __future__ import annotations

import gc
import sys
from dataclasses import asdict, replace

from fp8lab import memory
from tools.memory_check.matrices import FITS_EXTRA_TRIES, Config
from tools.memory_check.measure import attempt


def capacity_bytes() -> float:
    """What this process can still allocate: free device memory plus the allocator's idle cache."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    return free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()


def fits_row(config: Config, te, recipe_module, device) -> dict:
    """Predicted against actual largest micro-batch (two steps each, out-of-memory caught).

    On a CPU (``--dry-run``) there is no memory to run out of: the capacity is made up, so that
    the search itself is exercised."""
    if device.type == "cuda":
        capacity = capacity_bytes()
    else:
        capacity = 1.01 * replace(config, batch=2).predict().peak_bytes
    predicted = memory.largest_micro_batch(
        config.cfg,
        config.seq,
        memory_bytes=capacity,
        headroom=1.0,
        context_bytes=0,
        max_batch=512,
        precision=config.precision,
        weights=config.weights,
        recompute=config.recompute,
    )
    tried: dict[int, dict] = {}

    def runs(batch: int) -> bool:
        if batch not in tried:
            print(f"  fits: trying B={batch}", file=sys.stderr, flush=True)
            tried[batch] = attempt(replace(config, batch=batch), te, recipe_module, device)
        return tried[batch]["status"] == "ok"

    if predicted >= 1 and runs(predicted):
        actual = predicted
        while actual < predicted + FITS_EXTRA_TRIES and runs(actual + 1):
            actual += 1
    else:
        actual = predicted - 1
        while actual >= 1 and not runs(actual):
            actual -= 1
    errors = {b: r.get("error", "") for b, r in tried.items() if r["status"] == "error"}
    largest = tried.get(actual, {})
    return {
        **{k: v for k, v in asdict(config).items() if k != "batch"},
        "capacity_GiB": round(capacity / 2**30, 2),
        "predicted_batch": predicted,
        "actual_batch": actual,
        "within_one": abs(predicted - actual) <= 1,
        "capped": actual == predicted + FITS_EXTRA_TRIES,
        "tried": " ".join(f"{b}:{r['status']}" for b, r in sorted(tried.items())),
        "measured_MiB_at_actual": largest.get("measured_MiB", float("nan")),
        "reserved_MiB_at_actual": largest.get("reserved_MiB", float("nan")),
        "predicted_MiB_at_actual": (
            replace(config, batch=actual).predict().peak_mib if actual >= 1 else float("nan")
        ),
        "error": "; ".join(f"B={b}: {e}" for b, e in errors.items()),
    }

