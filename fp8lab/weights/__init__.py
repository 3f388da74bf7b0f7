"""Chapter 06's library: the plumbing around FP8 weights, weight caching and the optimizer.

The TE code the chapter teaches (the micro-batch loop with ``is_first_microbatch`` and
``main_grad``, ``FusedAdam``, ``te.quantized_model_init``, ``te.make_graphed_callables``) is
written out in the chapter's cells; what stays here is what every cell shares:

* :mod:`~fp8lab.weights.bench` -- the chapter's models (a stack of ``te.TransformerLayer``\\ s and
  a small GPT), built seeded, optionally under ``te.quantized_model_init``, with the memory
  probes the chapter reads (allocated bytes, a clean slate before each measurement);
* :mod:`~fp8lab.weights.graphs` -- a guard around a CUDA-graph capture, and a refusal turned
  into the words of a table row;
* :mod:`~fp8lab.weights.optimizer_states` -- ``FusedAdam``'s state options and their bytes per
  parameter, measured;
* :mod:`~fp8lab.weights.sizing` -- the largest model of a shape that fits a GPU by the memory
  estimator, and the bytes an FSDP2 all-gather moves per step with BF16 or FP8 weights;
* :mod:`~fp8lab.weights.words` -- sentences picked from a measured sign.

Timing and verdicts come from :mod:`fp8lab.protocol`, never from here.
"""

from fp8lab.weights.bench import ModelKit
from fp8lab.weights.graphs import attempt, capture_guard
from fp8lab.weights.sizing import fsdp_gather_bytes, largest_layers
from fp8lab.weights.words import change, count_words, smallest_words

__all__ = [
    "ModelKit",
    "attempt",
    "capture_guard",
    "change",
    "count_words",
    "fsdp_gather_bytes",
    "largest_layers",
    "smallest_words",
]
