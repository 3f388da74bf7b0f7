"""Stamps: where committed GPU outputs came from, and whether they still describe the code.

The rendered book shows outputs committed from a GPU run, so each chapter (and each result file
of a long run) carries a stamp: the GPU and its count, torch, CUDA, cuDNN and Transformer Engine
versions, the date, a SHA-256 of the chapter's code cells, and SHA-256s of the fp8lab modules
its code imports (found by reading the imports, transitively; docstrings and comments left out).

A stamp is in one of three states (:class:`Status`):

* **fresh**: made on a CUDA GPU with TE, from the code cells the chapter holds now and the fp8lab
  code it imports now, on a stack with one cuDNN;
* **pending**: the outputs are genuine but the library changed since (the modules that changed
  are named), or the stamp predates the record of the cuDNN, or records two different cuDNNs in
  one process. The book can change honestly: the page says so at its top, and ``make test``
  lists the chapter and passes;
* **broken**: no stamp, a stamp not made on a CUDA GPU with TE (or the full preset, or enough
  GPUs), code cells that changed since the run, error outputs or unexecuted cells. The CPU lane
  fails on these.

A result file's stamp covers the modules its producer imports (:func:`producer_modules`), not
a chapter's. Nothing here imports torch unless a stamp is being made (:func:`where_it_runs`).
"""

from __future__ import annotations

import ast
import datetime
import hashlib
import io
import json
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from fp8lab import checks

__all__ = [
    "BROKEN",
    "FRESH",
    "PENDING",
    "Status",
    "code_hash",
    "library_hash",
    "library_modules",
    "module_hashes",
    "notebook_status",
    "producer_modules",
    "record_status",
    "stamp_notebook",
    "stamp_record",
    "toc_notebooks",
    "where_it_runs",
]

STAMP_KEY = "fp8lab"
GPUS_KEY = "fp8lab_gpus"  # notebook metadata: how many GPUs its stamp must record (1 when absent)
ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "fp8lab"
FRESH, PENDING, BROKEN = "fresh", "pending", "broken"
# Imports the GPU lane never executes: import_te() returns the CPU reference only where TE cannot
# run, and a stamp is only written where it can. A chapter that imports fp8lab.reference itself
# still hashes it.
NOT_ON_THE_GPU_LANE = {("fp8lab.environment", "fp8lab.reference")}


@dataclass(frozen=True)
class Status:
    """The state of one stamp: ``state`` is :data:`FRESH`, :data:`PENDING` or :data:`BROKEN`;
    ``broken`` and ``pending`` say why; ``changed`` names the fp8lab modules that changed."""

    name: str
    record: dict | None
    broken: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()
    changed: tuple[str, ...] = field(default=())

    @property
    def state(self) -> str:
        return BROKEN if self.broken else PENDING if self.pending else FRESH

    def summary(self) -> str:
        """One line for a terminal: the state and its first reason."""
        reasons = self.broken or self.pending
        return f"{self.state:8s} {self.name}" + (f": {reasons[0]}" if reasons else "")

    def page_note(self) -> str:
        """What the rendered page says at its top when the outputs are not fresh."""
        record = self.record or {}
        sha = str(record.get("library_sha256", ""))[:10] or "unknown"
        origin = f"Outputs from fp8lab {sha}, {record.get('date', 'an unknown date')}"
        return f"{origin}; " + "; ".join(self.broken or self.pending) + "."


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


def _check_path(name: str, value, suffix: str = "") -> Path:
    if isinstance(value, bool) or not isinstance(value, (str, Path)) or not str(value):
        raise TypeError(f"{name}={checks.show(value)}: must be a file path")
    path = Path(value)
    if not path.exists() or (suffix and path.suffix != suffix):
        raise ValueError(f"{name}={str(path)!r}: no such {suffix or 'file'}")
    return path


def toc_notebooks(root: Path = ROOT) -> list[Path]:
    """The ``.ipynb`` chapters listed in ``_toc.yml``, in book order."""
    import yaml

    root = _check_path("root", root)
    if not (root / "_toc.yml").is_file():
        raise ValueError(f"root={str(root)!r}: holds no _toc.yml")
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

    walk(yaml.safe_load((root / "_toc.yml").read_text()))
    return [root / f"{name}.ipynb" for name in files if (root / f"{name}.ipynb").exists()]


