"""The roofline model (Williams et al. 2009): attainable rate against arithmetic intensity.

A kernel doing W FLOPs over Q bytes of memory traffic has intensity I = W / Q and runs no
faster than ``min(P, I * beta)`` for a peak rate P and bandwidth beta. The ridge point
``P / beta`` is the intensity above which the kernel is compute-bound. Chapters 00 and 04
draw their measured products on the same plot, through :func:`plot_roofline`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Real

from fp8lab import checks

__all__ = ["Roof", "attainable_tflops", "plot_roofline", "ridge_point"]

ROOF_COLORS = {"bf16": "tab:blue", "fp8": "tab:orange", "fp32": "tab:green", "fp16": "tab:purple"}


def ridge_point(peak_tflops: float, bandwidth_gbs: float) -> float:
    """FLOP per byte at which ``peak_tflops`` and ``bandwidth_gbs`` meet."""
    peak = checks.number("peak_tflops", peak_tflops, positive=True)
    bandwidth = checks.number("bandwidth_gbs", bandwidth_gbs, positive=True)
    return peak * 1e12 / (bandwidth * 1e9)


def attainable_tflops(intensity: float, peak_tflops: float, bandwidth_gbs: float) -> float:
    """``min(peak, intensity * bandwidth)`` in TFLOP/s."""
    intensity = checks.number("intensity", intensity, positive=True)
    peak = checks.number("peak_tflops", peak_tflops, positive=True)
    bandwidth = checks.number("bandwidth_gbs", bandwidth_gbs, positive=True)
    return min(peak, intensity * bandwidth / 1e3)


class Roof:
    """One roof to draw: a name, its peak (TFLOP/s) and bandwidth (GB/s), and a line style."""

    def __init__(
        self,
        name: str,
        peak_tflops: float,
        bandwidth_gbs: float,
        *,
        color: str = "tab:blue",
        dashed: bool = False,
    ):
        if not isinstance(name, str):
            raise TypeError(f"name={name!r}: must be a string")
        self.name, self.color, self.dashed = name, color, checks.flag("dashed", dashed)
        self.peak_tflops = checks.number("peak_tflops", peak_tflops, positive=True)
        self.bandwidth_gbs = checks.number("bandwidth_gbs", bandwidth_gbs, positive=True)

    @property
    def ridge(self) -> float:
        return ridge_point(self.peak_tflops, self.bandwidth_gbs)


def _check_series(series, values) -> None:
    """One series of points: as many intensities as rates (and labels), each a number > 0 (a
    log-log plot has no place for zero or a negative) or NaN (a point not measured, not drawn)."""
    columns = ("intensities", "tflops", "labels")[: len(values)]
    lengths = {}
    for column, value in zip(columns, values, strict=True):
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
            raise TypeError(
                f"points[{series!r}] {column}={checks.show(value)}: must be a sequence"
            )
        lengths[column] = len(value)
    if len(set(lengths.values())) > 1:
        counts = ", ".join(f"{count} {column}" for column, count in lengths.items())
        raise ValueError(f"points[{series!r}]: one point per intensity, not {counts}")
    for column, numbers in zip(columns[:2], values[:2], strict=True):
        for index, value in enumerate(numbers):
            name = f"points[{series!r}] {column}[{index}]"
            if not (isinstance(value, Real) and math.isnan(value)):
                checks.number(name, value, positive=True)


def _check_plot_arguments(roofs, points, point_colors, intensity_range) -> None:
    """The containers :func:`plot_roofline` takes: a TypeError names the argument of the wrong
    kind."""
    if not isinstance(roofs, (list, tuple)) or not all(isinstance(r, Roof) for r in roofs):
        raise TypeError(f"roofs must be a list of Roof, not {type(roofs).__name__}")
    if not roofs:
        raise ValueError("roofs: give at least one Roof")
    if points is not None:
        if not isinstance(points, Mapping):
            raise TypeError(
                f"points must map a series name to (intensities, tflops), "
                f"not {type(points).__name__}"
            )
        for series, values in points.items():
            if not isinstance(values, (list, tuple)) or len(values) not in (2, 3):
                raise TypeError(
                    f"points[{series!r}] must be (intensities, tflops) or (intensities, tflops, "
                    f"labels), not {type(values).__name__}"
                )
            _check_series(series, values)
    if point_colors is not None and not isinstance(point_colors, Mapping):
        raise TypeError(
            f"point_colors must map a series name to a colour, not {type(point_colors).__name__}"
        )
    if not isinstance(intensity_range, (list, tuple)) or len(intensity_range) != 2:
        raise TypeError(f"intensity_range={intensity_range!r}: must be a (low, high) pair")


def plot_roofline(
    ax,
    roofs: Sequence[Roof],
    points: Mapping[str, tuple] | None = None,
    *,
    intensity_range: tuple[float, float] = (1.0, 2e4),
    title: str = "",
    label_points: bool = False,
    point_colors: Mapping[str, str] | None = None,
):
    """Draw ``roofs`` on a log-log ``ax`` and place ``points``.

    ``points`` maps a series name to ``(intensities, tflops)`` or ``(intensities, tflops, labels)``,
    one intensity per rate (and label), each > 0 or NaN (not measured: not drawn); with
    ``label_points`` each point gets its label, offset so that neighbours do not overlap.
    """
    import numpy as np

    _check_plot_arguments(roofs, points, point_colors, intensity_range)
    checks.flag("label_points", label_points)
    low, high = intensity_range
    checks.number("intensity_range[0]", low, positive=True)
    if checks.number("intensity_range[1]", high, positive=True) <= low:
        raise ValueError(f"intensity_range={intensity_range}: the upper end must exceed the lower")
    x = np.logspace(np.log10(low), np.log10(high), 200)
    for roof in roofs:
        ax.plot(
            x,
            np.minimum(roof.peak_tflops, x * roof.bandwidth_gbs / 1e3),
            "--" if roof.dashed else "-",
            color=roof.color,
            alpha=0.55 if roof.dashed else 1.0,
            label=roof.name,
        )
    for series, values in (points or {}).items():
        intensities, rates = values[0], values[1]
        color = (point_colors or {}).get(series, ROOF_COLORS.get(series, "black"))
        ax.scatter(intensities, rates, color=color, s=22, zorder=3, label=f"{series} (measured)")
        if label_points and len(values) > 2:
            for i, (xi, yi, text) in enumerate(zip(intensities, rates, values[2], strict=True)):
                ax.annotate(
                    text,
                    (xi, yi),
                    fontsize=8,
                    xytext=(4, -10 if i % 2 else 4),
                    textcoords="offset points",
                )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (FLOP/byte)",
        ylabel="TFLOP/s",
        title=title,
    )
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return ax
