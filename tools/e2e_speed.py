"""Chapter 09's speed ratios, measured in alternating rounds.

The command line of :mod:`fp8lab.e2e.speed`. Run it on a GPU box, one command for both models
(a few minutes on one H100)::

    python -m tools.e2e_speed --out tests/gpu_results/e2e_speed.json

The file is stamped like the long runs (the fp8lab modules the kit imports, and this command);
the CPU lane checks the stamp (``tests/test_e2e_speed.py``). On a box of several GPUs the groups
can be split over them, one process per GPU, then joined and stamped::

    CUDA_VISIBLE_DEVICES=1 python -m tools.e2e_speed --models llama --only 4 --out part1.json
    ...
    python -m tools.e2e_speed --merge part*.json --out tests/gpu_results/e2e_speed.json
"""

from __future__ import annotations

import argparse
import faulthandler
import sys
import time
from pathlib import Path

from fp8lab import e2e
from fp8lab.e2e import speed


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.e2e_speed", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=speed.COMMITTED_FILE)
    parser.add_argument("--models", default=",".join(e2e.MODELS))
    parser.add_argument("--rounds", type=int, help="rounds per group (default: per model)")
    parser.add_argument("--steps", type=int, help="steps per round (default: per model)")
    parser.add_argument("--preset", choices=e2e.PRESETS)
    parser.add_argument("--only", help="only these groups, e.g. 0,3 (indices into speed.GROUPS)")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="PART",
                        help="join parts measured with --only into --out, and stamp it")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    models = tuple(m.strip() for m in args.models.split(","))
    unknown = [m for m in models if m not in e2e.MODELS]
    if unknown:
        parser.error(
            f"--models: no model {', '.join(map(repr, unknown))} (choose from "
            f"{', '.join(e2e.MODELS)})"
        )
    if args.rounds is not None and args.rounds < 2:
        parser.error(f"--rounds {args.rounds}: a ratio's spread needs at least 2 rounds")
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps {args.steps}: must be a positive number of steps")
    if args.merge:
        return merge(args.merge, args.out, parser)
    only = None
    if args.only is not None:
        try:
            only = [int(i) for i in args.only.split(",")]
            for model in models:
                speed.chosen_groups(model, only)
        except ValueError as error:
            parser.error(f"--only {args.only}: {error}")
    faulthandler.enable()  # a crash inside a compiled or captured step still names its frame
    begin = time.perf_counter()
    bench = e2e.Bench(args.preset, log=None)
    log = lambda line: print(line, flush=True)  # noqa: E731
    record = speed.measure_and_write(bench, models, args.out, args.rounds, args.steps, log,
                                     only=only)
    print("\n".join(speed.summary(record, models)))
    print(f"done in {time.perf_counter() - begin:.0f} s")
    return 0


def merge(paths: list[Path], out: Path, parser: argparse.ArgumentParser) -> int:
    """Join the parts at ``paths`` into ``out``, stamped with the longest part's time."""
    import json

    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        parser.error(f"--merge: no file {', '.join(missing)}")
    try:
        record = speed.merge([json.loads(p.read_text()) for p in paths])
    except (ValueError, KeyError) as error:
        parser.error(f"--merge: {error}")
    longest = max((part["seconds"] or 0.0) for part in record["parts"])
    record["stamp"] = speed.stamp(record, longest)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print("\n".join(speed.summary(record, tuple(record["models"]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
