"""Chapter 05's kit: the plumbing around attention backends, not the API the chapter teaches.

The chapter writes out, in its own cells, what a reader should copy: ``te.DotProductAttention``
with its mask, layout, groups and window; the switches ``NVTE_FUSED_ATTN`` /
``NVTE_FLASH_ATTN`` / ``NVTE_UNFUSED_ATTN`` and TE's cached selection; SDPA pinned with
``sdpa_kernel``; FlexAttention's ``create_block_mask``; ``DelayedScaling(fp8_dpa=True)`` and
its softmax-scale probe. Timing and verdicts come from :mod:`fp8lab.protocol`. What is left
here is what a reader need not read to follow the chapter:

* :mod:`~fp8lab.attention.functional` -- the shape of a problem (:class:`AttentionShape`: B, S,
  A, D, G, mask, window, dropout; its inputs in TE's ``bshd`` layout), its mask as booleans,
  and standard attention written out (:func:`explicit_attention`), the FP32 yardstick;
* :mod:`~fp8lab.attention.logs` -- TE's selection log (``NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2``),
  which TE configures when it is imported, so it comes from a fresh process
  (:func:`te_selection_logs`, run by ``python -m fp8lab.attention``);
* :mod:`~fp8lab.attention.copy_task` -- a task that needs attention (:func:`copy_batches`).
"""

from fp8lab.attention.copy_task import copy_batches
from fp8lab.attention.functional import AttentionShape, explicit_attention, window_mask
from fp8lab.attention.logs import SelectionLog, te_selection_logs

__all__ = [
    "AttentionShape",
    "SelectionLog",
    "copy_batches",
    "explicit_attention",
    "te_selection_logs",
    "window_mask",
]
