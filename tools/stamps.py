"""Checking stamps: whether a chapter's committed outputs (or a result file) still describe the
code, and writing a chapter's stamp after the GPU lane ran it.

A stamp (made by :mod:`fp8lab.stamp`) is in one of three states (:class:`Status`):

* **fresh**: made on a CUDA GPU with TE, from the code cells the chapter holds now and the fp8lab
  code it imports now, on a stack with one cuDNN;
* **pending**: the outputs are genuine but the library changed since (the modules that changed
  are named), or the stamp predates the record of the cuDNN, or records two different cuDNNs in
  one process. The book can change honestly: the page says so at its top, and ``make test``
  lists the chapter and passes;
* **broken**: no stamp, a stamp not made on a CUDA GPU with TE (or the full preset, or enough
  GPUs), code cells that changed since the run, error outputs or unexecuted cells. The CPU lane
  fails on these.

A result file's stamp covers the modules its producer imports
(:func:`fp8lab.stamp.producer_modules`), not a chapter's. Used by ``python -m tools.lane``, the
book's page notes (:mod:`tools.book_stamps`) and the tests.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from fp8lab import checks
from fp8lab import stamp as making

STAMP_KEY = "fp8lab"
GPUS_KEY = "fp8lab_gpus"  # notebook metadata: how many GPUs its stamp must record (1 when absent)
ROOT = making.ROOT
FRESH, PENDING, BROKEN = "fresh", "pending", "broken"


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


def toc_notebooks(root: Path = ROOT) -> list[Path]:
    """The ``.ipynb`` chapters listed in ``_toc.yml``, in book order."""
    import yaml

    root = checks.path("root", root)
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
    """A notebook (any JSON file) as a dict."""
    return json.loads(Path(path).read_text())


def code_hash(notebook: dict) -> str:
    """SHA-256 of the code cells' sources (trailing white space ignored), in order."""
    digest = hashlib.sha256()
    for source in making.code_cells(notebook):
        digest.update(source.rstrip().encode())
        digest.update(b"\0")
    return digest.hexdigest()


# --- the GPUs a chapter runs on ------------------------------------------------------------------


def gpus_needed(path: Path) -> int:
    """How many GPUs the chapter at ``path`` runs on (its :data:`GPUS_KEY`, 1 when absent)."""
    return int(read(path)["metadata"].get(GPUS_KEY, 1))


def pinned_environment(path: Path, base: dict[str, str]) -> dict[str, str]:
    """``base`` with ``CUDA_VISIBLE_DEVICES`` set to the first GPUs the chapter needs, so that a
    chapter runs on as many GPUs as its stamp must record whatever the machine has (a
    one-GPU chapter on GPU 0 of a four-GPU box); a ``CUDA_VISIBLE_DEVICES`` already in
    ``base`` is left as it is (the caller chose)."""
    if "CUDA_VISIBLE_DEVICES" in base:
        return dict(base)
    return {**base, "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(gpus_needed(path))))}


_MACHINE = "import json; from fp8lab import stamp; print(json.dumps(stamp.where_it_runs()))"


_MACHINES: dict[frozenset, dict] = {}  # one look per environment: it imports torch and TE


def machine_in(environment: dict[str, str]) -> dict:
    """:func:`fp8lab.stamp.where_it_runs` as a process with ``environment`` sees it (the GPUs
    it is pinned to); raises ``RuntimeError`` with the process's error where there is none."""
    import subprocess
    import sys

    key = frozenset(environment.items())
    if key not in _MACHINES:
        done = subprocess.run([sys.executable, "-c", _MACHINE], env=environment, cwd=ROOT,
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError((done.stderr.strip().splitlines() or ["no GPU record"])[-1])
        _MACHINES[key] = json.loads(done.stdout.strip().splitlines()[-1])
    return dict(_MACHINES[key])


# --- writing a chapter's stamp -------------------------------------------------------------------


def stamp_notebook(path: Path, lane_seconds: float | None = None, machine: dict | None = None,
                   lane_parts: int | None = None):
    """Write the stamp into the notebook at ``path`` and return it (``lane_parts``: the number
    of commands a chapter run in parts took, :mod:`tools.lane`)."""
    notebook = read(path)
    extra = {"code_sha256": code_hash(notebook)}
    if lane_seconds is not None:
        extra["lane_seconds"] = round(lane_seconds, 1)
    if lane_parts is not None:
        extra["lane_parts"] = lane_parts
    record = making.stamp_record(making.library_modules(notebook), machine, **extra)
    notebook["metadata"][STAMP_KEY] = record
    Path(path).write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
    return record


# --- checking stamps ------------------------------------------------------------------------------


def _changed_modules(record: dict, modules: list[str]) -> list[str]:
    per_module = record.get("module_sha256") or {}
    now = making.module_hashes(modules)
    if per_module:
        return [m for m in modules if per_module.get(m) != now[m]] + sorted(
            set(per_module) - set(modules)
        )
    if record["library_sha256"] != making.library_hash([m for m in modules if now[m]]):
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
    hashes = making.module_hashes(modules)
    existing = [m for m in modules if hashes[m] is not None]
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
    path = checks.path("path", path, ".ipynb")
    notebook = read(path)
    making.code_cells(notebook)  # a notebook dict with cells, or a TypeError
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
    now = making.library_modules(notebook)
    pending, changed = _pending(record, sorted(set(now) | set(record["library_modules"])))
    return Status(path.name, record, (), tuple(pending), tuple(changed))
