"""Stamps: where committed GPU outputs came from, and which fp8lab code made them.

The rendered book shows outputs committed from a GPU run, so each chapter (and each result file
of a long run) carries a stamp: the GPU and its count, torch, CUDA, cuDNN and Transformer Engine
versions, the date, and SHA-256s of the fp8lab modules its code imports (found by reading the
imports, transitively; docstrings and comments left out). This module makes them: the producers
of result files in the chapter kits call :func:`stamp_record` with :func:`library_modules` (a
chapter's) or :func:`producer_modules` (a script's). Checking them (fresh, pending or broken)
is the book's business, in ``tools/stamps.py``.

Nothing here imports torch unless a stamp is being made (:func:`where_it_runs`).
"""

from __future__ import annotations

import ast
import datetime
import hashlib
import io
import tokenize
from pathlib import Path

from fp8lab import checks

__all__ = [
    "code_cells",
    "library_hash",
    "library_modules",
    "module_hashes",
    "producer_modules",
    "stamp_record",
    "where_it_runs",
]

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "fp8lab"
# Imports the GPU lane never executes: import_te() returns the CPU reference only where TE cannot
# run, and a stamp is only written where it can. A chapter that imports fp8lab.reference itself
# still hashes it.
NOT_ON_THE_GPU_LANE = {("fp8lab.environment", "fp8lab.reference")}


# --- which code a chapter or a script runs ------------------------------------------------------


def _check_notebook(notebook) -> dict:
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise TypeError(f"notebook={checks.show(notebook)}: must be a notebook dict with 'cells'")
    for cell in notebook["cells"]:
        if not isinstance(cell, dict) or "cell_type" not in cell or "source" not in cell:
            raise TypeError("notebook: every cell must be a dict with 'cell_type' and 'source'")
    return notebook


def _check_modules(modules) -> list[str]:
    if not isinstance(modules, (list, tuple)) or not all(isinstance(m, str) for m in modules):
        raise TypeError(f"modules={checks.show(modules)}: must be a list of module names")
    return list(modules)


def code_cells(notebook: dict) -> list[str]:
    """The sources of a notebook's code cells, in order."""
    _check_notebook(notebook)
    return [
        "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for cell in notebook["cells"]
        if cell["cell_type"] == "code"
    ]


def _module_path(module: str, root: Path) -> Path | None:
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _imported_names(node: ast.AST, package: str | None) -> list[str]:
    """Absolute names an import statement reaches; ``package`` resolves relative imports."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if node.level and package:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            module = ".".join([*base, module] if module else base)
        return [module] + [f"{module}.{alias.name}" for alias in node.names]
    return []


def _imports(tree: ast.AST, root: Path, package: str | None = None) -> set[str]:
    """fp8lab modules a parsed source imports (module- and function-level), resolved to files."""
    found: set[str] = set()
    for node in ast.walk(tree):
        for name in _imported_names(node, package):
            if name != PACKAGE and not name.startswith(PACKAGE + "."):
                continue
            parts = name.split(".")
            while parts and _module_path(".".join(parts), root) is None:
                parts.pop()
            if parts:
                found.add(".".join(parts))
    return found


def _lazy_names(init: Path) -> set[str]:
    """Modules a package's ``__init__`` imports on first attribute access (its ``_LAZY`` table)."""
    for node in ast.walk(ast.parse(init.read_text())):
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", "") == "_LAZY" for t in node.targets
        ):
            return set(ast.literal_eval(node.value).values())
    return set()


