"""Check the memory estimator against complete training steps measured on a GPU with TE.

Each configuration builds an ``fp8lab.models.GPT`` of ``te.TransformerLayer`` layers in one of
the parameter layouts of :data:`fp8lab.memory.WEIGHTS`, runs two complete training steps of the
book's :func:`fp8lab.training.train_step` (BF16 autocast and the FP8 recipe around each
forward, ``lm_loss``, backward, optimizer step; gradient accumulation when asked; recompute
through ``te.checkpoint``), and records ``torch.cuda.max_memory_allocated`` above what was
allocated before the model was built, phase by phase (hooks on the model and the optimizer
mark the phases), beside :func:`fp8lab.memory.estimate`'s prediction::

    python -m tools.memory_check --matrix tune --csv tests/gpu_results/memory_tune_h200.csv
    python -m tools.memory_check --matrix heldout --csv tests/gpu_results/memory_heldout_h200.csv
    python -m tools.memory_check --matrix fits --csv tests/gpu_results/memory_fits_h200.csv
    python -m tools.memory_check --matrix tune --dry-run      # toy sizes, any machine
    python -m tools.memory_check --matrix heldout2 --predict-only \
        --csv tests/gpu_results/memory_heldout2_predictions.csv   # predictions only, no GPU
    python -m tools.memory_check --matrix heldout2 --csv tests/gpu_results/memory_heldout2_h100.csv

``tune`` is the matrix the estimator's constants may be tuned on; ``heldout`` (other model
shapes, sequence lengths and micro-batches) never is; ``heldout2`` (small vocabularies: peaks in
a layer's backward or the optimizer step) had its predictions committed before it was measured.
Each measured row holds the peak of every phase (``build``, ``step N model forward``, ``step N
loss and backward``, ``step N optimizer step``) beside the estimator's, under the same phases
(:func:`fp8lab.memory.phase_peaks`). ``fits`` compares, for a few
configurations, the largest micro-batch :func:`fp8lab.memory.largest_micro_batch` predicts
with the largest that runs (tried, out-of-memory caught). Each CSV gets a sidecar
``.stamp.json`` (GPU, versions, the fp8lab code the measurements ran), checked by the CPU
lane. A failed configuration is a row with its error; an out-of-memory is a result.
Progress goes to stderr, the summary to stdout.

Modules: :mod:`~tools.memory_check.matrices` (what is measured),
:mod:`~tools.memory_check.measure` (one configuration), :mod:`~tools.memory_check.fits` (the
largest micro-batch), :mod:`~tools.memory_check.report` (summaries and stamps),
:mod:`~tools.memory_check.run` (a whole matrix) and ``__main__`` (the command line).
"""

from __future__ import annotations

from tools.memory_check.matrices import FITS, MATRICES, MODELS, Config, toy
from tools.memory_check.measure import measure
from tools.memory_check.report import stamp, stamp_path, summarise
from tools.memory_check.run import run

__all__ = [
    "FITS",
    "MATRICES",
    "MODELS",
    "Config",
    "measure",
    "run",
    "stamp",
    "stamp_path",
    "summarise",
    "toy",
]
