"""Run an attention callable under a named backend, and report what ran, how fast, in how much
memory.

A backend is named, not hoped for:

* **Transformer Engine** (``te_*``): ``te.DotProductAttention`` chooses among cuDNN fused
  attention (``FusedAttention``; sub-backend 1 for FP16/BF16, 2 for FP8), FlashAttention (the
  ``flash-attn`` packages, when installed) and its unfused PyTorch path
  (``UnfusedDotProductAttention``). ``NVTE_FUSED_ATTN``, ``NVTE_FLASH_ATTN`` and
  ``NVTE_UNFUSED_ATTN`` switch each off (``0``) or on (``1``). TE reads them in
  ``get_attention_backend`` when it *selects*, and it caches the selection in the module-level
  dict ``_attention_backends``: it selects again only when a call's ``AttentionParams`` differ
  from the previous call's, or when ``backend_selection_requires_update`` is set. The switches
  are not part of ``AttentionParams``, so changing them between two calls of the same shape
  changes nothing by itself. :func:`backend_context` therefore sets the switches, then marks the
  cached selection stale, and restores both on the way out; each row builds a fresh module
  (``build``) inside the context.
* **PyTorch SDPA** (``sdpa_*``): ``torch.nn.attention.sdpa_kernel`` pins one of cuDNN, Flash,
  memory-efficient or math for ``F.scaled_dot_product_attention``.
* ``explicit``: the callable as it is (the "standard" attention of matmuls and a softmax,
  :func:`explicit_attention`); ``te_auto`` and ``sdpa_auto`` let TE or PyTorch choose.

:func:`run_attention` times forward + backward with :mod:`fp8lab.speedometer`, records the
peak memory of the row (inputs, outputs, gradients and every temporary), and lists the kernels
the profiler saw, from which :func:`kernel_family` reads what actually ran, so each row says
whether the setting was honoured (``confirmed``). A backend that refuses the inputs, or runs out
of memory, becomes a row with its reason instead of an exception; TE's reasons come from its
own selection log, captured in-process for that first call (:func:`capture_te_log`).

TE's selection log (``NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2``) is configured from the environment
once, when TE is imported (``AttentionLogging._log_level``); setting the variables later in a
running process changes nothing. :func:`te_selection_logs` therefore runs the cases in a
fresh Python process started with those variables, exactly as a reader would on the command
line, and returns what TE printed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from fp8lab import checks, flops
from fp8lab.profiling import (
    CUDNN,
    EFFICIENT,
    FLASH_PACKAGE,
    FLASH_TORCH,
    UNFUSED,
    kernel_family,
)
from fp8lab.speedometer import Timing, time_callable

__all__ = [
    "BACKENDS",
    "EXPECTED_FAMILY",
    "AttentionResult",
    "AttentionShape",
    "SelectionLog",
    "backend_context",
    "capture_te_log",
    "explicit_attention",
    "measure",
    "run_attention",
    "sdpa_attention",
    "te_selection_logs",
    "window_mask",
]

BACKENDS = {
    "te_auto": "te.DotProductAttention, TE's own choice",
    "te_fused": "te.DotProductAttention, cuDNN fused attention only",
    "te_flash": "te.DotProductAttention, FlashAttention (flash-attn packages) only",
    "te_unfused": "te.DotProductAttention, unfused PyTorch path only",
    "sdpa_auto": "F.scaled_dot_product_attention, PyTorch's own choice",
    "sdpa_cudnn": "F.scaled_dot_product_attention pinned to CUDNN_ATTENTION",
    "sdpa_flash": "F.scaled_dot_product_attention pinned to FLASH_ATTENTION",
    "sdpa_efficient": "F.scaled_dot_product_attention pinned to EFFICIENT_ATTENTION",
    "sdpa_math": "F.scaled_dot_product_attention pinned to MATH",
    "explicit": "explicit matmul + softmax (standard attention)",
}
TE_SWITCHES = {
    "te_fused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "0"},
    "te_flash": {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"},
    "te_unfused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "1"},
}
SDPA_PINS = {
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_math": "MATH",
}
EXPECTED_FAMILY = {
    "te_fused": CUDNN,
    "te_flash": FLASH_PACKAGE,
    "te_unfused": UNFUSED,
    "sdpa_cudnn": CUDNN,
    "sdpa_flash": FLASH_TORCH,
    "sdpa_efficient": EFFICIENT,
    "sdpa_math": UNFUSED,
    "explicit": UNFUSED,
}
STATUSES = ("ok", "refused", "out of memory", "skipped")
# What a backend says when it refuses the inputs (TE, PyTorch SDPA on GPU and CPU, the reference).
_REFUSAL = re.compile(
    r"No dot product attention backend|No available kernel|No viable backend|not modelled by "
    r"the CPU reference|needs Transformer Engine|cudnn_frontend|No execution plans|"
    r"CUDNN_STATUS_NOT_SUPPORTED",
    re.I,
)
_TE_MODULE = "transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention"
_TE_UTILS = "transformer_engine.pytorch.attention.dot_product_attention.utils"
_TE_LOGGERS = ("DotProductAttention", "FlashAttention", _TE_UTILS)
_TE_FORMAT = "[%(levelname)-8s | %(name)-19s]: %(message)s"  # TE's AttentionLogging format
_LOG_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING}


# --- shapes and the two plain-PyTorch attentions -----------------------------------------------


@dataclass(frozen=True)
class AttentionShape:
    """One attention problem: B sequences of S tokens, A query heads of size D, G key/value
    groups, a mask (TE's names), an optional sliding window and the attention dropout."""

    batch: int
    seq: int
    heads: int
    head_dim: int
    groups: int | None = None
    mask: str = "causal"
    window_size: tuple[int, int] | None = None
    dropout: float = 0.0

    def __post_init__(self):
        for name in ("batch", "seq", "heads", "head_dim"):
            checks.integer(name, getattr(self, name))
        if self.groups is not None and self.heads % checks.integer("groups", self.groups):
            raise ValueError(f"groups={self.groups}: must divide heads={self.heads}")
        window = flops.attention_window(self.mask, self.window_size)
        if self.window_size is not None:
            object.__setattr__(self, "window_size", window)
        checks.probability("dropout", self.dropout)

    @property
    def kv_groups(self) -> int:
        """G: the key/value heads (A without GQA)."""
        return self.groups or self.heads

    @property
    def sliding(self) -> bool:
        left, right = flops.attention_window(self.mask, self.window_size)
        return left >= 0 or (self.mask == "no_mask" and right >= 0)

    @property
    def label(self) -> str:
        kind = "MHA" if self.kv_groups == self.heads else "MQA" if self.kv_groups == 1 else "GQA"
        mask = self.mask
        if self.sliding:
            left, right = self.window_size
            mask = (
                f"causal window {left}" if self.mask != "no_mask" else f"window ({left}, {right})"
            )
        return (
            f"B={self.batch} S={self.seq} A={self.heads} G={self.kv_groups} ({kind}) "
            f"D={self.head_dim} {mask}"
        )

    def flops(self, backward: bool = True, backward_factor: float = 2.0) -> float:
        """:func:`fp8lab.flops.attention_core_flops` of this shape (forward + backward by
        default, model FLOPs)."""
        return flops.attention_core_flops(
            self.batch,
            self.heads,
            self.seq,
            self.head_dim,
            mask=self.mask,
            window_size=self.window_size,
            groups=self.kv_groups,
            backward=backward,
            backward_factor=backward_factor,
        )

    def make_inputs(self, device=None, dtype=torch.bfloat16, seed: int = 0):
        """``q [B, S, A, D]``, ``k, v [B, S, G, D]`` (TE's ``bshd``), normal, requiring grad."""
        checks.integer("seed", seed, minimum=0)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype={dtype!r}: must be a floating-point torch dtype")
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        generator = torch.Generator(device=device).manual_seed(seed)
        shapes = [
            (self.batch, self.seq, h, self.head_dim) for h in (self.heads,) + (self.kv_groups,) * 2
        ]
        return tuple(
            torch.randn(shape, generator=generator, device=device, dtype=dtype).requires_grad_()
            for shape in shapes
        )


def window_mask(seq: int, mask: str = "causal", window_size=None, device=None) -> torch.Tensor:
    """``[S, S]`` booleans, True where query i may attend to key j (self-attention, TE's window
    rule via :func:`fp8lab.flops.attention_window`)."""
    checks.integer("seq", seq)
    left, right = flops.attention_window(mask, window_size)
    query = torch.arange(seq, device=device)[:, None]
    key = torch.arange(seq, device=device)[None, :]
    allowed = torch.ones(seq, seq, dtype=torch.bool, device=device)
    if right >= 0:
        allowed &= key <= query + right
    if left >= 0:
        allowed &= key >= query - left
    return allowed


def _check_qkv(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        checks.tensor(name, t, dims=4, floating=True)
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: need q [B, S, A, D] "
            "and k, v [B, S, G, D]"
        )
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"k has {k.shape[2]} heads: must divide the {q.shape[2]} query heads")


def explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: str = "causal",
    window_size=None,
    dropout_p: float = 0.0,
    training: bool = True,
) -> torch.Tensor:
    """Standard attention, written out: ``softmax(mask(Q K^T / sqrt(D))) V`` in the inputs' dtype.

    ``q [B, S, A, D]``, ``k, v [B, S, G, D]`` (G groups are repeated to A heads); returns
    ``[B, S, A, D]``. The full ``[B, A, S, S]`` score matrix is materialised, as in nanoGPT's
    non-flash path; masked scores are set to -inf before the softmax.
    """
    _check_qkv(q, k, v)
    checks.probability("dropout_p", dropout_p)
    checks.flag("training", training)
    repeat = q.shape[2] // k.shape[2]
    q_, k_, v_ = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, S, D]
    if repeat > 1:
        k_, v_ = k_.repeat_interleave(repeat, dim=1), v_.repeat_interleave(repeat, dim=1)
    scores = (q_ @ k_.transpose(-2, -1)) * (1.0 / q.shape[-1] ** 0.5)  # [B, A, S, S]
    if mask != "no_mask" or window_size is not None:
        allowed = window_mask(q.shape[1], mask, window_size, device=q.device)
        if not bool(allowed.all()):
            scores = scores.masked_fill(~allowed, float("-inf"))
    probs = F.dropout(scores.softmax(dim=-1), dropout_p, training)
    return (probs @ v_).transpose(1, 2)  # [B, A, S, D] -> [B, S, A, D]


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: str = "causal",
    window_size=None,
    dropout_p: float = 0.0,
    training: bool = True,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` on TE's ``bshd`` layout: ``is_causal`` for a causal
    mask, a boolean ``attn_mask`` for a sliding window (SDPA has no window argument),
    ``enable_gqa`` when G < A. Returns ``[B, S, A, D]``."""
    _check_qkv(q, k, v)
    checks.probability("dropout_p", dropout_p)
    checks.flag("training", training)
    left, right = flops.attention_window(mask, window_size)
    causal = mask != "no_mask"
    sliding = left >= 0 or (not causal and right >= 0)
    q_, k_, v_ = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, S, D], strided views
    out = F.scaled_dot_product_attention(
        q_,
        k_,
        v_,
        attn_mask=window_mask(q.shape[1], mask, window_size, q.device) if sliding else None,
        is_causal=causal and not sliding,
        dropout_p=dropout_p if training else 0.0,
        enable_gqa=k.shape[2] != q.shape[2],
    )
    return out.transpose(1, 2)  # [B, A, S, D] -> [B, S, A, D]


# --- backends, logs, kernels --------------------------------------------------------------------


def _invalidate_te_selection() -> bool:
    """Mark TE's cached backend selection stale (only if TE is loaded); True if it was found."""
    module = sys.modules.get(_TE_MODULE)
    cache = getattr(module, "_attention_backends", None)
    if not isinstance(cache, dict):
        return False
    cache["attention_params"] = None
    cache["backend_selection_requires_update"] = True
    policy_cache = getattr(module, "_thd_policy_backend_cache", None)
    if isinstance(policy_cache, list):
        policy_cache.clear()
    return True


def _check_env(env) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and k for k, v in env.items()
    ):
        raise TypeError(f"env={env!r}: must be a mapping of variable names to string values")
    return dict(env)


@contextlib.contextmanager
def backend_context(backend: str, env: Mapping[str, str] | None = None):
    """Run the body under ``backend`` (a key of :data:`BACKENDS`): TE's switches set and its
    cached selection marked stale, or SDPA pinned with ``sdpa_kernel``. ``env`` sets other
    variables for the duration (``NVTE_FP8_DPA_BWD``, say). Everything is restored afterwards."""
    checks.choice("backend", backend, BACKENDS)
    variables = {**TE_SWITCHES.get(backend, {}), **_check_env(env)}
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    _invalidate_te_selection()
    try:
        if backend in SDPA_PINS:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(getattr(SDPBackend, SDPA_PINS[backend])):
                yield
        else:
            yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _invalidate_te_selection()


class _Collect(logging.Handler):
    def __init__(self, lines: list[str]):
        super().__init__()
        self.lines = lines
        self.setFormatter(logging.Formatter(_TE_FORMAT))

    def emit(self, record):
        self.lines.append(self.format(record))


@contextlib.contextmanager
def capture_te_log(level: str = "DEBUG"):
    """Collect TE's attention log lines (``level`` and above) into the yielded list, in-process.

    TE fixes its log level when it is imported; this raises it for the body (TE re-reads
    ``AttentionLogging._log_level`` at every selection) and sends the lines to the list instead
    of stderr, then restores everything. Without TE loaded the list stays empty.
    """
    checks.choice("level", level, _LOG_LEVELS)
    lines: list[str] = []
    utils = sys.modules.get(_TE_UTILS)
    logging_class = getattr(utils, "AttentionLogging", None)
    if logging_class is None:
        yield lines
        return
    numeric = _LOG_LEVELS[level]
    handler = _Collect(lines)
    loggers = [logging.getLogger(name) for name in _TE_LOGGERS]
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    saved_level = logging_class._log_level
    logging_class._log_level = numeric
    for lg in loggers:
        lg.handlers = [handler]
        lg.setLevel(numeric)
        lg.propagate = False
    try:
        yield lines
    finally:
        logging_class._log_level = saved_level
        for lg, handlers, lg_level, propagate in saved:
            lg.handlers, lg.propagate = handlers, propagate
            lg.setLevel(lg_level)


@contextlib.contextmanager
def _quiet_fd2():
    """Send file descriptor 2 to /dev/null for the body: the profiler's C++ side (kineto) logs
    its start and stop there (torch 2.13), and a notebook's kernel forwards fd 2 into the
    outputs. What it reports that matters (the kernels) comes back as data."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _kernels(fn: Callable[[], Any], cuda: bool) -> tuple[str, ...]:
    """Kernel (GPU) or operator (CPU) names of one call of ``fn``, by device time, largest
    first."""
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    with _quiet_fd2(), profile(activities=[activity], acc_events=True) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    found = []
    for event in prof.key_averages():
        time_us = event.self_device_time_total if cuda else event.self_cpu_time_total
        if time_us > 0 and (cuda or event.key.startswith("aten::")):
            found.append((time_us, event.key))
    return tuple(name for _, name in sorted(found, reverse=True))


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def _reasons(lines: Sequence[str]) -> list[str]:
    """The lines of a log that say why something was switched off or refused."""
    keep = re.compile(
        r"Disabling|not installed|Please install|NoBackend|not used because|"
        r"does not support|not supported|requires",
        re.I,
    )
    found = []
    for line in lines:
        text = re.sub(r"^\[\w+\s*\|\s*[\w.]+\s*\]:\s*", "", line).strip()
        if keep.search(text) and text not in found:
            found.append(text.splitlines()[0])
    return found


# --- results -------------------------------------------------------------------------------------


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


def _free_memory(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


def _uses_real_te() -> bool:
    from fp8lab.environment import detect

    return detect().uses_real_te


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
    if not callable(build) or not callable(make_inputs):
        raise TypeError(
            "build and make_inputs must be callables (factories of the module and "
            "of the input tensors)"
        )
    checks.choice("backend", backend, BACKENDS)
    checks.choice("mode", mode, ("forward", "forward_backward"))
    if not isinstance(label, str):
        raise TypeError(f"label={label!r}: must be a string")
    if flops is not None:
        checks.number("flops", flops, positive=True)
    if context is not None and not callable(context):
        raise TypeError("context must be a zero-argument factory of a context manager")
    checks.integer("warmup", warmup, minimum=0)
    checks.integer("iters", iters, minimum=2)
    checks.flag("profile", profile)
    if extra is not None and not isinstance(extra, Mapping):
        raise TypeError(f"extra={extra!r}: must be a mapping of column names to values")
    extra = dict(extra or {})
    common = {"label": label, "backend": backend, "flops": flops, "extra": extra}
    if backend in TE_SWITCHES and not _uses_real_te():
        return AttentionResult(
            status="refused",
            reason="needs Transformer Engine on a CUDA GPU (the CPU reference has one path)",
            **common,
        )
    context = context or contextlib.nullcontext
    state: dict[str, Any] = {}
    log: list[str] = []
    cuda = False
    try:
        with backend_context(backend, env):
            cuda = torch.cuda.is_available()
            if cuda:
                torch.cuda.synchronize()
                if torch.cuda.memory_allocated() > 2**30:  # left over: free what is garbage
                    _free_memory(True)
                baseline = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            inputs = tuple(make_inputs())
            for index, tensor in enumerate(inputs):
                checks.tensor(f"make_inputs()[{index}]", tensor)
            cuda = inputs[0].is_cuda
            fn = build()
            if not callable(fn):
                raise TypeError(f"build() returned {type(fn).__name__}: must return a callable")
            state.update(inputs=inputs, fn=fn)
            leaves = [t for t in inputs if t.requires_grad]
            if isinstance(fn, torch.nn.Module):
                leaves += [p for p in fn.parameters() if p.requires_grad]

            def forward():
                with context():
                    out = fn(*inputs)
                return out[0] if isinstance(out, (tuple, list)) else out

            def iteration():
                if mode == "forward":
                    with torch.no_grad():
                        forward()
                    return
                out = forward()
                if "grad" not in state:
                    state["grad"] = torch.randn_like(out)
                out.backward(state["grad"])
                for leaf in leaves:
                    leaf.grad = None

            try:
                with (
                    capture_te_log("DEBUG") as te_lines,
                    warnings.catch_warnings(record=True) as caught,
                ):
                    warnings.simplefilter("always")
                    iteration()
                    if cuda:
                        torch.cuda.synchronize()
            except torch.cuda.OutOfMemoryError:
                raise
            except (ValueError, RuntimeError, NotImplementedError, AssertionError) as error:
                log = list(te_lines) + [f"[warning] {w.message}" for w in caught]
                if not (_REFUSAL.search(str(error)) or isinstance(error, NotImplementedError)):
                    raise
                reasons = _reasons(log)
                return AttentionResult(
                    status="refused",
                    reason="; ".join([_first_line(error)[:160]] + reasons[:6]),
                    log=tuple(log),
                    te_selected=_selected(log),
                    **common,
                )
            log = list(te_lines) + [f"[warning] {w.message}" for w in caught]
            timing = time_callable(
                iteration,
                warmup=warmup,
                iters=iters,
                label=label or backend,
                mode=mode,
                flops=flops,
                device=inputs[0].device,
            )
            peak = torch.cuda.max_memory_allocated() - baseline if cuda else None
            kernels = _kernels(iteration, cuda) if profile else ()
    except (torch.cuda.OutOfMemoryError, MemoryError) as error:
        state.clear()
        _free_memory(cuda)
        return AttentionResult(
            status="out of memory", reason=_first_line(error)[:200], log=tuple(log), **common
        )
    state.clear()
    return AttentionResult(
        status="ok",
        timing=timing,
        peak_memory_bytes=peak,
        kernels=kernels,
        family=kernel_family(list(kernels)) if kernels else None,
        te_selected=_selected(log),
        log=tuple(log),
        **common,
    )


def _selected(lines: Sequence[str]) -> str | None:
    for line in lines:
        found = re.search(r"Selected backend = (.+?)\.?$", line)
        if found:
            return found.group(1)
    return None


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
    if label is not None and not isinstance(label, str):
        raise TypeError(f"label={label!r}: must be a string")
    if extra is not None and not isinstance(extra, Mapping):
        raise TypeError(f"extra={extra!r}: must be a mapping of column names to values")
    kwargs = {"mask": shape.mask, "window_size": shape.window_size, "dropout_p": shape.dropout}

    if backend.startswith("te_"):

        def build():
            return te.DotProductAttention(
                shape.heads,
                shape.head_dim,
                num_gqa_groups=shape.kv_groups,
                attention_dropout=shape.dropout,
                qkv_format="bshd",
                attn_mask_type=shape.mask,
                window_size=shape.window_size,
            )
    else:
        attend = explicit_attention if backend == "explicit" else sdpa_attention

        def build():
            return lambda q, k, v: attend(q, k, v, **kwargs)

    return run_attention(
        build,
        lambda: shape.make_inputs(device=device, dtype=dtype),
        backend=backend,
        label=shape.label if label is None else label,
        flops=shape.flops(),
        context=context,
        env=env,
        extra={"S": shape.seq, **dict(extra or {})},
        **timing,
    )


# --- TE's selection log, from a fresh process ---------------------------------------------------


@dataclass(frozen=True)
class SelectionLog:
    """What TE printed (``NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2``) for one case, and how it ended."""

    title: str
    lines: tuple[str, ...] = ()
    error: str | None = None

    def __post_init__(self):
        if not isinstance(self.title, str):
            raise TypeError(f"title={self.title!r}: must be a string")
        if not isinstance(self.lines, tuple) or not all(isinstance(x, str) for x in self.lines):
            raise TypeError(f"lines={self.lines!r}: must be a tuple of strings")
        if self.error is not None and not isinstance(self.error, str):
            raise TypeError(f"error={self.error!r}: must be None or a string")

    @property
    def selected(self) -> str | None:
        return _selected(self.lines)

    def summary(self, config: bool = False) -> list[str]:
        """The lines that decide the selection (the long ``Running with config`` line only
        with ``config=True``), then the error if the call failed."""
        keep = [line for line in self.lines if config or "Running with config" not in line]
        return keep + ([f"-> {self.error}"] if self.error else [])


_CHILD_MARK = "@@fp8lab-case"
_TE_LINE = re.compile(r"\[(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*\|")
_PY_WARNING = re.compile(r"\.py:\d+: |^\s+warnings\.warn|^\s{2,}")


def _child_main() -> int:  # pragma: no cover - runs on the GPU, in a fresh process
    import transformer_engine.pytorch as te  # first: TE must load cuDNN before torch does
    from transformer_engine.common import recipe as te_recipe

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.init()
    cases = json.loads(sys.stdin.read())
    recipes = {"delayed": te_recipe.DelayedScaling, "current": te_recipe.Float8CurrentScaling}
    for index, case in enumerate(cases):
        print(f"{_CHILD_MARK} {index}", file=sys.stderr, flush=True)
        shape = AttentionShape(
            **{
                **case["shape"],
                "window_size": (
                    tuple(case["shape"]["window_size"]) if case["shape"]["window_size"] else None
                ),
            }
        )
        saved = {k: os.environ.get(k) for k in case["env"]}
        os.environ.update(case["env"])
        _invalidate_te_selection()
        try:
            module = te.DotProductAttention(
                shape.heads,
                shape.head_dim,
                num_gqa_groups=shape.kv_groups,
                attention_dropout=shape.dropout,
                qkv_format="bshd",
                attn_mask_type=shape.mask,
                window_size=shape.window_size,
            )
            q, k, v = shape.make_inputs(device=device)
            fp8 = case.get("recipe")
            autocast = (
                te.autocast(recipe=recipes[fp8](fp8_dpa=True, fp8_mha=case.get("fp8_mha", False)))
                if fp8
                else contextlib.nullcontext()
            )
            with autocast:
                out = module(q, k, v)
            out.float().sum().backward()
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as error:  # the point is to show the error, whatever its kind
            print(f"{_CHILD_MARK} error {_first_line(error)}", file=sys.stderr, flush=True)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    print(f"{_CHILD_MARK} end", file=sys.stderr, flush=True)
    return 0


def _case(case: Any, index: int) -> dict[str, Any]:
    if not isinstance(case, Mapping):
        raise TypeError(f"cases[{index}] must be a dict with 'shape' (and 'recipe', 'env')")
    unknown = set(case) - {"title", "shape", "recipe", "env", "fp8_mha"}
    if unknown:
        raise ValueError(f"cases[{index}]: unknown keys {sorted(unknown)}")
    shape = case.get("shape")
    if not isinstance(shape, AttentionShape):
        raise TypeError(f"cases[{index}]['shape'] must be an AttentionShape")
    if case.get("recipe") is not None:
        checks.choice(f"cases[{index}]['recipe']", case["recipe"], ("delayed", "current"))
    checks.flag(f"cases[{index}]['fp8_mha']", case.get("fp8_mha", False))
    title = case.get("title", shape.label)
    if not isinstance(title, str):
        raise TypeError(f"cases[{index}]['title'] must be a string")
    return {
        "title": title,
        "shape": dataclasses.asdict(shape),
        "recipe": case.get("recipe"),
        "fp8_mha": case.get("fp8_mha", False),
        "env": _check_env(case.get("env")),
    }


def te_selection_logs(cases: Sequence[Mapping[str, Any]], timeout_s: float = 300.0):
    """TE's backend-selection log for each case, from one fresh Python process started with
    ``NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2`` (TE reads them when it is imported).

    A case is a dict: ``shape`` (an :class:`AttentionShape`), optional ``title``, ``recipe``
    (``None``, ``"delayed"`` or ``"current"``, with ``fp8_dpa=True``), ``fp8_mha`` and ``env``
    (switches such as ``NVTE_FUSED_ATTN``). Each case runs one forward and backward of a fresh
    ``te.DotProductAttention``. Returns one :class:`SelectionLog` per case; where TE cannot run
    (no CUDA GPU), each says so in ``error``.
    """
    if isinstance(cases, (str, bytes)) or not isinstance(cases, Sequence):
        raise TypeError(f"cases must be a list of dicts, not {type(cases).__name__}")
    prepared = [_case(case, index) for index, case in enumerate(cases)]
    timeout_s = checks.number("timeout_s", timeout_s, positive=True)
    if not _uses_real_te():
        return [
            SelectionLog(c["title"], error="needs Transformer Engine on a CUDA GPU")
            for c in prepared
        ]
    payload = [{k: c[k] for k in ("shape", "recipe", "fp8_mha", "env")} for c in prepared]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fp8lab.attention"],
            input=json.dumps(payload),
            env=dict(os.environ, NVTE_DEBUG="1", NVTE_DEBUG_LEVEL="2"),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        stderr, stopped = done.stderr, f"exit status {done.returncode}"
    except subprocess.TimeoutExpired as error:
        stderr = error.stderr.decode() if isinstance(error.stderr, bytes) else error.stderr or ""
        stopped = f"timed out after {timeout_s:.0f} s"
    last = [line for line in stderr.splitlines() if line.strip() and _CHILD_MARK not in line]
    stopped += f": {last[-1].strip()[:200]}" if last else ""
    blocks: dict[int, list[str]] = {}
    errors: dict[int, str] = {}
    current, in_te_line = None, False
    for line in stderr.splitlines():
        if line.startswith(_CHILD_MARK):
            word = line[len(_CHILD_MARK) :].strip()
            if word.startswith("error") and current is not None:
                errors[current] = word[len("error") :].strip()
            elif word.isdigit():
                current = int(word)
                blocks[current] = []
            else:
                current = None
            in_te_line = False
        elif current is not None and _TE_LINE.match(line):
            blocks[current].append(line)
            in_te_line = True
        elif current is not None and in_te_line and line.strip() and not _PY_WARNING.search(line):
            blocks[current].append(line)  # the next line of a multi-line TE message
        else:
            in_te_line = False
    return [
        SelectionLog(
            c["title"],
            tuple(blocks.get(i, ())),
            errors.get(i)
            or (None if i in blocks else f"the logging process stopped first ({stopped})"),
        )
        for i, c in enumerate(prepared)
    ]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_child_main())
