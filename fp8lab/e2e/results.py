"""Chapter 09's result files: one small JSON file per run, where they live, what they are
called, and the stamp that says which code made them.

On a GPU with Transformer Engine and the full preset, a run of the whole plan is stamped like
the chapters (:func:`fp8lab.stamp.stamp_record`), over the fp8lab modules this kit imports and
the command that ran it (:func:`result_modules`), with a hash of the chapter's worker cells
(:func:`fp8lab.e2e.worker.source_sha256`); the CPU lane checks both.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from fp8lab import checks
from fp8lab.e2e.settings import ACCURACY_MODEL, GROUPS, parse_runs

ROOT = Path(__file__).resolve().parent.parent.parent
RESULTS_DIR = ROOT / "tests" / "gpu_results" / "e2e"
COMMANDS = ("tools.train_e2e", "tools.e2e_speed")  # the command lines that write result files


def result_name(model: str, setting: str, seed: int) -> str:
    """The file name of one run: ``llama__bf16__seed0.json``."""
    return f"{model}__{setting}__seed{seed}.json"


def expected_files() -> list[str]:
    """The result files of the whole plan: every accuracy run."""
    return [
        result_name(ACCURACY_MODEL, setting, seed)
        for group in GROUPS.values()
        for setting, seed in parse_runs(",".join(group))
    ]


def _folder(name: str, value) -> Path:
    if isinstance(value, bool) or not isinstance(value, (str, Path)) or not str(value):
        raise TypeError(f"{name}={checks.show(value)}: must be a folder path")
    return Path(value)


def load_results(directory: Path | str = RESULTS_DIR) -> list[dict]:
    """Every result file of ``directory``, in name order."""
    directory = _folder("directory", directory)
    if not directory.is_dir():
        raise ValueError(f"directory={str(directory)!r}: no such folder")
    return [json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))]


def write_record(record: dict, out: Path | str = RESULTS_DIR) -> Path:
    """Write ``record`` to ``out`` under its :func:`result_name`; return the path."""
    if not isinstance(record, dict) or not {"model", "setting", "seed"} <= set(record):
        raise TypeError(f"record={checks.show(record)}: must be a result record (a dict)")
    out = _folder("out", out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / result_name(record["model"], record["setting"], record["seed"])
    path.write_text(json.dumps(record, indent=1, allow_nan=False) + "\n")
    return path


def finite(values) -> list:
    """Values rounded to 5 decimals, ``None`` for a missing or non-finite one (JSON has no
    NaN)."""
    return [None if v is None or not math.isfinite(v) else round(float(v), 5) for v in values]


def result_modules(command: str = "tools.train_e2e") -> list[str]:
    """What a result file's stamp hashes: the fp8lab modules this kit imports, transitively, and
    the command that wrote the file."""
    from fp8lab import stamp

    checks.choice("command", command, COMMANDS)
    entry = "speed.py" if command == "tools.e2e_speed" else "run.py"
    kit = stamp.producer_modules(Path(__file__).with_name(entry))
    return sorted({*kit, f"fp8lab.e2e.{entry[:-3]}", command})


def run_stamp(record: dict, on_gpu: bool, preset: str) -> dict | None:
    """A stamp for a run of the whole plan on a GPU with TE (one that failed or diverged on the
    way included: that is a result too); none for a run cut short with ``steps``."""
    whole_plan = record["steps_requested"] == record["steps_planned"]
    if not (on_gpu and preset == "full" and whole_plan):
        return None
    from fp8lab import stamp

    return stamp.stamp_record(result_modules(), run_seconds=record["wall_s"],
                              worker_sha256=record["worker_sha256"])  # the cells it ran
