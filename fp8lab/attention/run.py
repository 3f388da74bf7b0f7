"""One row of a backend comparison: a callable timed under a named backend, with its peak memory
and the kernels that ran, or the reason it did not run.

:func:`run_attention` builds the module and its inputs inside :func:`backend_context`, runs a
first iteration with TE's log captured (a refusal there becomes a ``"refused"`` row with TE's
reasons), times forward + backward with :mod:`fp8lab.speedometer`, records the row's peak memory
and profiles one more iteration with :func:`fp8lab.profiling.profile`, from whose kernel names
:func:`fp8lab.profiling.kernel_family` reads what ran. :func:`measure` does that for one
:class:`AttentionShape` on one backend.
"""

from __future__ import annotations

import contextlib
import gc
import re
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fp8lab import checks, profiling
from fp8lab.attention import backends
from fp8lab.attention.backends import BACKENDS, EXPECTED_FAMILY, TE_SWITCHES, backend_context
from fp8lab.attention.functional import AttentionShape, explicit_attention, sdpa_attention
from fp8lab.attention.logs import (
    _first_line,
    _reasons,
    _selected,
    capture_te_log,
    refusal_reason,
)
from fp8lab.devices import resolve_device
from fp8lab.speedometer import Timing, time_callable

__all__ = ["AttentionResult", "measure", "run_attention"]

STATUSES = ("ok", "refused", "out of memory", "skipped")
# What a backend says when it refuses the inputs (TE, PyTorch SDPA on GPU and CPU, the reference).
_REFUSAL = re.compile(
    r"No dot product attention backend|No available kernel|No viable backend|not modelled by "
    r"the CPU reference|needs Transformer Engine|cudnn_frontend|No execution plans|"
    r"CUDNN_STATUS_NOT_SUPPORTED",
    re.I,
)


@dataclass(frozen=True)
class AttentionResult:
    """One row: a backend on one configuration, timed, or refused / out of memory with why."""

    label: str
    backend: str
    status: str
    reason: str = ""
    timing: Timing | None = None
    peak_memory_bytes: int | None = None
    kernels: tuple[str, ...] = ()
    family: str | None = None
    te_selected: str | None = None
    log: tuple[str, ...] = ()
    flops: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.label, str):
            raise TypeError(f"label={self.label!r}: must be a string")
        checks.choice("backend", self.backend, BACKENDS)
        checks.choice("status", self.status, STATUSES)
        if (self.status == "ok") != (self.timing is not None):
            raise ValueError(f"status={self.status!r}: a timing goes with 'ok' and only with it")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def median_ms(self) -> float:
        return self.timing.median_ms if self.ok else float("nan")

    @property
    def spread(self) -> float:
        return self.timing.spread if self.ok else float("nan")

    @property
    def tflops(self) -> float:
        """FLOPs of one iteration over the median time (the FLOPs convention of ``flops``)."""
        if not self.ok or self.flops is None:
            return float("nan")
        return self.flops / (self.median_ms * 1e-3) / 1e12

    @property
    def expected_family(self) -> str | None:
        return EXPECTED_FAMILY.get(self.backend)

    @property
    def confirmed(self) -> bool | None:
        """Did the profiler see the kernels the backend names? None where no family is named
        (``*_auto``) or nothing ran."""
        if not self.ok or self.expected_family is None or self.family is None:
            return None
        return self.family == self.expected_family

    def as_row(self) -> dict[str, Any]:
        """A flat dict for a pandas table (NaN where there is no number)."""
        gib = float("nan") if self.peak_memory_bytes is None else self.peak_memory_bytes / 2**30
        return {
            "config": self.label,
            "backend": self.backend,
            "status": self.status,
            "ms": self.median_ms,
            "spread": self.spread,
            "TFLOP/s": self.tflops,
            "peak GiB": gib,
            "ran": self.family or "",
            "confirmed": self.confirmed,
            "TE selected": self.te_selected or "",
            "kernels": " | ".join(name[:60] for name in self.kernels[:3]),
            "reason": self.reason,
            **dict(self.extra),
        }


@dataclass(frozen=True)
class _Options:
    """How a row runs: the mode, the context around each forward, the timing counts and
    whether to profile."""

    mode: str
    context: Callable[[], contextlib.AbstractContextManager] | None
    warmup: int
    iters: int
    profile: bool

    def __post_init__(self):
        checks.choice("mode", self.mode, ("forward", "forward_backward"))
        if self.context is not None and not callable(self.context):
            raise TypeError("context must be a zero-argument factory of a context manager")
        checks.integer("warmup", self.warmup, minimum=0)
        checks.integer("iters", self.iters, minimum=2)
        checks.flag("profile", self.profile)


def _check_extra(extra) -> dict[str, Any]:
    if extra is not None and not isinstance(extra, Mapping):
        raise TypeError(f"extra={extra!r}: must be a mapping of column names to values")
    return dict(extra or {})


