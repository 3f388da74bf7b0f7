"""The chapter's models and memory probes, in one place.

:class:`ModelKit` holds what every measurement of chapter 06 shares -- TE (or the CPU reference),
the device, the parameter dtype and the two model shapes -- and builds, seeded:

* :meth:`ModelKit.stack`: L ``te.TransformerLayer``\\ s (``fp8lab.layers.build_layer``), the model
  that is timed and whose memory is read;
* :meth:`ModelKit.gpt`: the small ``fp8lab.models.GPT`` that trains;
* both optionally under ``te.quantized_model_init`` (FP8 weights) and with grad mode off.

The optimizer (TE's ``FusedAdam``) is built in the chapter's cells, where the reader sees it.

:meth:`ModelKit.allocated` and :meth:`ModelKit.fresh` are the memory probes: bytes held by live
tensors (NaN without a CUDA allocator) and a clean slate before each measurement. Building a
CUDA kit freezes the objects alive at that moment (``gc.freeze``) so that the probes'
collections stay cheap.
"""

from __future__ import annotations

import contextlib
import gc
import math
from dataclasses import dataclass
from typing import Any

import torch

from fp8lab.config import TransformerConfig, require_config


@dataclass
class ModelKit:
    """TE, the device and the chapter's two model shapes (``stack_cfg``, ``gpt_cfg``)."""

    te: Any
    device: torch.device
    dtype: torch.dtype
    stack_cfg: TransformerConfig
    gpt_cfg: TransformerConfig

    def __post_init__(self):
        require_config(self.stack_cfg)
        require_config(self.gpt_cfg)
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"dtype={self.dtype!r}: must be a torch.dtype")
        self.device = torch.device(self.device)
        # The probes below collect garbage before every reading. A full collection walks every
        # object alive, and after importing torch, TE, pandas and matplotlib that is millions of
        # them (about 0.2 s per collection on the GPU machine). Nothing alive now is the
        # chapter's garbage, so move it out of the collector's reach: later collections then
        # walk only what the chapter made. (On a GPU only: a CPU has no allocator to read.)
        if self.cuda:
            gc.collect()
            gc.freeze()

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def allocated(self) -> float:
        """Bytes held by live tensors; NaN on a CPU (no device allocator to ask)."""
        gc.collect()
        if not self.cuda:
            return math.nan
        torch.cuda.synchronize()
        return float(torch.cuda.memory_allocated())

    def fresh(self) -> None:
        """Free what earlier cells left, so that the next measurement starts clean."""
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def fp8_init(self, fp8_weights=None):
        """``te.quantized_model_init`` for a recipe; nothing for ``None``."""
        if fp8_weights is None:
            return contextlib.nullcontext()
        return self.te.quantized_model_init(enabled=True, recipe=fp8_weights)

    def stack(self, fp8_weights=None, params_dtype=None, grad: bool = True, **kwargs):
        """The layer stack, seeded; FP8 weights when given a recipe."""
        from fp8lab.layers import build_layer

        torch.manual_seed(0)
        dtype = params_dtype or self.dtype
        with self.fp8_init(fp8_weights), torch.set_grad_enabled(grad):
            return torch.nn.Sequential(*(
                build_layer("te_layer", self.stack_cfg, self.te, params_dtype=dtype,
                            device=self.device, **kwargs)
                for _ in range(self.stack_cfg.num_layers)))

    def gpt(self, fp8_weights=None, params_dtype=None, grad: bool = True, seed: int = 0,
            **kwargs):
        """The small GPT (``te.TransformerLayer`` layers, no dropout), seeded."""
        from fp8lab.models import GPT

        torch.manual_seed(seed)
        with self.fp8_init(fp8_weights), torch.set_grad_enabled(grad):
            return GPT(self.gpt_cfg, form="te_layer", te=self.te,
                       params_dtype=params_dtype or self.dtype, device=self.device,
                       hidden_dropout=0.0, attention_dropout=0.0, **kwargs)


def n_params(model: torch.nn.Module) -> int:
    """Number of parameters of ``model``."""
    return sum(p.numel() for p in model.parameters())
