"""``python -m tools.memory_check``: measure a matrix of configurations, print and save the table.

    python -m tools.memory_check --matrix tune --csv tests/gpu_results/memory_tune_h200.csv
    python -m tools.memory_check --matrix tune --dry-run      # toy sizes, any machine
    python -m tools.memory_check --matrix heldout2 --predict-only \\
        --csv tests/gpu_results/memory_heldout2_predictions.csv   # predictions, no GPU
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tools.memory_check import __doc__ as PACKAGE_DOC
from tools.memory_check.matrices import MATRICES
from tools.memory_check.report import print_report, write_predictions
from tools.memory_check.run import run

# Columns printed by --predict-only
SHOWN_PREDICTED = (
    "model", "seq", "batch", "weights", "precision", "recompute", "accumulation",
    "predicted_MiB", "predicted_phase",
)  # fmt: skip


def parser() -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(
        prog="python -m tools.memory_check", description=PACKAGE_DOC.splitlines()[0]
    )
    found.add_argument("--matrix", choices=(*MATRICES, "fits"), default="heldout")
    found.add_argument("--csv", type=Path, help="write the table here (and a .stamp.json)")
    found.add_argument("--dry-run", action="store_true", help="toy sizes, CPU reference on CPU")
    found.add_argument("--limit", type=int, help="only the first N configurations")
    found.add_argument(
        "--predict-only", action="store_true", help="write the predictions only (no GPU)"
    )
    return found


def main(argv=None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        cli.error(f"--limit {args.limit}: must be a positive number of configurations")
    if args.csv is not None and args.csv.suffix != ".csv":
        cli.error(f"--csv {args.csv}: must name a .csv file")
    if args.predict_only:
        if args.matrix == "fits" or args.csv is None:
            cli.error("--predict-only needs a matrix of peaks (not fits) and --csv")
        frame = write_predictions(args.matrix, args.csv)
        print(frame.to_string(index=False, columns=[*SHOWN_PREDICTED]))
        return 0
    if args.matrix == "fits":  # the allocator's fragmentation would blur a one-micro-batch check
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    frame = run(args.matrix, args.csv, args.dry_run, args.limit)
    return print_report(frame, args.matrix)


if __name__ == "__main__":
    sys.exit(main())
