"""The estimate's peaks under the phases a measurement can mark: one definition for both sides.

A measurement of a training step (``tools/memory_check``) marks phases with hooks: a forward
pre-hook and a forward hook on the model, a pre- and a post-hook on the optimizer's ``step``.
Between them lie, for each step: ``model forward`` (the model's forward, up to its output
logits), ``loss and backward`` (the loss, the backward, and the gradient bookkeeping until the
optimizer starts) and ``optimizer step``; ``build`` is building the model. The estimator's own
timeline names the loss under the forward; :func:`phase_peaks` regroups its events under the
measured phases, so a per-phase error compares like with like.
"""

from __future__ import annotations

from fp8lab.memory.estimator import MemoryEstimate

__all__ = ["MEASURED_PHASES", "measured_phase", "phase_peaks"]

# The phases hooks can mark in each step, in order.
MEASURED_PHASES = ("model forward", "loss and backward", "optimizer step")
# The last forward events of the timeline: the logits exist when the model's forward returns;
# what follows them (the loss) runs after the forward hook.
_AFTER_MODEL_FORWARD = ("loss (FP32 logits)", "end")


def measured_phase(event: str) -> str:
    """The measured phase of a timeline event (``"step 2, backward: LM head"`` ->
    ``"step 2 loss and backward"``; the model's build -> ``"build"``)."""
    if not isinstance(event, str) or ": " not in event:
        raise ValueError(f"event={event!r}: must be a timeline event, '<phase>: <what>'")
    where, what = event.split(": ", 1)
    if where == "build":
        return "build"
    parts = where.split(", ")
    step, phase = parts[0], parts[-1]
    if not step.startswith("step ") or phase not in ("forward", "backward", "optimizer step"):
        raise ValueError(f"event={event!r}: not an event of a simulated training step")
    if phase == "forward":
        phase = "loss and backward" if what in _AFTER_MODEL_FORWARD else "model forward"
    elif phase == "backward":
        phase = "loss and backward"
    return f"{step} {phase}"


def phase_peaks(est: MemoryEstimate) -> dict[str, float]:
    """The largest predicted total (bytes) in each measured phase, keyed as a measurement keys
    them: ``"build"``, ``"step 1 model forward"``, ..., ``"step 2 optimizer step"``."""
    if not isinstance(est, MemoryEstimate):
        raise TypeError(f"est must be a memory.MemoryEstimate, not {type(est).__name__}")
    peaks: dict[str, float] = {}
    for event, total in est.timeline:
        phase = measured_phase(event)
        peaks[phase] = max(peaks.get(phase, 0.0), total)
    return peaks
