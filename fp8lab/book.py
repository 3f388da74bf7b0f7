"""Helpers for the notebooks' output: glue numbers and verdicts into the prose, format them and
the tables, show progress.

:func:`glue` writes what ``myst_nb.glue`` writes (a display bundle with ``scrapbook``
metadata, as MyST-NB 1.x does), so a GPU box without the book's tool chain still produces
outputs that ``{glue}`` roles in the rendered book can read; :func:`glue_verdict` adds a
verdict's facts to it.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from IPython.core.formatters import format_display_data
from IPython.display import display as ipy_display

from fp8lab import checks

# IPython raises the interpreter's recursion limit when it is first imported; importing it here,
# with the module, keeps that change out of whatever later calls glue (a property-test run, say).

__all__ = ["PLOT_STYLE", "fmt", "glue", "glue_verdict", "pct", "plot_style", "progress", "table"]

GLUE_PREFIX = "application/papermill.record/"
_NOTHING = object()


def glue(name: str | None = None, value: Any = _NOTHING, display: bool = False, **values) -> None:
    """Record values for ``{glue}`name``` in the notebook's markdown: ``glue("x", 3)`` one,
    ``glue(x=3, y="fast")`` several (none of them displayed)."""
    if name is None and value is _NOTHING:
        if not values:
            raise TypeError("glue: give a name and a value, or name=value pairs")
        checks.flag("display", display)
        for key, item in values.items():
            _glue_one(key, item, display)
        return
    if value is _NOTHING or values:
        raise TypeError("glue: give a name and a value, or name=value pairs, not both")
    _glue_one(name, value, display)


def _glue_one(name: str, value: Any, display: bool, record: dict | None = None) -> None:
    """One glued value, written as MyST-NB 1.x writes it (a display bundle with ``scrapbook``
    metadata), with ``record`` (a verdict's facts) kept beside it under ``fp8lab``."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name={name!r}: must be a non-empty string")
    bundle, metadata = format_display_data(value)
    prefix = "" if display else GLUE_PREFIX
    metadata["scrapbook"] = {"name": name, "mime_prefix": prefix}
    if record is not None:
        metadata["fp8lab"] = record
    ipy_display({prefix + key: item for key, item in bundle.items()}, raw=True, metadata=metadata)


def glue_verdict(name: str, verdict: Any, text: str | None = None) -> Any:
    """Glue a verdict of :mod:`fp8lab.protocol` (a ``Comparison`` or a ``Paired``) as
    ``text`` (default: its ``phrase()``), keeping its ``record()`` with it, so that a re-run of
    the chapter in another GPU session can list what flipped (``python -m tools.lane
    verdicts``). A comparison that flipped in such a re-run is judged against its own floor
    (:func:`fp8lab.protocol.judged`); the verdict as glued is returned, for tables to show."""
    if not callable(getattr(verdict, "record", None)) or not callable(
        getattr(verdict, "phrase", None)
    ):
        raise TypeError(
            f"verdict: must be a protocol Comparison or Paired, not {type(verdict).__name__}"
        )
    if text is not None and not isinstance(text, str):
        raise TypeError(f"text={checks.show(text)}: must be a string")
    from fp8lab.protocol import judged  # here: the protocol package imports torch

    verdict = judged(name, verdict)
    _glue_one(name, verdict.phrase() if text is None else text, False, verdict.record())
    return verdict


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


def table(
    frame,
    formats: Mapping[str, str] | str | None = None,
    *,
    caption: str | None = None,
    index: bool = True,
    missing: str = "—",
):
    """A pandas table as the book shows it: ``formats`` (one format string, or one per column;
    columns not named keep pandas' own), ``missing`` for NaN, an optional caption, the index
    shown or hidden. The page's CSS spaces the columns and lets a wide table scroll."""
    import pandas as pd

    if not isinstance(frame, (pd.DataFrame, pd.Series)):
        raise TypeError(f"frame must be a pandas DataFrame, not {type(frame).__name__}")
    frame = frame.to_frame() if isinstance(frame, pd.Series) else frame
    if formats is not None and not isinstance(formats, (str, Mapping)):
        raise TypeError(f"formats={formats!r}: must be a format string or a dict of them")
    if isinstance(formats, Mapping):
        unknown = [column for column in formats if column not in frame.columns]
        if unknown:
            raise ValueError(f"formats: no column {unknown} in the table")
    for name, text in (("caption", caption), ("missing", missing)):
        if text is not None and not isinstance(text, str):
            raise TypeError(f"{name}={text!r}: must be a string")
    checks.flag("index", index)
    styled = frame.style.format(formats, na_rep=missing)
    styled = styled.set_table_attributes('class="fp8lab-table"')
    if caption:
        styled = styled.set_caption(caption)
    return styled if index else styled.hide(axis="index")


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
        checks.integer("total", total, minimum=0)
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