def _free_memory(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


def _kernels(iteration: Callable[[], Any], device: torch.device) -> tuple[str, ...]:
    """Kernel (GPU) or ``aten::`` operator (CPU) names of one iteration, by device time, largest
    first."""
    seen = profiling.profile(iteration, warmup=0, iters=1, device=device)
    cuda = device.type == "cuda"
    timed = [(ms, name) for name, ms in seen.self_ms.items() if cuda or name.startswith("aten::")]
    return tuple(name for _, name in sorted(timed, reverse=True))


class _Workload:
    """A row's module and inputs; calling it runs one iteration (forward, or forward and the
    backward of a fixed random gradient, then the gradients set to None)."""

    def __init__(self, build, make_inputs, options: _Options):
        self.inputs = tuple(make_inputs())
        if not self.inputs:
            raise ValueError("make_inputs() returned no tensor: it must return the inputs")
        for index, tensor in enumerate(self.inputs):
            checks.tensor(f"make_inputs()[{index}]", tensor)
        self.fn = build()
        if not callable(self.fn):
            raise TypeError(f"build() returned {type(self.fn).__name__}: must return a callable")
        self.leaves = [t for t in self.inputs if t.requires_grad]
        if isinstance(self.fn, torch.nn.Module):
            self.leaves += [p for p in self.fn.parameters() if p.requires_grad]
        self.mode, self.context = options.mode, options.context or contextlib.nullcontext
        self.grad: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self.inputs[0].device

    def forward(self):
        with self.context():
            out = self.fn(*self.inputs)
        return out[0] if isinstance(out, (tuple, list)) else out

    def __call__(self) -> None:
        if self.mode == "forward":
            with torch.no_grad():
                self.forward()
            return
        out = self.forward()
        if self.grad is None:
            self.grad = torch.randn_like(out)
        out.backward(self.grad)
        for leaf in self.leaves:
            leaf.grad = None


class _Attempt:
    """One row's run inside its backend's context. It holds the workload, so that an
    out-of-memory error can drop it (and free its memory) before the row is returned."""

    def __init__(self, common: dict[str, Any], options: _Options):
        self.common, self.options = common, options
        self.workload: _Workload | None = None
        self.cuda, self.baseline, self.log = False, 0, []

    def prepare(self, build, make_inputs) -> None:
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            torch.cuda.synchronize()
            if torch.cuda.memory_allocated() > 2**30:  # left over: free what is garbage
                _free_memory(True)
            self.baseline = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        self.workload = _Workload(build, make_inputs, self.options)
        self.cuda = self.workload.inputs[0].is_cuda

    def first_call(self) -> BaseException | None:
        """One iteration with TE's log captured and warnings recorded; the error if the backend
        refused the inputs (any other error is raised)."""
        try:
            with (
                capture_te_log("DEBUG") as te_lines,
                warnings.catch_warnings(record=True) as caught,
            ):
                warnings.simplefilter("always")
                self.workload()
                if self.cuda:
                    torch.cuda.synchronize()
        except torch.cuda.OutOfMemoryError:
            raise
        except (ValueError, RuntimeError, NotImplementedError, AssertionError) as error:
            self.log = list(te_lines) + [f"[warning] {w.message}" for w in caught]
            if not (_REFUSAL.search(str(error)) or isinstance(error, NotImplementedError)):
                raise
            return error
        self.log = list(te_lines) + [f"[warning] {w.message}" for w in caught]
        return None

    def refused(self, error: BaseException) -> AttentionResult:
        reasons = _reasons(self.log)
        return AttentionResult(
            status="refused",
            reason="; ".join([refusal_reason(error)[:160]] + reasons[:4]),
            log=tuple(self.log),
            te_selected=_selected(self.log),
            **self.common,
        )

    def timed(self) -> AttentionResult:
        workload, common = self.workload, self.common
        timing = time_callable(
            workload,
            warmup=self.options.warmup,
            iters=self.options.iters,
            label=common["label"] or common["backend"],
            mode=self.options.mode,
            flops=common["flops"],
            device=workload.device,
        )
        peak = torch.cuda.max_memory_allocated() - self.baseline if self.cuda else None
        kernels = _kernels(workload, workload.device) if self.options.profile else ()
        self.workload = None
        return AttentionResult(
            status="ok",
            timing=timing,
            peak_memory_bytes=peak,
            kernels=kernels,
            family=profiling.kernel_family(list(kernels)) if kernels else None,
            te_selected=_selected(self.log),
            log=tuple(self.log),
            **common,
        )

    def out_of_memory(self, error: BaseException) -> AttentionResult:
        traceback.clear_frames(error.__traceback__)  # the frames hold the row's tensors
        self.workload = None
        _free_memory(self.cuda)
        reason = _first_line(error)[:200]
        return AttentionResult(
            status="out of memory", reason=reason, log=tuple(self.log), **self.common
        )


def _check_run(build, make_inputs, backend, label, flops) -> None:
    if not callable(build) or not callable(make_inputs):
        raise TypeError(
            "build and make_inputs must be callables (factories of the module and "
            "of the input tensors)"
        )
    checks.choice("backend", backend, BACKENDS)
    if not isinstance(label, str):
        raise TypeError(f"label={label!r}: must be a string")
    if flops is not None:
        checks.number("flops", flops, positive=True)


def run_attention(
    build: Callable[[], Callable[..., Any]],
    make_inputs: Callable[[], Sequence[torch.Tensor]],
    *,
    backend: str,
    label: str = "",
    flops: float | None = None,
    mode: str = "forward_backward",
    context: Callable[[], contextlib.AbstractContextManager] | None = None,
    env: Mapping[str, str] | None = None,
    warmup: int = 2,
    iters: int = 10,
    profile: bool = True,
    extra: Mapping[str, Any] | None = None,
) -> AttentionResult:
    """Time ``build()(*make_inputs())`` under ``backend``; return an :class:`AttentionResult`.

    ``build`` and ``make_inputs`` are called inside the backend's context, so each row gets a
    fresh module and fresh inputs (and the row's peak memory includes them). ``mode`` is
    ``"forward_backward"`` (the output's backward with a fixed random gradient; gradients set
    to None after each iteration) or ``"forward"`` (no grad). ``context`` wraps each forward
    (``lambda: te.autocast(recipe=...)``). ``flops`` is the work of one iteration.

    The first iteration runs with TE's log captured at DEBUG and Python warnings recorded: a
    refusal there (no backend, no kernel) returns a ``"refused"`` row with the reasons, an
    out-of-memory anywhere an ``"out of memory"`` row; either way the memory is freed.
    """
    _check_run(build, make_inputs, backend, label, flops)
    options = _Options(mode, context, warmup, iters, profile)
    common = {"label": label, "backend": backend, "flops": flops, "extra": _check_extra(extra)}
    if backend in TE_SWITCHES and not backends._uses_real_te():
        reason = f"{backends._TE_MISSING} (the CPU reference has one path)"
        return AttentionResult(status="refused", reason=reason, **common)
    attempt = _Attempt(common, options)
    try:
        with backend_context(backend, env):
            attempt.prepare(build, make_inputs)
            error = attempt.first_call()
            return attempt.refused(error) if error is not None else attempt.timed()
    except (torch.cuda.OutOfMemoryError, MemoryError) as error:
        return attempt.out_of_memory(error)


def _builder(backend: str, shape: AttentionShape, te) -> Callable[[], Callable[..., Any]]:
    """The factory of ``backend``'s attention callable for ``shape``."""
    if backend.startswith("te_"):
        return lambda: backends._te_attention(te, shape)
    attend = explicit_attention if backend == "explicit" else sdpa_attention
    kwargs = {"mask": shape.mask, "window_size": shape.window_size, "dropout_p": shape.dropout}
    return lambda: lambda q, k, v: attend(q, k, v, **kwargs)


def measure(
    backend: str,
    shape: AttentionShape,
    te=None,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device=None,
    context: Callable[[], contextlib.AbstractContextManager] | None = None,
    env: Mapping[str, str] | None = None,
    label: str | None = None,
    extra: Mapping[str, Any] | None = None,
    **timing: Any,
) -> AttentionResult:
    """:func:`run_attention` of one :class:`AttentionShape` on one backend, forward + backward.

    TE backends build ``te.DotProductAttention(A, D, num_gqa_groups=G, qkv_format="bshd",
    attn_mask_type=..., window_size=..., attention_dropout=...)`` (``te`` from
    :func:`fp8lab.import_te`); SDPA backends call :func:`sdpa_attention`; ``explicit`` calls
    :func:`explicit_attention`. FLOPs: ``shape.flops()`` (model FLOPs, backward = 2x forward).
    ``extra`` adds columns to the row (the row always has ``S``).
    """
    checks.choice("backend", backend, BACKENDS)
    if not isinstance(shape, AttentionShape):
        raise TypeError(f"shape must be an AttentionShape, not {type(shape).__name__}")
    if backend.startswith("te_") and te is None:
        raise ValueError(f"backend={backend!r} needs te= (the module from fp8lab.import_te())")
    if te is not None:
        backends._check_te(te)
    if label is not None and not isinstance(label, str):
        raise TypeError(f"label={label!r}: must be a string")
    extra = _check_extra(extra)
    device = resolve_device(device)
    return run_attention(
        _builder(backend, shape, te),
        lambda: shape.make_inputs(device=device, dtype=dtype),
        backend=backend,
        label=shape.label if label is None else label,
        flops=shape.flops(),
        context=context,
        env=env,
        extra={"S": shape.seq, **extra},
        **timing,
    )
