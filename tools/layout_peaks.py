"""Each parallel layout's own peak memory per GPU, to test chapter 07's estimator beyond one GPU.

    python -m tools.layout_peaks --gpus 4 --csv tests/gpu_results/memory_layouts_h100_4gpu.csv
    python -m tools.layout_peaks --gpus 2 --preset smoke      # CPU processes, toy sizes

Chapter 08's workers keep the global batch on every rank for their checks against one GPU, so
their peaks are not a layout's own. This job builds one layout at a time on ``--gpus`` GPUs
(``tools/layout_peaks_worker.py``: DDP, FSDP2, TP+SP over all of them and, on four or more,
TP2 x DP2), each rank holding only its part of the batch, and records the fullest GPU's peak
above what was allocated before the layout was built, in BF16 and in FP8. The sizes are
chapter 08's (two layers of TE's tutorial shape, S = 2048, B = 4 per GPU). With ``--csv`` the
rows are written there with a ``.stamp.json`` beside them; chapter 07 sets them against the
estimator (:func:`fp8lab.memory.validation.layout_rows`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from fp8lab import distributed

WORKER = Path(__file__).with_name("layout_peaks_worker.py")
# What each layout's baseline is taken after (the stamp records it): the worker lets NCCL
# release the previous layout's collective buffers first (layout_peaks_worker.release_stashed);
# files without the field were measured before it did.
BASELINE = "after NCCL released the previous layout's buffers"
SIZES = {
    "full": {"H": 4096, "F": 16384, "A": 32, "L": 2, "S": 2048, "B": 4, "steps": 3},
    "smoke": {"H": 64, "F": 256, "A": 4, "L": 2, "S": 32, "B": 2, "steps": 2},
}
PRECISIONS = ("bf16", "fp8")


def layouts(gpus: int) -> list[str]:
    """The layouts a job on ``gpus`` GPUs measures."""
    found = ["DDP", "FSDP2", "TP+SP"]
    return found + (["TP2 x DP2 (SP)"] if gpus >= 4 and gpus % 2 == 0 else [])


def measure(gpus: int, preset: str = "full", timeout_s: float = 300.0) -> list[dict]:
    """The rows of one job (``ValueError`` if the job failed, with its worker's traceback)."""
    job = {**SIZES[preset], "layouts": layouts(gpus), "precisions": list(PRECISIONS)}
    found = distributed.torchrun(WORKER, gpus, job, timeout_s=timeout_s)
    if "error" in found:
        cause = distributed.first_traceback(found["error"]) or str(found["error"])[-1500:]
        raise ValueError(f"the layout job failed:\n{cause}")
    return found["rows"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.layout_peaks", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--gpus", type=int, default=2, help="processes, one per GPU (>= 2)")
    parser.add_argument("--preset", choices=tuple(SIZES), default="full")
    parser.add_argument("--csv", type=Path, help="write the rows here, and a .stamp.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.gpus < 2:
        parser.error(f"--gpus {args.gpus}: a parallel layout needs at least 2")
    if args.csv is not None and args.csv.suffix != ".csv":
        parser.error(f"--csv {args.csv}: must end in .csv")
    import pandas as pd

    begin = time.perf_counter()
    try:
        rows = measure(args.gpus, args.preset)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 1
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    if args.csv is not None:
        import torch

        from fp8lab import stamp as lane

        args.csv.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.csv, index=False)
        if not torch.cuda.is_available():
            print(f"wrote {args.csv}; no stamp: these are not GPU measurements")
            return 0
        record = lane.stamp_record(
            lane.producer_modules(WORKER),
            preset=args.preset,
            command=f"python -m tools.layout_peaks --gpus {args.gpus} --csv {args.csv}",
            seconds=round(time.perf_counter() - begin, 1),
            processes=args.gpus,
            baseline=BASELINE,
        )
        stamp = args.csv.with_name(args.csv.name + ".stamp.json")
        stamp.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.csv} and {stamp.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
