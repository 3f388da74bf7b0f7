"""fp8lab: the helper package of the book *Training transformers in FP8 with Transformer Engine*.

Small modules, one idea each, so the notebooks show the idea and not the plumbing:

* :mod:`fp8lab.environment` -- GPU, torch, TE and FP8 support here; the size preset; the banner;
  ``import_te()`` (real TE on a GPU, the CPU reference elsewhere)
* :mod:`fp8lab.doctor` -- ``python -m fp8lab.doctor``: is this machine ready (one cuDNN, FP8 smoke
  tests)?
* :mod:`fp8lab.datasheet` -- datasheet peaks of common GPUs (pure data)
* :mod:`fp8lab.ceilings` -- measured matrix-product rates and copy bandwidth (chapter 00)
* :mod:`fp8lab.roofline` -- ridge points, attainable rates, the roofline plot (chapters 00, 04)
* :mod:`fp8lab.speedometer` -- timing with warm-up, device events, median and spread
* :mod:`fp8lab.config`, :mod:`fp8lab.layers`, :mod:`fp8lab.models` -- transformer shapes with
presets;
  one layer in four forms (PyTorch, ``te.Linear``, TE fused modules, ``te.TransformerLayer``); a GPT
* :mod:`fp8lab.training` -- the loss and the training loop the chapters share
* :mod:`fp8lab.profiling` -- where a step's time goes, by kind of kernel (chapter 03)
* :mod:`fp8lab.flops`, :mod:`fp8lab.memory` -- FLOPs, MFU and time-to-train; the memory tree
* :mod:`fp8lab.formats` -- FP8 bit layouts, rounding, range and scales (chapter 01)
* :mod:`fp8lab.data`, :mod:`fp8lab.capture` -- a learnable synthetic task; tensors of a training
step
* :mod:`fp8lab.corpus` -- real text without a download (the standard library's source), a BPE
  tokenizer, packed batches (chapter 09)
* :mod:`fp8lab.distributed`, :mod:`fp8lab.parallel`, :mod:`fp8lab.collectives` -- runs on
  several GPUs (torchrun), the processes they start (each layout's TE code in
  :mod:`fp8lab.parallel.layouts`), and what communication costs (chapter 08)
* :mod:`fp8lab.reference` -- a CPU reference of Transformer Engine's API and FP8 numerics
* :mod:`fp8lab.book` -- glue and number formats for the prose; progress bars for the terminal
* :mod:`fp8lab.checks` -- the input checks every entry point shares

The names below are imported on first use, so that ``import fp8lab.flops`` (arithmetic) loads
neither torch's GPU machinery nor the environment probe.
"""

import importlib

__version__ = "0.2.0"

_LAZY = {
    "banner": "fp8lab.environment",
    "setup": "fp8lab.environment",
    "by_preset": "fp8lab.environment",
    "detect": "fp8lab.environment",
    "import_te": "fp8lab.environment",
    "preset": "fp8lab.environment",
    "glue": "fp8lab.book",
}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fp8lab' has no attribute {name!r}")
