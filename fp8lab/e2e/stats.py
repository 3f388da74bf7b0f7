"""Reading chapter 09's runs for accuracy: validation losses by seed, the margin in compute
terms, and how many BF16 steps reach a given loss.

The margin is declared as a share of the training compute: an FP8 setting is within it when
BF16 reaches the FP8 run's final loss with at most that share fewer steps. :func:`compute_margin`
turns the share into nats on BF16's own runs (the validation loss BF16 still gains over that
last share of its steps, mean over seeds); the paired check itself is the protocol's
(:func:`fp8lab.protocol.paired`). :func:`bf16_steps_to` reads BF16's mean validation curve
backwards: the step at which it reached a given loss, so that a difference in nats can be
stated as steps of BF16 training.
"""

from __future__ import annotations

import math

import numpy as np

from fp8lab import checks


def validation_at(record: dict, step: int) -> float | None:
    """The validation loss a result record measured after ``step`` steps, or None."""
    validation = record.get("validation") or {}
    for at, value in zip(validation.get("step", []), validation.get("loss", []), strict=True):
        if at == step and value is not None and math.isfinite(value):
            return value
    return None


def _runs(runs) -> list[dict]:
    if not isinstance(runs, (list, tuple)) or not all(isinstance(r, dict) for r in runs):
        raise TypeError(f"runs={checks.show(runs)}: must be a list of result records")
    return list(runs)


def by_seed(runs, setting: str, step: int | None = None) -> dict[int, float]:
    """``{seed: validation loss}`` of ``setting``'s runs after ``step`` (default: each run's
    last evaluation); runs with an error are left out."""
    found = {}
    for run in _runs(runs):
        if run["setting"] != setting or run.get("error"):
            continue
        at = step if step is not None else run["validation"]["step"][-1]
        value = validation_at(run, at)
        if value is not None:
            found[run["seed"]] = value
    return found


def mean_curve(runs, setting: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, mean validation loss)`` of ``setting`` over its seeds, at the evaluation
    points every seed measured."""
    mine = [r for r in _runs(runs) if r["setting"] == setting and not r.get("error")]
    if not mine:
        raise ValueError(f"setting={setting!r}: no run without an error")
    steps = sorted(set.intersection(*(set(r["validation"]["step"]) for r in mine)))
    losses = [[validation_at(r, s) for r in mine] for s in steps]
    keep = [i for i, row in enumerate(losses) if None not in row]
    return (np.array([steps[i] for i in keep]),
            np.array([float(np.mean(losses[i])) for i in keep]))


def before_end(runs, share: float, baseline: str = "bf16") -> int:
    """The step ``share`` of ``baseline``'s planned steps before their end, as
    :meth:`~fp8lab.e2e.settings.Plan.before_end` gives it, from the runs' own length (committed
    full-size runs read under the smoke preset keep theirs)."""
    share = checks.number("share", share, positive=True, maximum=0.5)
    mine = [r for r in _runs(runs) if r["setting"] == baseline and not r.get("error")]
    if not mine:
        raise ValueError(f"baseline={baseline!r}: no run without an error")
    last = mine[0]["steps_planned"]
    return last - max(1, round(share * last))


def compute_margin(runs, share: float, baseline: str = "bf16") -> dict:
    """The margin of a compute ``share`` (e.g. 0.05) in nats: ``baseline``'s validation loss
    at ``(1 - share)`` of its steps minus at the end, paired by seed and averaged. Returns
    ``{"share", "from_step", "to_step", "nats", "seeds"}``."""
    share = checks.number("share", share, positive=True, maximum=0.5)
    mine = [r for r in _runs(runs) if r["setting"] == baseline and not r.get("error")]
    if not mine:
        raise ValueError(f"baseline={baseline!r}: no run to read the margin from")
    last = mine[0]["steps_planned"]
    start = before_end(mine, share, baseline)
    early, end = by_seed(mine, baseline, start), by_seed(mine, baseline, last)
    seeds = sorted(set(early) & set(end))
    if not seeds:
        raise ValueError(f"no {baseline} run measured both step {start} and step {last}")
    nats = float(np.mean([early[s] - end[s] for s in seeds]))
    if not nats > 0:
        raise ValueError(f"{baseline} gained {nats:+.4f} nats from step {start} to {last}: "
                         "no compute margin can be read from a curve that does not descend")
    return {"share": share, "from_step": start, "to_step": last, "nats": nats,
            "seeds": len(seeds)}


def bf16_steps_to(runs, loss: float, baseline: str = "bf16") -> float | None:
    """The step at which ``baseline``'s mean validation curve first reached ``loss`` (linear
    between evaluation points), or None if it never did."""
    loss = checks.number("loss", loss)
    steps, curve = mean_curve(runs, baseline)
    for i in range(1, len(steps)):
        if curve[i] <= loss <= curve[i - 1]:
            span = curve[i - 1] - curve[i]
            part = 0.0 if span == 0 else (curve[i - 1] - loss) / span
            return float(steps[i - 1] + part * (steps[i] - steps[i - 1]))
    return None
