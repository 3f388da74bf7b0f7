"""The chapter's own code, loaded from the chapter: what the long runs execute is what the page
shows.

The model, the recipes, the training step, the calibration pass and the graph capture of
chapter 09 are written out in its notebook, in code cells tagged ``worker``; the same model in
plain PyTorch (for torchao) in cells tagged ``worker-torch``. The long runs
(``python -m tools.train_e2e``) and the speed rounds (``python -m tools.e2e_speed``) execute
exactly those cells (:func:`load`), and their result files carry a hash of the cells they use
(:func:`source_sha256`: TE's settings the ``worker`` cells, PyTorch's both), so that a result
made by other code than the page shows is caught, and the TE runs stay valid when only the
PyTorch cells change.
"""

from __future__ import annotations

import hashlib
import json
import types
from pathlib import Path

from fp8lab import checks

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "09_end_to_end.ipynb"
TAG = "worker"
TORCH_TAG = "worker-torch"
TE_CELLS = (TAG,)
TORCH_CELLS = (TAG, TORCH_TAG)

_loaded: dict[str, types.ModuleType] = {}


def _path(notebook) -> Path:
    if isinstance(notebook, bool) or not isinstance(notebook, (str, Path)):
        raise TypeError(f"notebook={checks.show(notebook)}: must be a notebook path")
    path = Path(notebook)
    if not path.is_file():
        raise ValueError(f"notebook={str(path)!r}: no such file")
    return path


def _tags(tags) -> tuple[str, ...]:
    if isinstance(tags, str) or not all(isinstance(t, str) for t in tags) or not tags:
        raise TypeError(f"tags={checks.show(tags)}: must be a non-empty tuple of tag names")
    return tuple(tags)


def source(notebook: Path | str = NOTEBOOK, tags=TE_CELLS) -> str:
    """The code of the notebook's cells tagged with any of ``tags``, in order, one blank line
    apart."""
    tags = _tags(tags)
    cells = json.loads(_path(notebook).read_text())["cells"]
    parts = [
        "".join(cell["source"]).rstrip() + "\n"
        for cell in cells
        if cell["cell_type"] == "code"
        and set(tags) & set(cell.get("metadata", {}).get("tags", []))
    ]
    if not parts:
        raise ValueError(f"notebook={str(notebook)!r}: has no code cell tagged {tags!r}")
    return "\n\n".join(parts)


def source_sha256(notebook: Path | str = NOTEBOOK, tags=TE_CELLS) -> str:
    """SHA-256 of :func:`source`."""
    return hashlib.sha256(source(notebook, tags).encode()).hexdigest()


def load(notebook: Path | str = NOTEBOOK) -> types.ModuleType:
    """The worker cells of both kinds executed as one module (once per process and notebook)."""
    key = str(_path(notebook).resolve())
    if key not in _loaded:
        module = types.ModuleType("e2e_worker", "chapter 09's worker cells")
        code = source(notebook, TORCH_CELLS)
        exec(compile(code, f"{key}[worker cells]", "exec"), module.__dict__)
        _loaded[key] = module
    return _loaded[key]
