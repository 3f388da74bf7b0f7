"""The GPU lane: execute the chapters on a GPU box, stamp them, and check the stamps.

The rendered book shows committed outputs, so it must be able to tell that they came from a
real GPU with Transformer Engine, from the code the notebook holds now, and from the fp8lab
code it imports now. ``python -m tools.lane run`` executes each chapter of ``_toc.yml`` in
place (nbmake ``--overwrite``, preset ``full``, one notebook at a time) and writes a stamp into
its metadata: GPU name and count, compute capability, torch, TE and CUDA versions, the date,
the lane's wall time, a SHA-256 of its code cells, and a SHA-256 of the fp8lab modules it
imports (found by reading the imports, transitively; docstrings and comments left out).

``python -m tools.lane check`` (and the CPU lane's tests) fail when a chapter has no stamp, a
stamp not made on a CUDA GPU with TE, an error output, code cells that no longer match the
stamped hash, or fp8lab modules that changed since the stamp.

The same stamp marks result files of long runs (:func:`stamp_record`, :func:`record_problems`).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import io
import json
import os
import subprocess
import sys
import time
import tokenize
from pathlib import Path

STAMP_KEY = "fp8lab"
GPUS_KEY = "fp8lab_gpus"  # notebook metadata: how many GPUs its stamp must record (1 when absent)
ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "fp8lab"
# Imports that the GPU lane never executes: import_te() returns the CPU reference only where TE
# cannot run,
# and a stamp is only written where it can. A chapter that imports fp8lab.reference itself still
# hashes it.
NOT_ON_THE_GPU_LANE = {("fp8lab.environment", "fp8lab.reference")}


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


def _code_cells(notebook: dict) -> list[str]:
    return [
        "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for cell in notebook["cells"]
        if cell["cell_type"] == "code"
    ]


def code_hash(notebook: dict) -> str:
    """SHA-256 of the code cells' sources (trailing white space ignored), in order."""
    digest = hashlib.sha256()
    for source in _code_cells(notebook):
        digest.update(source.rstrip().encode())
        digest.update(b"\0")
    return digest.hexdigest()


# --- which fp8lab code a chapter runs ------------------------------------------------------------


def _module_path(module: str, root: Path) -> Path | None:
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _imports(tree: ast.AST, root: Path, current: str | None = None) -> set[str]:
    """fp8lab modules a parsed source imports (module- and function-level), resolved to files."""
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            module = node.module
            if node.level and current:  # relative import inside the package
                module = ".".join(current.split(".")[: -node.level] + [module])
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        for name in names:
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                parts = name.split(".")
                while parts and _module_path(".".join(parts), root) is None:
                    parts.pop()
                if parts:
                    found.add(".".join(parts))
    return found


def _lazy_names(init: Path) -> set[str]:
    """Modules the package's ``__init__`` imports on first attribute access (its ``_LAZY``
    table)."""
    for node in ast.walk(ast.parse(init.read_text())):
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", "") == "_LAZY" for t in node.targets
        ):
            return set(ast.literal_eval(node.value).values())
    return set()


def library_modules(notebook: dict, root: Path = ROOT, exclude: tuple[str, ...] = ()) -> list[str]:
    """The fp8lab modules a chapter imports, directly or through other fp8lab modules, sorted.

    ``exclude``: modules whose code cannot change the output (a result file of measurements
    leaves out the estimator it is compared with); they are neither hashed nor followed.
    """
    pending: set[str] = set()
    for source in _code_cells(notebook):
        try:
            pending |= _imports(ast.parse(source), root)
        except SyntaxError:  # IPython syntax (magics) in a cell: no imports read from it
            continue
    seen: set[str] = set()
    while pending:
        module = pending.pop()
        if module in seen or module in exclude:
            continue
        seen.add(module)
        path = _module_path(module, root)
        found = _imports(ast.parse(path.read_text()), root, module)
        if path.name == "__init__.py" and module == PACKAGE:
            found |= _lazy_names(path)
        if module != PACKAGE:
            found.add(PACKAGE)  # importing a submodule runs the package's __init__
        found |= {
            ".".join(module.split(".")[:i]) for i in range(2, module.count(".") + 1)
        }  # parent packages
        pending |= {m for m in found if (module, m) not in NOT_ON_THE_GPU_LANE}
    return sorted(seen)


def normalised_source(path: Path) -> str:
    """A module's code without docstrings, comments, blank lines or trailing white space.

    Built from line and column positions that ``ast`` and ``tokenize`` report alike on every
    supported Python, so a stamp made on the GPU box checks on any machine.
    """
    text = path.read_text()
    skip: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
        ):
            first = body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                skip.update(range(first.lineno, first.end_lineno + 1))
    cut: dict[int, int] = {}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            cut[token.start[0]] = token.start[1]
    lines = []
    for number, line in enumerate(text.splitlines(), start=1):
        if number in skip:
            continue
        line = line[: cut[number]] if number in cut else line
        if line.strip():
            lines.append(line.rstrip())
    return "\n".join(lines)


