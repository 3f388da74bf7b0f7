"""The GPU lane: execute the chapters on a GPU box, stamp them, and check the stamps.

The rendered book shows committed outputs, so it must be able to tell that they
came from a real GPU with Transformer Engine and from the code the notebook holds
now. ``python -m fp8lab.lane run`` executes each chapter of ``_toc.yml`` in place
(nbmake ``--overwrite``, preset ``full``, one notebook at a time) and writes a
stamp into its metadata: GPU name and count, compute capability, torch, TE and
CUDA versions, the date, the lane's wall time and a SHA-256 of its code cells.

``python -m fp8lab.lane check`` (and the CPU lane's tests) fail when a chapter
has no stamp, a stamp not made on a CUDA GPU with TE, an error output, or code
cells that no longer match the stamped hash.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

STAMP_KEY = "fp8lab"
ROOT = Path(__file__).resolve().parent.parent


def toc_notebooks(root: Path = ROOT) -> list[Path]:
    """The ``.ipynb`` chapters listed in ``_toc.yml``, in book order."""
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    return [root / f"{name}.ipynb" for name in files if (root / f"{name}.ipynb").exists()]


def code_hash(notebook: dict) -> str:
    """SHA-256 of the code cells' sources (trailing white space ignored), in order."""
    digest = hashlib.sha256()
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            digest.update(source.rstrip().encode())
            digest.update(b"\0")
    return digest.hexdigest()


def read(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def where_it_runs() -> dict:
    """The GPU, its count and the software versions; raises unless CUDA and TE are both here."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("the GPU lane needs a CUDA GPU: no stamp is written on a CPU-only machine")
    import transformer_engine
    import transformer_engine.pytorch  # noqa: F401  (fails where TE cannot run)

    major, minor = torch.cuda.get_device_capability()
    return {
        "gpu_name": torch.cuda.get_device_name(),
        "gpu_count": torch.cuda.device_count(),
        "compute_capability": f"{major}.{minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformer_engine": transformer_engine.__version__,
    }


def stamp(path: Path, lane_seconds: float | None = None, machine: dict | None = None) -> dict:
    """Write the stamp into the notebook at ``path`` and return it."""
    notebook = read(path)
    record = dict(machine or where_it_runs())
    record.update({
        "preset": "full",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "code_sha256": code_hash(notebook),
    })
    if lane_seconds is not None:
        record["lane_seconds"] = round(lane_seconds, 1)
    notebook["metadata"][STAMP_KEY] = record
    Path(path).write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
    return record


def problems(path: Path) -> list[str]:
    """What is wrong with a chapter's committed outputs (empty when it is fine)."""
    notebook = read(path)
    found = []
    record = notebook.get("metadata", {}).get(STAMP_KEY)
    if not record:
        return [f"{path.name}: no GPU stamp; run the GPU lane (make gpu-lane) on a GPU box"]
    if not record.get("gpu_name") or not record.get("transformer_engine") or not record.get("cuda"):
        found.append(f"{path.name}: the stamp does not name a CUDA GPU with Transformer Engine")
    if record.get("preset") != "full":
        found.append(f"{path.name}: stamped outputs were not made with the full preset")
    if record.get("code_sha256") != code_hash(notebook):
        found.append(f"{path.name}: code cells changed since the GPU run; run the GPU lane again")
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        if any(output.get("output_type") == "error" for output in cell.get("outputs", [])):
            found.append(f"{path.name}: cell {index} has an error output")
        if cell.get("source") and cell.get("execution_count") is None:
            found.append(f"{path.name}: cell {index} was not executed")
    return found


def run(paths: list[Path], python: str = sys.executable) -> int:
    """Execute and stamp each notebook; return the number that failed."""
    machine = where_it_runs()
    environment = dict(os.environ, FP8LAB_PRESET="full")
    failures = 0
    for path in paths:
        begin = time.perf_counter()
        result = subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--nbmake",
                                 "--nbmake-timeout=900", "--overwrite", str(path)], env=environment)
        seconds = time.perf_counter() - begin
        if result.returncode == 0:
            stamp(path, seconds, machine)
            print(f"stamped {path.name}: {seconds:.0f} s on {machine['gpu_name']}", flush=True)
        else:
            failures += 1
            print(f"FAILED {path.name} after {seconds:.0f} s (not stamped)", flush=True)
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fp8lab.lane", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("run", "check", "list"))
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every chapter in _toc.yml")
    args = parser.parse_args(argv)
    paths = args.notebooks or toc_notebooks()
    if args.action == "list":
        print("\n".join(str(p.relative_to(ROOT)) for p in paths))
        return 0
    if args.action == "run":
        return 1 if run(paths) else 0
    issues = [problem for path in paths for problem in problems(path)]
    print("\n".join(issues) or f"{len(paths)} notebooks stamped and current")
    return 1 if issues else 0


if __name__ == "__main__":
    sys.exit(main())
