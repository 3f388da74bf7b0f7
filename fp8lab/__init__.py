"""fp8lab: the helper package of the book *Training transformers in FP8 with Transformer Engine*.

Small modules, one idea each, so the notebooks show the idea and not the plumbing:

* :mod:`fp8lab.environment` -- GPU, torch, TE and FP8 support here; the size preset; the banner
* :mod:`fp8lab.hardware` -- datasheet peaks and measured ceilings (chapter 00)
* :mod:`fp8lab.speedometer` -- timing with warm-up, device events, median and spread
* :mod:`fp8lab.lane` -- the GPU lane: execute, stamp and check the chapters
* :mod:`fp8lab.book` -- glue numbers from a run into the prose
"""

__version__ = "0.1.0"

from fp8lab.book import glue
from fp8lab.environment import banner, by_preset, detect, import_te, preset

__all__ = ["__version__", "banner", "by_preset", "detect", "glue", "import_te", "preset"]