def library_hash(modules: list[str], root: Path = ROOT) -> str:
    """SHA-256 over the normalised source of ``modules``, in order."""
    digest = hashlib.sha256()
    for module in modules:
        digest.update(
            module.encode() + b"\0" + normalised_source(_module_path(module, root)).encode() + b"\0"
        )
    return digest.hexdigest()


# --- stamps ---------------------------------------------------------------------------------------


def read(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def where_it_runs() -> dict:
    """The GPU, its count and the software versions; raises unless CUDA and TE are both here."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(
            "the GPU lane needs a CUDA GPU: no stamp is written on a CPU-only machine"
        )
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


def stamp_record(modules: list[str], machine: dict | None = None, **extra) -> dict:
    """The stamp of an output made now on this machine from ``modules`` of fp8lab."""
    record = dict(machine or where_it_runs())
    record.update(
        {
            "preset": "full",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "library_modules": modules,
            "library_sha256": library_hash(modules),
            **extra,
        }
    )
    return record


def stamp(path: Path, lane_seconds: float | None = None, machine: dict | None = None) -> dict:
    """Write the stamp into the notebook at ``path`` and return it."""
    notebook = read(path)
    extra = {"code_sha256": code_hash(notebook)}
    if lane_seconds is not None:
        extra["lane_seconds"] = round(lane_seconds, 1)
    record = stamp_record(library_modules(notebook), machine, **extra)
    notebook["metadata"][STAMP_KEY] = record
    Path(path).write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
    return record


def record_problems(record: dict | None, name: str, gpus: int = 1) -> list[str]:
    """What is wrong with a stamp (of a notebook or a result file); empty when it is fine."""
    if not record:
        return [f"{name}: no GPU stamp; run the GPU lane (make gpu-lane) on a GPU box"]
    found = []
    if not record.get("gpu_name") or not record.get("transformer_engine") or not record.get("cuda"):
        found.append(f"{name}: the stamp does not name a CUDA GPU with Transformer Engine")
    if record.get("preset") != "full":
        found.append(f"{name}: stamped outputs were not made with the full preset")
    if int(record.get("gpu_count") or 0) < gpus:
        found.append(f"{name}: stamped on {record.get('gpu_count')} GPU(s); it needs {gpus}")
    modules = record.get("library_modules")
    if modules is None or record.get("library_sha256") is None:
        found.append(f"{name}: the stamp has no hash of the fp8lab code; run the GPU lane again")
    elif any(_module_path(m, ROOT) is None for m in modules) or record[
        "library_sha256"
    ] != library_hash(modules):
        found.append(
            f"{name}: the fp8lab modules it imports ({', '.join(modules)}) changed since the "
            "GPU run; "
            "run the GPU lane again"
        )
    return found


def problems(path: Path) -> list[str]:
    """What is wrong with a chapter's committed outputs (empty when it is fine)."""
    notebook = read(path)
    record = notebook.get("metadata", {}).get(STAMP_KEY)
    found = record_problems(
        record, path.name, gpus=int(notebook.get("metadata", {}).get(GPUS_KEY, 1))
    )
    if not record:
        return found
    if record.get("code_sha256") != code_hash(notebook):
        found.append(f"{path.name}: code cells changed since the GPU run; run the GPU lane again")
    elif record.get("library_modules") is not None and record["library_modules"] != library_modules(
        notebook
    ):
        found.append(
            f"{path.name}: it imports other fp8lab modules than when stamped; "
            "run the GPU lane again"
        )
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
        result = subprocess.run(
            [
                python,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-q",
                "--nbmake",
                "--nbmake-timeout=900",
                "--overwrite",
                str(path),
            ],
            env=environment,
            cwd=ROOT,
        )
        seconds = time.perf_counter() - begin
        if result.returncode == 0:
            stamp(path, seconds, machine)
            print(f"stamped {path.name}: {seconds:.0f} s on {machine['gpu_name']}", flush=True)
        else:
            failures += 1
            print(f"FAILED {path.name} after {seconds:.0f} s (not stamped)", flush=True)
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.lane", description=__doc__.splitlines()[0]
    )
    parser.add_argument("action", choices=("run", "check", "list"))
    parser.add_argument(
        "notebooks", nargs="*", type=Path, help="default: every chapter in _toc.yml"
    )
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.notebooks] or toc_notebooks()
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