def read(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def _code_cells(notebook: dict) -> list[str]:
    return [
        "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for cell in notebook["cells"]
        if cell["cell_type"] == "code"
    ]


def code_hash(notebook: dict) -> str:
    """SHA-256 of the code cells' sources (trailing white space ignored), in order."""
    _check_notebook(notebook)
    digest = hashlib.sha256()
    for source in _code_cells(notebook):
        digest.update(source.rstrip().encode())
        digest.update(b"\0")
    return digest.hexdigest()


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
    for source in _code_cells(notebook):
        try:
            pending |= _imports(ast.parse(source), root)
        except SyntaxError:  # IPython syntax (magics) in a cell: no imports read from it
            continue
    return _closure(pending, root, exclude)


def producer_modules(script: Path, root: Path = ROOT, exclude: tuple[str, ...] = ()) -> list[str]:
    """The fp8lab modules a script (a result file's producer) imports, transitively, sorted."""
    script = _check_path("script", script, ".py")
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


def stamp_notebook(path: Path, lane_seconds: float | None = None, machine: dict | None = None):
    """Write the stamp into the notebook at ``path`` and return it."""
    notebook = read(path)
    extra = {"code_sha256": code_hash(notebook)}
    if lane_seconds is not None:
        extra["lane_seconds"] = round(lane_seconds, 1)
    record = stamp_record(library_modules(notebook), machine, **extra)
    notebook["metadata"][STAMP_KEY] = record
    Path(path).write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
    return record


# --- checking stamps ------------------------------------------------------------------------------


def _changed_modules(record: dict, modules: list[str]) -> list[str]:
    per_module = record.get("module_sha256") or {}
    now = module_hashes(modules)
    if per_module:
        return [m for m in modules if per_module.get(m) != now[m]] + sorted(
            set(per_module) - set(modules)
        )
    if record["library_sha256"] != library_hash([m for m in modules if now[m]]):
        return ["one or more of its modules (the stamp predates per-module hashes)"]
    return []


def _broken(record: dict | None, gpus: int) -> list[str]:
    if not record:
        return ["no GPU stamp: run the GPU lane (make gpu-lane) on a GPU box"]
    found = []
    if not record.get("gpu_name") or not record.get("transformer_engine") or not record.get("cuda"):
        found.append("the stamp does not name a CUDA GPU with Transformer Engine")
    if record.get("preset") != "full":
        found.append("its outputs were not made with the full preset")
    if int(record.get("gpu_count") or 0) < gpus:
        found.append(f"stamped on {record.get('gpu_count')} GPU(s); it needs {gpus}")
    modules, sha = record.get("library_modules"), record.get("library_sha256")
    if not isinstance(modules, list) or not isinstance(sha, str):
        found.append("the stamp has no hash of the fp8lab code")
    return found


def _pending(record: dict, modules: list[str]) -> tuple[list[str], list[str]]:
    reasons: list[str] = []
    if "cudnn" not in record:
        reasons.append("made before stamps recorded the cuDNN in use (possibly two cuDNNs)")
    elif record.get("cudnn_torch") and record["cudnn"] != record["cudnn_torch"]:
        reasons.append(f"made with two cuDNNs ({record['cudnn']} and {record['cudnn_torch']})")
    existing = [m for m in modules if _module_path(m, ROOT) is not None]
    gone = [m for m in modules if m not in existing]  # moved or removed since: pending, not broken
    changed = list(dict.fromkeys(_changed_modules(record, existing) + gone))
    if changed:
        reasons.append(f"the library changed since in {', '.join(changed)}; re-run pending")
    return reasons, changed


def record_status(record: dict | None, name: str, gpus: int = 1) -> Status:
    """The status of a result file's stamp (its modules are the ones it recorded)."""
    if record is not None and not isinstance(record, dict):
        raise TypeError(f"record={checks.show(record)}: must be a stamp dict or None")
    if not isinstance(name, str):
        raise TypeError(f"name={checks.show(name)}: must be a string")
    gpus = checks.integer("gpus", gpus)
    broken = _broken(record, gpus)
    if broken:
        return Status(name, record, tuple(broken))
    pending, changed = _pending(record, record["library_modules"])
    return Status(name, record, (), tuple(pending), tuple(changed))


def notebook_status(path: Path) -> Status:
    """The status of a chapter's committed outputs."""
    path = _check_path("path", path, ".ipynb")
    notebook = _check_notebook(read(path))
    metadata = notebook.get("metadata", {})
    record = metadata.get(STAMP_KEY)
    broken = _broken(record, int(metadata.get(GPUS_KEY, 1)))
    if record and record.get("code_sha256") != code_hash(notebook):
        broken.append("code cells changed since the GPU run: run the GPU lane again")
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        if any(output.get("output_type") == "error" for output in cell.get("outputs", [])):
            broken.append(f"cell {index} has an error output")
        if cell.get("source") and cell.get("execution_count") is None:
            broken.append(f"cell {index} was not executed")
    if broken:
        return Status(path.name, record, tuple(broken))
    now = library_modules(notebook)
    pending, changed = _pending(record, sorted(set(now) | set(record["library_modules"])))
    return Status(path.name, record, (), tuple(pending), tuple(changed))
