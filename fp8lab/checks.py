"""Input checks shared by every public entry point of fp8lab.

Each check raises ``TypeError`` (wrong kind of value) or ``ValueError`` (right kind, outside
the rule) with a message that names the argument, its value and the rule, for example
``peak_tflops=nan: must be a finite number > 0``. Booleans are not integers here, NaN and
infinity are not numbers a size or a rate can take, and strings are not flags: each of
these is a common way for a wrong answer to pass silently.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["choice", "flag", "integer", "number", "path", "probability", "show", "tensor"]


def show(value: Any) -> str:
    """``repr(value)``, cut to 60 characters, for error messages."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def integer(name: str, value: Any, minimum: int | None = 1, maximum: int | None = None) -> int:
    """An ``int`` (not a bool) in ``[minimum, maximum]``; ``minimum=1`` by default."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}={show(value)}: must be an integer, not {type(value).__name__}")
    value = int(value)
    if minimum is not None and value < minimum:
        rule = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name}={value}: must be {rule}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}={value}: must be an integer <= {maximum}")
    return value


def number(
    name: str,
    value: Any,
    *,
    positive: bool = False,
    non_negative: bool = False,
    maximum: float | None = None,
) -> float:
    """A finite real number (not a bool), optionally ``> 0`` or ``>= 0`` and ``<= maximum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}={show(value)}: must be a number, not {type(value).__name__}")
    value = float(value)
    rule = "a finite number" + (" > 0" if positive else " >= 0" if non_negative else "")
    if not math.isfinite(value) or (positive and value <= 0) or (non_negative and value < 0):
        raise ValueError(f"{name}={value}: must be {rule}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}={value}: must be {rule} and <= {maximum}")
    return value


def probability(name: str, value: Any) -> float:
    """A dropout-style probability in ``[0, 1)``."""
    value = number(name, value)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name}={value}: must be in [0, 1)")
    return value


def flag(name: str, value: Any) -> bool:
    """A real ``bool``: ``"no"``, ``0`` or ``None`` are refused rather than read as true or
    false."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}={show(value)}: must be True or False, not {type(value).__name__}")
    return value


def choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """One of ``choices`` (compared by equality, with the type checked first for strings)."""
    choices = tuple(choices)
    if all(isinstance(c, str) for c in choices) and not isinstance(value, str):
        raise TypeError(f"{name}={show(value)}: must be one of {', '.join(map(repr, choices))}")
    if isinstance(value, bool) and not any(isinstance(c, bool) for c in choices):
        raise TypeError(f"{name}={show(value)}: must be one of {', '.join(map(repr, choices))}")
    try:
        known = value in choices
    except TypeError:  # an unhashable or incomparable value
        known = False
    if not known:
        raise ValueError(f"{name}={show(value)}: must be one of {', '.join(map(repr, choices))}")
    return value


def path(name: str, value: Any, suffix: str = "") -> Path:
    """An existing file or folder (a ``str`` or ``Path``), ending in ``suffix`` where given."""
    if isinstance(value, bool) or not isinstance(value, (str, Path)) or not str(value):
        raise TypeError(f"{name}={show(value)}: must be a file path")
    found = Path(value)
    if not found.exists() or (suffix and found.suffix != suffix):
        raise ValueError(f"{name}={str(found)!r}: no such {suffix or 'file'}")
    return found


def tensor(name: str, value: Any, *, dims: int | None = None, floating: bool | None = None):
    """A ``torch.Tensor``, optionally of ``dims`` dimensions and a floating (or integer) dtype."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(value).__name__}")
    if dims is not None and value.dim() != dims:
        raise ValueError(f"{name} has shape {tuple(value.shape)}: must have {dims} dimensions")
    if floating is True and not value.is_floating_point():
        raise TypeError(f"{name} has dtype {value.dtype}: must be a floating-point tensor")
    if floating is False and (
        value.is_floating_point() or value.is_complex() or value.dtype == torch.bool
    ):
        raise TypeError(f"{name} has dtype {value.dtype}: must be an integer tensor")
    return value
