"""Chapter 10's kit: a mixture-of-experts layer in FP8.

* :mod:`fp8lab.moe.reference` -- plain-PyTorch stand-ins for TE 2.20's router, token
  permutation and ``GroupedLinear``, which the chapter uses where TE cannot run;
* :mod:`fp8lab.moe.memory` -- the bytes of one MoE layer in training (arithmetic only);
* :mod:`fp8lab.moe.routing` -- token counts per expert for the speed sweep (balanced or
  skewed), and the all-to-all launch of the expert-parallel section.

The chapter writes the MoE layer itself, the router calls, the training loop and the
``all_to_all_single`` exchange in its own cells; nothing here hides TE's API.
"""

from fp8lab.moe.memory import MoEShape, moe_layer_bytes, padded_rows
from fp8lab.moe.routing import skewed_counts

__all__ = ["MoEShape", "moe_layer_bytes", "padded_rows", "skewed_counts"]
