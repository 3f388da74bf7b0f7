"""Plumbing around CUDA-graph capture: a guard for the model's class and words for a refusal.

Chapter 06 captures the layer stack with ``te.make_graphed_callables`` in a visible cell. Two
things around that call are plumbing, kept here:

* :func:`capture_guard` -- TE wraps the ``__call__`` of the captured module's *class* while it
  captures (``pytorch/graph.py``, TE 2.20). A capture that raises can leave that wrapper on
  the class, and for a ``torch.nn.Sequential`` every later ``Sequential`` of the process would
  call it. The guard puts the class's own ``__call__`` back when the block ends, whatever
  happened.
* :func:`attempt` -- runs a risky call and turns an exception into the words of a table row.

PyTorch (2.9 and later) warns that a graphed backward hands the weight gradients from the
capture's side stream to ``AccumulateGrad`` nodes made on the default stream; the
synchronisation it names is part of what the step's time measures. :data:`STREAM_MISMATCH` is
the start of that message, for a ``warnings`` filter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

STREAM_MISMATCH = "The AccumulateGrad node's stream does not match"

__all__ = ["STREAM_MISMATCH", "attempt", "capture_guard"]


def attempt(fn: Callable[[], Any]) -> tuple[Any, str | None]:
    """``(fn(), None)``, or ``(None, "refused: <error>")`` if it raises (the error's first line,
    no closing period)."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    try:
        return fn(), None
    except Exception as error:  # a refusal becomes a row of the page, not a dead notebook
        # its first line, without a closing period: the words go into sentences and cells
        first = (str(error).strip().splitlines() or [""])[0][:120].rstrip(". ")
        return None, f"refused: {type(error).__name__}: {first}"


@contextlib.contextmanager
def capture_guard(model: torch.nn.Module):
    """Restore the ``__call__`` that ``type(model)`` had on entry when the block ends."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    cls = type(model)
    own_call = cls.__dict__.get("__call__")
    try:
        yield model
    finally:
        if own_call is None:
            if "__call__" in cls.__dict__:
                delattr(cls, "__call__")
        else:
            cls.__call__ = own_call
