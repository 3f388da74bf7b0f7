"""Time a module or any callable the way the chapters compare things: warm-up, many runs, median.

Modelled on Transformer Engine's tutorial helper (``docs/examples/quickstart_utils.py``,
``speedometer``) but returning a :class:`Timing` with every per-iteration time, so a
notebook can show the median *and* the spread, and derive tokens/s, TFLOP/s and MFU.

How it measures:

* on the book's one clock (:class:`Clock`): CUDA events mark the end of each iteration on a
  GPU, and the host synchronizes once after warm-up and once at the end, never in between,
  so the GPU queue stays full as in training; ``time.perf_counter`` on a CPU.

Modes: ``"forward"`` (under ``torch.no_grad``), ``"forward_backward"``
(``out.backward(grad_output)`` with a fixed random ``grad_output``) and ``"step"``
(forward, backward, ``optimizer.step()``). Gradients are set to ``None`` between
iterations unless ``zero_grad=False`` (then they accumulate, as with gradient
accumulation); the result records which.

**Spread**, everywhere in the book, is the interquartile range over the median
(``(Q3 - Q1) / median`` of the per-iteration times): robust to the odd slow iteration that a
max-min range would report. Round-to-round variation of medians (tools/speedometer_check.py)
is a different quantity and is named as such where it is shown.

Known limits: one iteration is timed as a whole (no per-kernel breakdown; use the
PyTorch profiler for that); the first ``warmup`` iterations are discarded, which
must cover cuBLAS/cuDNN autotuning and TE's first-call set-up.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fp8lab import checks
from fp8lab.devices import resolve_device

__all__ = ["MODES", "CallTimes", "Clock", "Timing", "speedometer", "time_callable", "time_calls"]

MODES = ("forward", "forward_backward", "step")


@dataclass(frozen=True)
class Timing:
    """Per-iteration times of one configuration, with summary statistics and derived rates."""

    label: str
    times_ms: tuple[float, ...]
    device: str
    mode: str = "callable"
    warmup: int = 0
    grads_zeroed: bool | None = None
    tokens: int | None = None
    flops: float | None = None
    peak_tflops: float | None = None
    peak_memory_bytes: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.label, str):
            raise TypeError(f"label={self.label!r}: must be a string")
        if not isinstance(self.times_ms, tuple) or not self.times_ms:
            raise TypeError(f"times_ms={self.times_ms!r}: must be a non-empty tuple of times in ms")
        for value in self.times_ms:
            checks.number("times_ms[i]", value, non_negative=True)

    @property
    def iters(self) -> int:
        return len(self.times_ms)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.times_ms)

    @property
    def min_ms(self) -> float:
        return min(self.times_ms)

    @property
    def max_ms(self) -> float:
        return max(self.times_ms)

    @property
    def stdev_ms(self) -> float:
        return statistics.stdev(self.times_ms) if self.iters > 1 else 0.0

    @property
    def spread(self) -> float:
        """Interquartile range over the median, ``(Q3 - Q1) / median`` (0.01 = 1%); 0 for one
        run."""
        if self.iters < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.times_ms, n=4)
        return (q3 - q1) / self.median_ms

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.tokens is None else self.tokens / (self.median_ms * 1e-3)

    @property
    def tflops(self) -> float | None:
        return None if self.flops is None else self.flops / (self.median_ms * 1e-3) / 1e12

    @property
    def mfu(self) -> float | None:
        """:func:`fp8lab.flops.mfu` of this timing: model FLOPs utilisation when ``flops`` are model
        FLOPs."""
        if self.flops is None or self.peak_tflops is None:
            return None
        from fp8lab.flops import mfu

        return mfu(self.flops, self.median_ms * 1e-3, self.peak_tflops)

    def summary(self) -> dict[str, Any]:
        """A flat dict, ready for a pandas row."""
        row = {
            "label": self.label,
            "mode": self.mode,
            "median_ms": self.median_ms,
            "mean_ms": self.mean_ms,
            "min_ms": self.min_ms,
            "max_ms": self.max_ms,
            "spread": self.spread,
            "iters": self.iters,
        }
        for name in ("tokens_per_s", "tflops", "mfu"):
            value = getattr(self, name)
            if value is not None:
                row[name] = value
        if self.peak_memory_bytes is not None:
            row["peak_memory_MiB"] = self.peak_memory_bytes / 2**20
        return row

    def __str__(self) -> str:
        text = (
            f"{self.label}: {self.median_ms:.3f} ms median ({self.iters} runs, "
            f"spread {self.spread:.1%})"
        )
        if self.tflops is not None:
            text += f", {self.tflops:.1f} TFLOP/s"
        if self.mfu is not None:
            text += f", MFU {self.mfu:.1%}"
        return text


def _check_counts(warmup: int, iters: int) -> None:
    checks.integer("iters", iters)
    checks.integer("warmup", warmup, minimum=0)


def _check_timing_arguments(fn, warmup, iters, label, measure_memory, min_warmup_ms, fields):
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    _check_counts(warmup, iters)
    checks.number("min_warmup_ms", min_warmup_ms, non_negative=True)
    if not isinstance(label, str):
        raise TypeError(f"label={label!r}: must be a string")
    checks.flag("measure_memory", measure_memory)
    for name in ("tokens",):
        if fields.get(name) is not None:
            checks.integer(name, fields[name])
    for name in ("flops", "peak_tflops"):
        if fields.get(name) is not None:
            checks.number(name, fields[name], positive=True)


def _warm_up(fn, warmup: int, min_warmup_ms: float, device: torch.device) -> None:
    cuda = device.type == "cuda"
    begin = time.perf_counter()
    done = 0
    while done < warmup or (time.perf_counter() - begin) * 1e3 < min_warmup_ms:
        fn()
        done += 1
        if cuda and done % 10 == 0 and min_warmup_ms:
            torch.cuda.synchronize(device)


class Clock:
    """The book's one clock, started when made: CUDA events on a GPU, ``time.perf_counter`` on a
    CPU. :meth:`mark` records a point (the end of a call, the hand-over to the optimizer);
    :meth:`read` waits for the device once and returns the ms between consecutive points;
    :attr:`host_ms` is the host's own time to the last point (to issue the work, on a GPU)."""

    def __init__(self, device: torch.device | str | None = None):
        self.device = resolve_device(device, default=True)
        self.cuda, self._events, self._host = self.device.type == "cuda", [], []
        self.mark()

    def mark(self) -> None:
        self._host.append(time.perf_counter())
        if self.cuda:
            self._events.append(torch.cuda.Event(enable_timing=True))
            self._events[-1].record()

    def read(self) -> tuple[float, ...]:
        """Milliseconds between consecutive points (one fewer than the points)."""
        if not self.cuda:
            return tuple((b - a) * 1e3 for a, b in itertools.pairwise(self._host))
        torch.cuda.synchronize(self.device)
        return tuple(a.elapsed_time(b) for a, b in itertools.pairwise(self._events))

    @property
    def host_ms(self) -> float:
        return (self._host[-1] - self._host[0]) * 1e3


