"""The FP8 recipes by one set of names, for every chapter, kit and tool.

``"bf16"`` (no FP8 recipe), ``"delayed"``, ``"current"``, ``"block"``, ``"mxfp8"`` and
``"nvfp4"``: each name has the label a table shows (:data:`LABELS`) and, for FP8, its class in
``transformer_engine.common.recipe`` (:data:`CLASSES`, the CPU reference has the same).
:func:`make` builds the recipe object from that module, so that no kit keeps a table of its own.
"""

from __future__ import annotations

from typing import Any

from fp8lab import checks

__all__ = ["CLASSES", "LABELS", "NAMES", "label", "make"]

LABELS = {"bf16": "BF16", "delayed": "FP8 delayed", "current": "FP8 current",
          "block": "FP8 block", "mxfp8": "MXFP8", "nvfp4": "NVFP4"}
NAMES = tuple(LABELS)
CLASSES = {"delayed": "DelayedScaling", "current": "Float8CurrentScaling",
           "block": "Float8BlockScaling", "mxfp8": "MXFP8BlockScaling",
           "nvfp4": "NVFP4BlockScaling"}


def label(name: str) -> str:
    """What a table shows for the recipe ``name`` (``"delayed"`` -> ``"FP8 delayed"``)."""
    return LABELS[checks.choice("name", name, NAMES)]


def make(recipe_module: Any, name: str, **overrides: Any):
    """The recipe ``name`` built from ``recipe_module`` (the second value of
    :func:`fp8lab.import_te`) with ``overrides`` (``amax_history_len=16``, ``fp8_dpa=True``,
    ...); ``None`` for ``"bf16"``, which takes none."""
    checks.choice("name", name, NAMES)
    if name == "bf16":
        if overrides:
            raise ValueError(f"overrides={sorted(overrides)}: 'bf16' has no recipe to set")
        return None
    cls = getattr(recipe_module, CLASSES[name], None)
    if not callable(cls):
        raise TypeError(f"recipe_module={checks.show(recipe_module)} has no {CLASSES[name]}: "
                        "pass the recipe module, the second value of fp8lab.import_te()")
    return cls(**overrides)
