"""Memory of training a transformer: a tree of named parts, and the peak of a whole step.

**The step modelled** is the book's, :func:`fp8lab.training.train_step` (``fp8lab.models.GPT``
with ``te.TransformerLayer`` layers, ``fp8lab.training.lm_loss``), as people write it::

    for step in range(steps):
        zero the gradients (set them to None)
        for tokens, targets in micro_batches:         # gradients add up over micro-batches
            with torch.autocast(dtype=torch.bfloat16), te.autocast(recipe=...):
                logits = model(tokens)                # kept until the next logits replace it
            (lm_loss(logits, targets) / len(micro_batches)).backward()  # FP32 cross-entropy
        optimizer.step()                              # states are created on the first step

It is simulated event by event (:attr:`MemoryEstimate.timeline`): embeddings, each layer's
saved tensors and weight copies, final norm, LM head, logits and loss, then the backward
module by module (gradients appear while saved tensors are freed), the optimizer step with
its temporaries, for two steps. The largest live total predicts
``torch.cuda.max_memory_allocated`` over building the model and the steps (above what was
allocated before); :attr:`MemoryEstimate.peak_event` names where it happens.

**Parameter layouts** (:data:`WEIGHTS`): pure BF16 (BF16 AdamW moments, no master);
FP32 parameters under ``torch.autocast`` (which casts BF16 weight copies for the forward and
keeps them for the backward); BF16 parameters with FP32 master weights and moments
(Megatron-style, TE's ``FusedAdam(master_weights=True)``); FP8 weights from
``te.quantized_model_init`` with FP32 master weights. Each runs in BF16 or under TE's FP8
autocast (delayed, current or block scaling).

**Sources.** Training state: Rajbhandari et al. 2020 (ZeRO, sec. 3.1 and 5: the 16 bytes per
parameter of mixed-precision Adam, 18 with FP32 gradients, and their sharding). Activations:
the tensors TE 2.20's ``LayerNormLinear``, ``DotProductAttention`` (cuDNN fused attention: no
S x S term), ``Linear`` and ``LayerNormMLP`` save, which reproduce Korthikanti et al. 2022's
``34 s b h`` per layer in BF16 (``5 a s^2 b`` more with unfused attention); tensor and
sequence parallelism as in that paper. FP8: ``module/linear.py`` (a BF16 weight is quantized
row- and column-wise, 2 bytes/parameter on Hopper, and saved for the backward; a saved FP8
input keeps only its column-wise copy), ``module/base.py`` (``quantized_model_init``),
``optimizers/fused_adam.py`` (master weights and moments created lazily in the first
``step``; FP32 copies of the gradients of FP8 weights outside delayed scaling). PyTorch:
``torch/optim/adam.py`` (foreach AdamW allocates one moment-sized temporary), autograd's
cross-entropy (log-softmax output saved; two dense logit gradients in the backward),
autocast's weight cache. Each constant of :mod:`~fp8lab.memory.constants` names its
source.

**Known limits.** Allocator fragmentation and the CUDA context (outside
``max_memory_allocated``) are beside the peak, not in it (:attr:`MemoryEstimate.runtime`);
kernels' scratch beyond the cuBLAS workspace is one measured constant; under ZeRO-3 over
dp > 1, FSDP2's all-gathered layers (the running and the prefetched one), the root's full
parameters and the running layer's unsharded gradient are modelled. With
``comm_buffers=True`` the layouts' own buffers are counted too: DDP's gradient buckets (and,
in the second step, the first step's buckets, which outlive DDP's one rebuild until the next
all-reduce releases them), the tensors TE all-gathers in each module's backward under
sequence parallelism, FSDP2's reduce-scatter input and its module-by-module FP8 weight copies
(see :func:`~fp8lab.memory.validation.layout_rows`); by default they are left out, as they
were in the estimates chapter 08 committed. ``window`` says which steps the measured peak
spans: from the build on (the default), or a step after warm-up steps (``"steady"``, as
chapter 08's worker measures; :func:`~fp8lab.memory.validation.chapter08_rows` with
``as_run=True``). Pipeline parallelism is not modelled.
Activation offload (``offload_layers``) follows TE's schedule; its time cost is
:func:`offload_overhead_ms`.
Checked against measured peaks of complete training steps by
``python -m tools.memory_check`` (results in
``tests/gpu_results``, each file named for the GPU it was measured on).

**Where things live.** :mod:`~fp8lab.memory.constants` (sizes and fitted constants, each with
its source), :mod:`~fp8lab.memory.layouts` (parameter and parallel layouts, training state per
parameter), :mod:`~fp8lab.memory.activations` (saved tensors and backward transients),
:mod:`~fp8lab.memory.spec` (the checked inputs of an estimate), :mod:`~fp8lab.memory.sizes`
(every size of a step, computed once), :mod:`~fp8lab.memory.timeline` and
:mod:`~fp8lab.memory.tree` (the simulated step and the breakdown, both reading those sizes),
:mod:`~fp8lab.memory.estimator` (:func:`estimate`), :mod:`~fp8lab.memory.fit` (one fits policy:
which GPUs, their memory and the FP8 they run, which micro-batch),
:mod:`~fp8lab.memory.phases` (the estimate's peaks under the phases a measurement marks) and
:mod:`~fp8lab.memory.validation` (the estimator against the committed measurements).
"""

from __future__ import annotations

from fp8lab.memory.activations import backward_transients, korthikanti_activations
from fp8lab.memory.constants import (  # noqa: F401 -- constants the chapters read from here
    ADAMW_IMPLS,
    COMPUTE,
    CUBLAS_WORKSPACE_HOPPER,
    CUBLAS_WORKSPACE_OLDER,
    CUDA_CONTEXT,
    FSDP2_BUFFERS,
    OPTIMIZERS,
    PRECISIONS,
    GiB,
    MiB,
)
from fp8lab.memory.estimator import MemoryEstimate, estimate
from fp8lab.memory.fit import (  # noqa: F401 -- HEADROOM, FP8_MIN_CAPABILITY: constants
    FP8_MIN_CAPABILITY,
    HEADROOM,
    fit_verdict,
    fits,
    fitting_gpus,
    largest_micro_batch,
)
from fp8lab.memory.layouts import (
    WEIGHTS,
    Layout,
    Weights,
    bytes_per_parameter,
    resolve_precision,
    zero_training_state,
)
from fp8lab.memory.offload import offload_overhead_ms
from fp8lab.memory.phases import (  # noqa: F401 -- MEASURED_PHASES, a constant, too
    MEASURED_PHASES,
    measured_phase,
    phase_peaks,
)
from fp8lab.memory.tree import MemoryNode
from fp8lab.parts import Part, Saved  # noqa: F401 -- the chapters import Part from here

__all__ = [
    "ADAMW_IMPLS",
    "COMPUTE",
    "CUDA_CONTEXT",
    "Layout",
    "MemoryEstimate",
    "MemoryNode",
    "OPTIMIZERS",
    "PRECISIONS",
    "WEIGHTS",
    "Weights",
    "backward_transients",
    "bytes_per_parameter",
    "estimate",
    "fit_verdict",
    "fits",
    "fitting_gpus",
    "korthikanti_activations",
    "largest_micro_batch",
    "measured_phase",
    "offload_overhead_ms",
    "phase_peaks",
    "resolve_precision",
    "zero_training_state",
]
