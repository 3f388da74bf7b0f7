"""Chapter 09's accuracy runs: the Llama-shaped model trained on real text in TE BF16 and in
each FP8 recipe (delayed, current, block scaling), over five data-order seeds.

The model, the recipes and the training step are the chapter's own cells (tagged ``worker``
in notebooks/09_end_to_end.ipynb, loaded by :mod:`fp8lab.e2e.worker`); what is trained and how
long: :mod:`fp8lab.e2e.settings`; one run: :mod:`fp8lab.e2e.run`. Run it on a GPU box, the
seeds split over three commands of under nine minutes each on one H100::

    python -m tools.train_e2e --group accuracy --seeds 0,1 --out DIR
    python -m tools.train_e2e --group accuracy --seeds 2,3 --out DIR
    python -m tools.train_e2e --group accuracy --seeds 4 --out DIR
    python -m tools.train_e2e --plan                       # models, plans, FLOPs, commands

The ``torchao`` group (the same Llama in plain PyTorch, BF16 and torchao's two float8
recipes) runs eagerly like TE's, where torchao's casts are separate kernels: in a 30-step
trial on one H200 a step took 118 ms in PyTorch BF16, 299 ms with tensorwise and 352 ms with
rowwise scaling, about 3.5 minutes per seed; ``--plan`` prints its commands (two seeds each).

and commit the files of ``DIR`` under ``tests/gpu_results/e2e/``. ``--runs bf16:1,delayed``
runs single settings; ``--steps N`` stops early (such a file is not stamped: only full runs are
results). A command skips the runs that would not finish inside ``--budget-s`` and prints the
command that runs them. The large model is measured for speed only (``tools.e2e_speed``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import fp8lab
from fp8lab import e2e


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.train_e2e", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", default=e2e.ACCURACY_MODEL, choices=e2e.MODELS)
    parser.add_argument("--group", choices=sorted(e2e.GROUPS))
    parser.add_argument("--seeds", help="with --group: only these seeds, e.g. 0,1,2")
    parser.add_argument("--runs", help="comma-separated setting[:seed], e.g. bf16:1,delayed")
    parser.add_argument("--steps", type=int, help="stop early (the file is then not stamped)")
    parser.add_argument("--out", type=Path, default=e2e.RESULTS_DIR)
    parser.add_argument("--budget-s", type=float, default=500.0)
    parser.add_argument("--preset", choices=e2e.PRESETS)
    parser.add_argument("--plan", action="store_true", help="print the plan and the commands")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.plan and (args.group is None) == (args.runs is None):
        parser.error("give one of --group or --runs (or --plan)")
    if args.model != e2e.ACCURACY_MODEL and not args.plan:
        parser.error(f"--model {args.model}: measured for speed only (python -m tools.e2e_speed)")
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps {args.steps}: must be a positive number of steps")
    if args.budget_s <= 0:
        parser.error(f"--budget-s {args.budget_s}: must be > 0")
    try:
        runs = e2e.parse_runs(
            ",".join(e2e.GROUPS[args.group]) if args.group else args.runs or "bf16"
        )
        if args.seeds is not None:
            keep = {int(seed) for seed in args.seeds.split(",")}
            runs = [(name, seed) for name, seed in runs if seed in keep]
    except ValueError as error:
        parser.error(f"--runs/--seeds: {error}")
    if not runs:
        parser.error(f"--seeds {args.seeds}: selects no run")
    begin = time.perf_counter()
    print(fp8lab.banner(), flush=True)
    bench = e2e.Bench(args.preset, log=lambda message: print(message, flush=True))
    if not args.plan and args.preset is None and bench.preset != "full":
        parser.error(f"no GPU with TE here (the preset would be {bench.preset!r}): these would "
                     "be unstamped runs beside the stamped ones; pass --preset smoke to mean it")
    if args.plan:
        print(e2e.describe_plan(bench))
        return 0
    planned = bench.plan(args.model).steps
    if args.steps is not None and args.steps > planned:
        parser.error(f"--steps {args.steps}: the {args.model} plan has {planned} steps")
    print(f"corpus: {json.dumps(bench.corpus.describe())}", flush=True)
    log = lambda message: print(message, flush=True)  # noqa: E731
    code = e2e.run_all(bench, args.model, runs, args.out, args.steps, args.budget_s, log)
    print(f"done in {time.perf_counter() - begin:.0f} s", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