class CallTimes(tuple):
    """Milliseconds of each call (a tuple), with ``host_ms``: the host's time per call to issue
    them, before it waited for the device (on a CPU, their mean)."""

    host_ms: float = float("nan")


def time_calls(fn: Callable[[], Any], calls: int, device: torch.device) -> CallTimes:
    """Milliseconds of each of ``calls`` back-to-back calls of ``fn`` on the :class:`Clock`: on
    a GPU the host waits once, after the last call, so the queue stays as full as in training
    (a call whose host work outlasts its kernels is timed as the host sets it)."""
    checks.integer("calls", calls)
    device = resolve_device(device, default=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the first call starts on an empty queue
    clock = Clock(device)
    for _ in range(calls):
        fn()
        clock.mark()
    times = CallTimes(clock.read())
    times.host_ms = clock.host_ms / calls
    return times


def _timed_calls(fn, iters: int, device: torch.device, measure_memory: bool):
    """Per-call times, and the peak memory over them when asked for (GPU only)."""
    if device.type == "cuda" and measure_memory:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    times = time_calls(fn, iters, device)
    cuda_peak = device.type == "cuda" and measure_memory
    return times, torch.cuda.max_memory_allocated(device) if cuda_peak else None


def _out_of_memory(error, label: str, device: torch.device, fields: dict) -> MemoryError:
    shapes = fields.get("extra", {}).get("input_shapes")
    where = f"{label!r} ({fields.get('mode', 'callable')}{f', inputs {shapes}' if shapes else ''})"
    return MemoryError(
        f"out of GPU memory while timing {where} on {device}: {error}".splitlines()[0]
    )


def time_callable(
    fn: Callable[[], Any],
    *,
    warmup: int = 10,
    iters: int = 50,
    device: torch.device | str | None = None,
    label: str = "callable",
    measure_memory: bool = False,
    min_warmup_ms: float = 0.0,
    **result_fields: Any,
) -> Timing:
    """Time ``fn()`` ``iters`` times after ``warmup`` untimed calls.

    ``min_warmup_ms`` keeps warming up until that much time has passed (GPU clocks and power
    settle over a second or so of sustained load). ``result_fields`` go into the
    :class:`Timing` (``tokens``, ``flops``, ``peak_tflops``, ``mode`` ...).
    """
    _check_timing_arguments(fn, warmup, iters, label, measure_memory, min_warmup_ms, result_fields)
    device = resolve_device(device, default=True)
    try:
        _warm_up(fn, warmup, min_warmup_ms, device)
        times, peak = _timed_calls(fn, iters, device, measure_memory)
    except torch.cuda.OutOfMemoryError as error:
        raise _out_of_memory(error, label, device, result_fields) from error
    return Timing(label=label, times_ms=tuple(times), device=str(device), warmup=warmup,
                  peak_memory_bytes=peak, **result_fields)


def _tensors(inputs: Sequence[Any]) -> list[torch.Tensor]:
    return [x for x in inputs if isinstance(x, torch.Tensor)]


def _check_devices(module: Any, inputs: Sequence[Any], label: str) -> torch.device:
    tensors = _tensors(inputs)
    if not tensors:
        raise ValueError(f"{label}: give at least one input tensor")
    device = tensors[0].device
    for tensor in tensors[1:]:
        if tensor.device != device:
            raise ValueError(
                f"{label}: inputs are on different devices ({tensor.device} and {device})"
            )
    if isinstance(module, torch.nn.Module):
        for name, param in module.named_parameters():
            if param.device != device:
                raise ValueError(
                    f"{label}: parameter {name!r} is on {param.device} but the input is on "
                    f"{device}; move the module or the input (module.to(device))"
                )
    return device


def _first_tensor(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(
        f"the forward returned {type(output).__name__}; backward timing needs a tensor (or a tuple "
        "whose first item is one)"
    )


def _check_speedometer_arguments(
    module, mode, zero_grad, optimizer, grad_output, autocast_kwargs, context
) -> None:
    if not callable(module):
        raise TypeError(
            f"module must be a torch.nn.Module or a callable, not {type(module).__name__}"
        )
    checks.choice("mode", mode, MODES)
    checks.flag("zero_grad", zero_grad)
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer, not {type(optimizer).__name__}"
        )
    if grad_output is not None and not isinstance(grad_output, torch.Tensor):
        raise TypeError(f"grad_output must be a tensor, not {type(grad_output).__name__}")
    if mode == "step" and optimizer is None:
        raise ValueError("mode='step' needs an optimizer")
    if autocast_kwargs is not None and context is not None:
        raise ValueError("give autocast_kwargs or context, not both")


def _forward(module, inputs, forward_kwargs, autocast_kwargs, context):
    """``module(*inputs, **forward_kwargs)`` inside ``te.autocast(**autocast_kwargs)`` (TE on a
    GPU, the CPU reference else) or inside ``context()``."""
    forward_kwargs = dict(forward_kwargs or {})
    if autocast_kwargs is not None:
        from fp8lab.environment import import_te

        te, _ = import_te()
        kwargs = dict(autocast_kwargs)
        context = lambda: te.autocast(**kwargs)  # noqa: E731
    context = context or contextlib.nullcontext

    def forward():
        with context():
            return module(*inputs, **forward_kwargs)

    return forward


def _inference_iteration(forward):
    def iteration():
        with torch.no_grad():
            forward()

    return iteration


def _training_iteration(forward, parameters, grad_output, optimizer, zero_grad):
    """One forward, backward (and optimizer step); ``grad_output`` drawn once when not given."""
    if grad_output is None:
        sample = _first_tensor(forward())
        grad_output = torch.randn_like(sample) if sample.dim() else torch.ones_like(sample)
        for param in parameters:
            param.grad = None

    def iteration():
        _first_tensor(forward()).backward(grad_output)
        if optimizer is not None:
            optimizer.step()
        if zero_grad:
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
            for param in parameters:
                param.grad = None

    return iteration


def speedometer(
    module: Callable[..., Any],
    *inputs: Any,
    mode: str = "forward_backward",
    forward_kwargs: Mapping[str, Any] | None = None,
    autocast_kwargs: Mapping[str, Any] | None = None,
    context: Callable[[], contextlib.AbstractContextManager] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    grad_output: torch.Tensor | None = None,
    zero_grad: bool = True,
    warmup: int = 10,
    iters: int = 50,
    min_warmup_ms: float = 0.0,
    label: str | None = None,
    tokens: int | None = None,
    flops: float | None = None,
    peak_tflops: float | None = None,
    measure_memory: bool = False,
) -> Timing:
    """Time ``module(*inputs, **forward_kwargs)`` in one of :data:`MODES`.

    ``autocast_kwargs`` are passed to ``te.autocast(**autocast_kwargs)`` around the
    forward (``te`` from :func:`fp8lab.import_te`: real TE on a GPU, the CPU
    reference elsewhere), like ``fp8_autocast_kwargs`` in TE's tutorial helper;
    ``context`` is any other zero-argument factory of a context manager.
    ``flops`` is the work of one iteration (match it to the mode), ``tokens`` the
    tokens it processes, ``peak_tflops`` the peak MFU is measured against.
    """
    _check_speedometer_arguments(
        module, mode, zero_grad, optimizer, grad_output, autocast_kwargs, context
    )
    label = label or getattr(module, "__class__", type(module)).__name__
    _check_counts(warmup, iters)
    device = _check_devices(module, inputs, label)
    forward = _forward(module, inputs, forward_kwargs, autocast_kwargs, context)
    parameters = [p for p in getattr(module, "parameters", lambda: [])() if p.requires_grad]
    if mode == "forward":
        iteration = _inference_iteration(forward)
    else:
        iteration = _training_iteration(forward, parameters, grad_output, optimizer, zero_grad)
    shapes = ", ".join(str(tuple(t.shape)) for t in _tensors(inputs))
    return time_callable(
        iteration,
        warmup=warmup,
        iters=iters,
        device=device,
        min_warmup_ms=min_warmup_ms,
        label=label,
        measure_memory=measure_memory,
        mode=mode,
        grads_zeroed=zero_grad if mode != "forward" else None,
        tokens=tokens,
        flops=flops,
        peak_tflops=peak_tflops,
        extra={"input_shapes": shapes},
    )
