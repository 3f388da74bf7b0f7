"""Helpers for the notebooks' output: glue numbers into the prose, format them, show progress.

:func:`glue` uses ``myst_nb.glue`` when MyST-NB is installed and otherwise writes
the same output (a display bundle with ``scrapbook`` metadata, as MyST-NB 1.x
does), so a GPU box without the book's tool chain still produces outputs that
``{glue}`` roles in the rendered book can read.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable
from typing import Any

__all__ = ["PLOT_STYLE", "fmt", "glue", "pct", "plot_style", "progress"]

GLUE_PREFIX = "application/papermill.record/"


def glue(name: str, value: Any, display: bool = False) -> None:
    """Record ``value`` under ``name`` for ``{glue}`name``` in the notebook's markdown."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name={name!r}: must be a non-empty string")
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        myst_glue = None
    if myst_glue is not None:
        myst_glue(name, value, display=display)
        return
    from IPython.core.formatters import format_display_data
    from IPython.display import display as ipy_display

    bundle, metadata = format_display_data(value)
    prefix = "" if display else GLUE_PREFIX
    metadata["scrapbook"] = {"name": name, "mime_prefix": prefix}
    ipy_display({prefix + key: item for key, item in bundle.items()}, raw=True, metadata=metadata)


def _number(value: Any, digits: int) -> float | None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        and not hasattr(value, "__float__")
    ):
        raise TypeError(f"value={value!r}: must be a number")
    if isinstance(digits, bool) or not isinstance(digits, int) or digits < 0:
        raise ValueError(f"digits={digits!r}: must be an integer >= 0")
    value = float(value)
    return value if math.isfinite(value) else None


def fmt(value: float, digits: int = 0) -> str:
    """A number as prose shows it: thousands separated, fixed digits; ``"n/a"`` for NaN or
    infinity."""
    number = _number(value, digits)
    return "n/a" if number is None else f"{number:,.{digits}f}"


def pct(value: float, digits: int = 0) -> str:
    """A ratio as a percentage: ``pct(0.794) == '79%'``; ``"n/a"`` for NaN or infinity."""
    number = _number(value, digits)
    return "n/a" if number is None else f"{100 * number:.{digits}f}%"


PLOT_STYLE = {
    "figure.dpi": 120,
    "savefig.dpi": 120,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "figure.autolayout": True,
}


def plot_style() -> None:
    """Matplotlib settings that keep figures legible at book width: 120 dpi, nothing under 9 pt,
    layouts that make room for labels. Every chapter calls it once, in its first cell."""
    import matplotlib

    matplotlib.rcParams.update(PLOT_STYLE)


def progress(iterable: Iterable, desc: str = "", total: int | None = None):
    """A tqdm progress bar for scripts; silent inside a notebook, whose outputs must not hold one.

    A Jupyter kernel forwards everything written to its standard streams, even the process's
    own file descriptors, into the cell's output, so no stream there reaches only a terminal.
    Set ``FP8LAB_PROGRESS=1`` to see the bar in a notebook anyway (it then lands in the output).
    """
    if total is not None:
        from fp8lab.checks import integer

        integer("total", total, minimum=0)
    if not isinstance(desc, str):
        raise TypeError(f"desc={desc!r}: must be a string")
    from tqdm.std import tqdm  # the text bar; tqdm.auto would draw a widget

    in_kernel = "ipykernel" in sys.modules and not os.environ.get("FP8LAB_PROGRESS")
    return tqdm(
        iterable,
        desc=desc,
        total=total,
        file=sys.stderr,
        mininterval=5,
        leave=False,
        disable=in_kernel,
    )
