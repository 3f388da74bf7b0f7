"""Chapter 06's library: FP8 weights, weight caching and the optimizer's state, measured.

* :mod:`~fp8lab.weights.bench` -- the chapter's models (a stack of ``te.TransformerLayer``\\ s and
  a small GPT), built seeded, optionally under ``te.quantized_model_init``, with the memory
  probes the chapter reads (allocated bytes, a clean slate before each measurement);
* :mod:`~fp8lab.weights.rounds` -- step times in rounds by the book's protocol, each
  configuration's median and spread, a ratio with its interval over the rounds, and calls timed
  while the profiler records them, so that a call's time, its kernel time and the GPU's idle
  share come from one measurement;
* :mod:`~fp8lab.weights.graphs` -- a step of the stack under CUDA graphs
  (``te.make_graphed_callables``), so that the GPU, not the host, sets its time; a refusal
  becomes a row, not an exception;
* :mod:`~fp8lab.weights.optimizer_states` -- ``FusedAdam``'s state options and their bytes per
  parameter, measured;
* :mod:`~fp8lab.weights.sizing` -- the largest model of a shape that fits a GPU by the memory
  estimator, and the bytes an FSDP2 all-gather moves per step with BF16 or FP8 weights;
* :mod:`~fp8lab.weights.words` -- sentences picked from a measured sign, so that a glued
  sentence cannot contradict its number (and nouns that agree with theirs, ties named as ties,
  spreads traced to their calls), and the protocol's verdict on paired seeds;
* :mod:`~fp8lab.weights.stale_transpose` -- a standalone reproduction of the stale FP8 weight
  transpose that TE's ``FusedAdam`` leaves under delayed scaling.
"""

from fp8lab.weights.bench import ModelKit
from fp8lab.weights.graphs import attempt
from fp8lab.weights.rounds import ProfiledCalls, RoundTimes, alternate_rounds, profiled_calls
from fp8lab.weights.sizing import fsdp_gather_bytes, largest_layers
from fp8lab.weights.words import (
    change,
    count_words,
    paired_difference,
    ratio_words,
    smallest_words,
    spread_words,
)

__all__ = [
    "ModelKit",
    "ProfiledCalls",
    "RoundTimes",
    "alternate_rounds",
    "attempt",
    "change",
    "count_words",
    "fsdp_gather_bytes",
    "largest_layers",
    "paired_difference",
    "profiled_calls",
    "ratio_words",
    "smallest_words",
    "spread_words",
]
