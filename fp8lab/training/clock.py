"""The clocks of a training step: its time on the device and its peak memory.

:class:`StepClock` times one step with CUDA events on a GPU (the whole step, and the optimizer
alone) and reads the peak of ``torch.cuda.max_memory_allocated`` over it; on a CPU it reads
``time.perf_counter``. :func:`time_step` repeats :func:`fp8lab.training.train_step` into a
:class:`fp8lab.speedometer.Timing`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch

from fp8lab import checks
from fp8lab.training.state import StepOptions


class StepClock:
    """Started at construction; :meth:`optimizer_starts` marks the hand-over to the optimizer;
    :meth:`stop` waits for the device once and returns ``(step_ms, optimizer_ms, peak)``."""

    def __init__(self, device: torch.device, measure_peak: bool):
        self.device, self.measure_peak = device, measure_peak
        self.cuda = device.type == "cuda"
        if self.cuda:
            if measure_peak:
                torch.cuda.reset_peak_memory_stats(device)
            self.events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            self.events[0].record()
        else:
            self.clock = [time.perf_counter()]

    def optimizer_starts(self) -> None:
        if self.cuda:
            self.events[1].record()
        else:
            self.clock.append(time.perf_counter())

    def stop(self) -> tuple[float, float, int | None]:
        if not self.cuda:
            self.clock.append(time.perf_counter())
            start, handover, end = self.clock
            return (end - start) * 1e3, (end - handover) * 1e3, None
        start, handover, end = self.events
        end.record()
        end.synchronize()
        step_ms = start.elapsed_time(end)
        optimizer_ms = min(handover.elapsed_time(end), step_ms)
        peak = int(torch.cuda.max_memory_allocated(self.device)) if self.measure_peak else None
        return step_ms, optimizer_ms, peak


def time_step(
    model: torch.nn.Module,
    micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    *,
    te=None,
    fp8_recipe=None,
    options: StepOptions | None = None,
    loss_fn=None,
    warmup: int = 3,
    iters: int = 10,
    label: str = "step",
):
    """Repeat :func:`~fp8lab.training.train_step` on the same micro-batches; return a
    :class:`fp8lab.speedometer.Timing` of the step times (median, spread), with the peak memory
    over the timed steps and, in ``extra``, the median optimizer time and the step count N.

    The model trains while it is timed (the weights change every step), as it would in a run.
    """
    from fp8lab.speedometer import Timing
    from fp8lab.training.step import train_step

    checks.integer("warmup", warmup, minimum=0)
    checks.integer("iters", iters)
    if not isinstance(label, str):
        raise TypeError(f"label={label!r}: must be a string")
    kwargs = {"te": te, "fp8_recipe": fp8_recipe, "options": options, "loss_fn": loss_fn}
    for _ in range(warmup):
        train_step(model, micro_batches, optimizer, **kwargs)
    results = [train_step(model, micro_batches, optimizer, **kwargs) for _ in range(iters)]
    peaks = [r.peak_memory_bytes for r in results if r.peak_memory_bytes is not None]
    return Timing(
        label=label,
        times_ms=tuple(r.step_ms for r in results),
        device=str(next(model.parameters()).device),
        mode="step",
        warmup=warmup,
        grads_zeroed=True,
        peak_memory_bytes=max(peaks) if peaks else None,
        extra={
            "optimizer_ms": statistics.median(r.optimizer_ms for r in results),
            "micro_batches": results[0].micro_batches,
            "loss": results[-1].loss,
        },
    )
