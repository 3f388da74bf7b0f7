"""fp8lab: the helper package of the book *Training transformers in FP8 with Transformer Engine*.

Small modules, one idea each, so the notebooks show the idea and not the plumbing:

* :mod:`fp8lab.environment` -- GPU, torch, TE and FP8 support here; the size preset; the banner;
  ``import_te()`` (real TE on a GPU, the CPU reference elsewhere)
* :mod:`fp8lab.hardware` -- datasheet peaks and measured ceilings (chapter 00)
* :mod:`fp8lab.speedometer` -- timing with warm-up, device events, median and spread
* :mod:`fp8lab.config`, :mod:`fp8lab.layers`, :mod:`fp8lab.models` -- transformer shapes with presets;
  one layer in four forms (PyTorch, ``te.Linear``, TE fused modules, ``te.TransformerLayer``); a small GPT
* :mod:`fp8lab.profiling` -- where a step's time goes, by kind of kernel (chapter 03)
* :mod:`fp8lab.flops`, :mod:`fp8lab.memory` -- FLOPs, MFU and time-to-train; the memory tree
* :mod:`fp8lab.formats` -- FP8 bit layouts, rounding and range (chapter 01)
* :mod:`fp8lab.data`, :mod:`fp8lab.capture` -- a learnable synthetic task; tensors of a training step
* :mod:`fp8lab.reference` -- a CPU reference of Transformer Engine's API and FP8 numerics
* :mod:`fp8lab.lane`, :mod:`fp8lab.book` -- the GPU lane's stamps; glue for the prose
* :mod:`fp8lab.memory_check`, :mod:`fp8lab.speedometer_check` -- checks run on a GPU box
"""

__version__ = "0.1.0"

from fp8lab.book import glue
from fp8lab.environment import banner, by_preset, detect, import_te, preset

__all__ = ["__version__", "banner", "by_preset", "detect", "glue", "import_te", "preset"]
