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
the profiler saw (:func:`fp8lab.profiling.profile`), from which
:func:`fp8lab.profiling.kernel_family` reads what actually ran, so each row says whether the
setting was honoured (``confirmed``). A backend that refuses the inputs, or runs out of memory,
becomes a row with its reason instead of an exception; TE's reasons come from its own selection
log, captured in-process for that first call (:func:`capture_te_log`).

TE's selection log (``NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2``) is configured from the environment
once, when TE is imported (``AttentionLogging._log_level``); setting the variables later in a
running process changes nothing. :func:`te_selection_logs` therefore runs the cases in a
fresh Python process started with those variables, exactly as a reader would on the command
line, and returns what TE printed.

The modules: :mod:`~fp8lab.attention.functional` (the shape of a problem, its mask, explicit and
SDPA attention), :mod:`~fp8lab.attention.backends` (the backend names and their context),
:mod:`~fp8lab.attention.logs` (TE's selection log), :mod:`~fp8lab.attention.run` (a row:
:func:`run_attention`, :func:`measure`), :mod:`~fp8lab.attention.rounds` (backends in
alternated rounds, by kernel time), :mod:`~fp8lab.attention.flex` (FlexAttention for a
window), :mod:`~fp8lab.attention.fp8_scale` (FP8 attention's softmax scale, probed) and
:mod:`~fp8lab.attention.copy_task` (a task that needs attention; paired seed differences).
"""

from fp8lab.attention.backends import BACKENDS, EXPECTED_FAMILY, backend_context
from fp8lab.attention.copy_task import copy_batches, paired_interval
from fp8lab.attention.flex import flex_step
from fp8lab.attention.fp8_scale import probe_softmax_scale, row_errors
from fp8lab.attention.functional import (
    AttentionShape,
    explicit_attention,
    sdpa_attention,
    window_mask,
)
from fp8lab.attention.logs import (
    SelectionLog,
    capture_te_log,
    refusal_reason,
    te_selection_logs,
)
from fp8lab.attention.rounds import (
    backend_step,
    beyond_spread,
    faster,
    interleaved_rounds,
    round_summary,
)
from fp8lab.attention.run import AttentionResult, measure, run_attention

__all__ = [
    "BACKENDS",
    "EXPECTED_FAMILY",
    "AttentionResult",
    "AttentionShape",
    "SelectionLog",
    "backend_context",
    "backend_step",
    "beyond_spread",
    "capture_te_log",
    "copy_batches",
    "explicit_attention",
    "faster",
    "flex_step",
    "interleaved_rounds",
    "measure",
    "paired_interval",
    "probe_softmax_scale",
    "refusal_reason",
    "round_summary",
    "row_errors",
    "run_attention",
    "sdpa_attention",
    "te_selection_logs",
    "window_mask",
]