def _closure(pending: set[str], root: Path, exclude: tuple[str, ...]) -> list[str]:
    seen: set[str] = set()
    while pending:
        module = pending.pop()
        if module in seen or any(module == e or module.startswith(e + ".") for e in exclude):
            continue  # an excluded package takes its submodules with it
        seen.add(module)
        path = _module_path(module, root)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found = _imports(ast.parse(path.read_text()), root, package)
        if path.name == "__init__.py":
            found |= _lazy_names(path)
        found |= {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        pending |= {m for m in found if (module, m) not in NOT_ON_THE_GPU_LANE}
    return sorted(seen)


def library_modules(notebook: dict, root: Path = ROOT, exclude: tuple[str, ...] = ()) -> list[str]:
    """The fp8lab modules a chapter imports, directly or through other fp8lab modules, sorted.

    ``exclude``: modules whose code cannot change the output (a file of measurements leaves out
    the estimator it is compared with); they are neither hashed nor followed.
    """
    _check_notebook(notebook)
    pending: set[str] = set()
    for source in code_cells(notebook):
        try:
            pending |= _imports(ast.parse(source), root)
        except SyntaxError:  # IPython syntax (magics) in a cell: no imports read from it
            continue
    return _closure(pending, root, exclude)


def producer_modules(script: Path, root: Path = ROOT, exclude: tuple[str, ...] = ()) -> list[str]:
    """The fp8lab modules a script (a result file's producer) imports, transitively, sorted."""
    script = checks.path("script", script, ".py")
    return _closure(_imports(ast.parse(script.read_text()), root), root, exclude)


def normalised_source(path: Path) -> str:
    """A module's code without docstrings, comments, blank lines or trailing white space.

    Built from line and column positions that ``ast`` and ``tokenize`` report alike on every
    supported Python, so a stamp made on the GPU box checks on any machine.
    """
    text = path.read_text()
    skip: set[int] = set()
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None) if isinstance(node, kinds) else None
        first = body[0] if body else None
        value = getattr(first, "value", None) if isinstance(first, ast.Expr) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            skip.update(range(first.lineno, first.end_lineno + 1))
    cut = {
        token.start[0]: token.start[1]
        for token in tokenize.generate_tokens(io.StringIO(text).readline)
        if token.type == tokenize.COMMENT
    }
    lines = []
    for number, line in enumerate(text.splitlines(), start=1):
        if number in skip:
            continue
        line = line[: cut[number]] if number in cut else line
        if line.strip():
            lines.append(line.rstrip())
    return "\n".join(lines)


def module_hashes(modules: list[str], root: Path = ROOT) -> dict[str, str]:
    """SHA-256 of each module's normalised source (``None`` where the module is gone)."""
    hashes = {}
    modules = _check_modules(modules)
    for module in modules:
        path = _module_path(module, root)
        source = normalised_source(path).encode() if path else None
        hashes[module] = hashlib.sha256(source).hexdigest() if source is not None else None
    return hashes


def library_hash(modules: list[str], root: Path = ROOT) -> str:
    """SHA-256 over the normalised source of ``modules``, in order."""
    digest = hashlib.sha256()
    missing = [m for m in _check_modules(modules) if _module_path(m, root) is None]
    if missing:
        raise ValueError(f"modules: no such module {', '.join(missing)}")
    for module in modules:
        digest.update(
            module.encode() + b"\0" + normalised_source(_module_path(module, root)).encode() + b"\0"
        )
    return digest.hexdigest()


# --- making stamps -------------------------------------------------------------------------------


def where_it_runs() -> dict:
    """The GPU, its count and the software versions (cuDNN as TE loaded it and as torch was
    built with); raises unless CUDA and TE are both here and agree on one cuDNN."""
    from fp8lab import environment

    env = environment.detect()
    if not env.cuda_available:
        raise RuntimeError("a stamp needs a CUDA GPU: none is written on a CPU-only machine")
    environment.require_one_cudnn(env)
    major, minor = env.compute_capability
    return {
        "gpu_name": env.gpu_name,
        "gpu_count": env.gpu_count,
        "compute_capability": f"{major}.{minor}",
        "torch": env.torch_version,
        "cuda": env.cuda_version,
        "transformer_engine": env.te_version,
        "cudnn": env.cudnn.te_loaded,
        "cudnn_torch": env.cudnn.torch_built,
    }


def stamp_record(modules: list[str], machine: dict | None = None, **extra) -> dict:
    """The stamp of an output made now on this machine from ``modules`` of fp8lab."""
    modules = _check_modules(modules)
    if machine is not None and not isinstance(machine, dict):
        raise TypeError(f"machine={checks.show(machine)}: must be a dict of the machine's facts")
    record = dict(machine or where_it_runs())
    record.update(
        {
            "preset": "full",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "library_modules": list(modules),
            "library_sha256": library_hash(modules),
            "module_sha256": module_hashes(modules),
            **extra,
        }
    )
    return record
