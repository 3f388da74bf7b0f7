"""Chapter 07's figures: what is live at a step's peak, predicted against measured, and a
step's live bytes through time. Plotting only; the numbers come from :mod:`fp8lab.memory` and
from the measurements the chapter makes in its own cells.
"""

from __future__ import annotations

import textwrap

from fp8lab.memory.constants import FSDP2_BUFFERS
from fp8lab.parts import Part

__all__ = ["PART_COLORS", "draw_parts", "draw_timeline", "parity"]

GB = 1e9
PART_COLORS = {
    Part.PARAMETERS: "#4c72b0",
    Part.MASTER_WEIGHTS: "#64b5cd",
    Part.OPTIMIZER_STATES: "#8172b3",
    Part.GRADIENTS: "#ccb974",
    FSDP2_BUFFERS: "#a6a6d6",
    Part.FP8_WEIGHT_COPIES: "#dd8452",
    Part.AUTOCAST_COPIES: "#e6a57e",
    Part.ACTIVATIONS: "#55a868",
    Part.LOGITS: "#c44e52",
    Part.TEMPORARIES: "#937860",
    Part.SCALING_STATE: "#8c8c8c",
}


def draw_parts(ax, estimates: dict, title: str, gpus=("H100 SXM", "H200")) -> None:
    """Stacked bars of what is live at each estimate's peak (GB), with GPUs' memory lines."""
    from fp8lab import datasheet

    seen = set()
    for x, est in enumerate(estimates.values()):
        bottom = 0.0
        for part, color in PART_COLORS.items():
            size = est.at_peak.get(part, 0.0) / GB
            if size > 0:
                label = None if part in seen else part
                seen.add(part)
                ax.bar(x, size, bottom=bottom, color=color, width=0.6, label=label)
                bottom += size
        ax.text(x, bottom, f"{bottom:.0f}", ha="center", va="bottom", fontsize=8)
    for name in gpus:
        spec = datasheet.gpu_spec(name)
        ax.axhline(spec.memory_gb, color="0.4", lw=0.8, ls="--")
        ax.text(len(estimates) - 0.4, spec.memory_gb, spec.name, ha="left", va="bottom",
                fontsize=8, color="0.3")
    ax.set_xlim(-0.5, len(estimates) + 0.5)
    labels = ["\n".join(textwrap.fill(w, 9) for w in k.split("\n")) for k in estimates]
    ax.set_xticks(range(len(estimates)), labels, fontsize=8)
    ax.set_ylabel("live at the peak (GB)")
    ax.set_title(title)


def parity(ax, frame, groups, title: str) -> None:
    """Predicted against measured peaks (GiB, from ``measured_MiB``/``predicted_MiB``), with
    bands of 3% and 7%; ``groups``: ``[(label, marker, color, rows)]``."""
    import numpy as np

    top = 1.1 * frame[["measured_MiB", "predicted_MiB"]].max().max() / 1024
    line = np.array([0, top])
    ax.fill_between(line, 0.93 * line, 1.07 * line, color="0.92", label="±7%")
    ax.fill_between(line, 0.97 * line, 1.03 * line, color="0.82", label="±3%")
    ax.plot(line, line, color="0.3", lw=0.8)
    for label, marker, color, rows in groups:
        ax.scatter(rows["measured_MiB"] / 1024, rows["predicted_MiB"] / 1024, s=28,
                   marker=marker, color=color, label=label)
    ax.set(xlim=(0, top), ylim=(0, top), xlabel="measured peak (GiB)",
           ylabel="predicted peak (GiB)", title=title)
    ax.legend(fontsize=8, ncol=2, loc="upper left")


def draw_timeline(ax, curve, phase, names, unit: str, predicted=None) -> int:
    """Live bytes through one step (``curve``, in ``unit``), each event's phase shaded and
    named, the peak marked; ``predicted``: ``(value in unit, event)`` drawn as a line. Returns
    the index of the peak."""
    import numpy as np

    top = int(np.argmax(curve))
    for k, name in enumerate(names):
        where = np.flatnonzero(phase == k)
        if where.size:
            ax.axvspan(where[0], where[-1], color=_pastel(k), alpha=0.6, lw=0)
            ax.text((where[0] + where[-1]) / 2, 0.02, name, ha="center", fontsize=8,
                    transform=ax.get_xaxis_transform())
    ax.plot(curve, color="0.15", lw=1)
    ax.scatter([top], [curve[top]], color="#c44e52", zorder=3)
    ax.annotate(f"measured peak: {curve[top]:.2f} {unit}, {names[phase[top]]}",
                (top, curve[top]), xytext=(8, -4), textcoords="offset points", fontsize=8,
                va="top")
    if predicted is not None:
        value, event = predicted
        ax.axhline(value, color="#4c72b0", ls="--", lw=1)
        ax.text(0, value, f" predicted {value:.2f} {unit}: {event}", va="bottom", fontsize=8,
                color="#4c72b0")
    return top


def _pastel(k: int):
    import matplotlib.pyplot as plt

    return plt.cm.Pastel1(k)
