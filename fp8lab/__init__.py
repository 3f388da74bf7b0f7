"""fp8lab: the helper package of the book *Training transformers in FP8 with Transformer Engine*.

Small modules, one idea each, so the notebooks show the idea and not the plumbing. Three tiers:

Core (every chapter may use it):

* :mod:`fp8lab.environment` -- GPU, torch, TE, cuDNN and FP8 support here; the size preset; the
  banner; ``import_te()`` (real TE on a GPU, the CPU reference elsewhere); ``setup()``
* :mod:`fp8lab.doctor` -- ``python -m fp8lab.doctor``: is this machine ready (one cuDNN, FP8
  smoke tests)?
* :mod:`fp8lab.devices` -- the one home of the default device and of device-string checks
* :mod:`fp8lab.datasheet`, :mod:`fp8lab.ceilings`, :mod:`fp8lab.roofline` -- datasheet peaks
  (pure data); measured rates of the GPU at hand; ridge points and the roofline plot
* :mod:`fp8lab.speedometer`, :mod:`fp8lab.profiling` -- timing on the book's one clock
  (warm-up, device events, median and spread); where a step's time goes, by kind of kernel,
  with idle time
* :mod:`fp8lab.protocol` -- the one measurement protocol: rounds, intervals, verdict words,
  the session floor; every kit's comparison goes through it
* :mod:`fp8lab.recipes` -- the FP8 recipes by one set of names, their labels, and ``make``
* :mod:`fp8lab.config`, :mod:`fp8lab.layers`, :mod:`fp8lab.models` -- shapes and presets; one
  layer in four forms; a GPT
* :mod:`fp8lab.training` -- the loss, one training step (``step``), gradient accumulation,
  the loop and the seed band
* :mod:`fp8lab.flops`, :mod:`fp8lab.memory`, :mod:`fp8lab.parts` -- FLOPs, MFU and
  time-to-train; the memory tree of a training step (arithmetic only) and its part names
* :mod:`fp8lab.formats`, :mod:`fp8lab.data`, :mod:`fp8lab.capture`, :mod:`fp8lab.corpus` -- FP8
  bit layouts and scales; a learnable synthetic task; the tensors of a step; real text
* :mod:`fp8lab.book`, :mod:`fp8lab.checks`, :mod:`fp8lab.stamp` -- glue, tables and number
  formats for the prose; shared input checks; making the stamps of GPU outputs (which code made
  them, where)

Chapter kits (a subpackage named for the chapter it serves):

* :mod:`fp8lab.attention` -- chapter 05's backends, their selection log and timed rows
* :mod:`fp8lab.distributed`, :mod:`fp8lab.collectives`, :mod:`fp8lab.parallel` -- chapter 08:
  launching torchrun, what communication costs, and the worker processes (each layout's TE code
  in :mod:`fp8lab.parallel.layouts`)
* :mod:`fp8lab.e2e` -- chapter 09's long runs and alternated speed rounds
* :mod:`fp8lab.workshop` -- the workshop's exercises and the grader of numeric answers
  (``fp8lab.workshop.check``, loaded on first use)

CPU reference:

* :mod:`fp8lab.reference` -- the subset of Transformer Engine's API the notebooks use, with FP8
  numerics, in plain PyTorch; used only where TE cannot run

Book machinery is not here but in ``tools/``: the GPU lane and the checking of stamps, the
workshop's agendas and page writers. Every module imports on a CPU machine without Transformer
Engine.

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

# Kits a reader reaches as ``fp8lab.<name>`` without importing them first. Kept apart from
# _LAZY, whose modules every chapter's stamp hashes: a chapter does not run these.
_LAZY_KITS = ("workshop",)

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _LAZY_KITS:
        return importlib.import_module(f"fp8lab.{name}")
    raise AttributeError(f"module 'fp8lab' has no attribute {name!r}")
