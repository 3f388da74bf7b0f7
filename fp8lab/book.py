"""Helpers for the notebooks' prose: glue numbers from the run into the text.

:func:`glue` uses ``myst_nb.glue`` when MyST-NB is installed and otherwise writes
the same output (a display bundle with ``scrapbook`` metadata, as MyST-NB 1.x
does), so a GPU box without the book's tool chain still produces outputs that
``{glue}`` roles in the rendered book can read.
"""

from __future__ import annotations

from typing import Any

GLUE_PREFIX = "application/papermill.record/"


def glue(name: str, value: Any, display: bool = False) -> None:
    """Record ``value`` under ``name`` for ``{glue}`name``` in the notebook's markdown."""
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


def fmt(value: float, digits: int = 0) -> str:
    """A number as prose shows it: thousands separated, fixed digits."""
    return f"{value:,.{digits}f}"


def pct(value: float, digits: int = 0) -> str:
    """A ratio as a percentage: ``pct(0.794) == '79%'``."""
    return f"{100 * value:.{digits}f}%"
