"""Chapter 06's library: FP8 weights, weight caching and the optimizer's state, measured.

* :mod:`~fp8lab.weights.bench` -- the chapter's models (a stack of ``te.TransformerLayer``\\ s and
  a small GPT), built seeded, optionally under ``te.quantized_model_init``, with the memory
  probes the chapter reads (allocated bytes, a clean slate before each measurement);
* :mod:`~fp8lab.weights.rounds` -- step times in alternating rounds (A B A B ...), each
  configuration's median and spread, a ratio with its round-to-round spread, and the kernel
  time and idle share of the GPU beside every step time;
* :mod:`~fp8lab.weights.graphs` -- a step of the stack under CUDA graphs
  (``te.make_graphed_callables``), so that the GPU, not the host, sets its time; a refusal
  becomes a row, not an exception;
* :mod:`~fp8lab.weights.optimizer_states` -- ``FusedAdam``'s state options and their bytes per
  parameter, measured;
* :mod:`~fp8lab.weights.sizing` -- the largest model of a shape that fits a GPU by the memory
  estimator, and the bytes an FSDP2 all-gather moves per step with BF16 or FP8 weights;
* :mod:`~fp8lab.weights.paired` -- paired differences over seeds with a confidence interval,
  judged against a margin declared before the runs;
* :mod:`~fp8lab.weights.words` -- sentences picked from a measured sign, so that a glued
  sentence cannot contradict its number;
* :mod:`~fp8lab.weights.stale_transpose` -- a standalone reproduction of the stale FP8 weight
  transpose that TE's ``FusedAdam`` leaves under delayed scaling.
"""

from fp8lab.weights.bench import ModelKit
from fp8lab.weights.graphs import attempt
from fp8lab.weights.paired import paired_difference
from fp8lab.weights.rounds import RoundTimes, alternate_rounds
from fp8lab.weights.sizing import fsdp_gather_bytes, largest_layers
from fp8lab.weights.words import change, ratio_words

__all__ = [
    "ModelKit",
    "RoundTimes",
    "alternate_rounds",
    "attempt",
    "change",
    "fsdp_gather_bytes",
    "largest_layers",
    "paired_difference",
    "ratio_words",
]
