"""``FusedAdam``'s state options and what each costs per parameter.

TE's ``FusedAdam`` (``optimizers/fused_adam.py``, TE 2.20) keeps three tensors per parameter:
the first and second moments (``exp_avg``, ``exp_avg_sq``: FP32, FP16, BF16 or FP8 as
``torch.uint8`` with a per-tensor scale) and, with ``master_weights=True``, a master copy
(``master_weight_dtype``: FP32 or FP16). ``store_param_remainders=True`` (BF16 parameters, FP32
master weights) keeps only the 16 low bits that BF16 drops, as ``int16``: the FP32 master value
is the BF16 parameter's bits followed by them.

An FP8 moment costs more than its one byte on Hopper. ``FusedAdam._initialize_state`` stores it
as a ``Float8Tensor`` made by ``Float8Quantizer(scale, amax, E4M3).make_empty(shape)``, and a
``Float8Quantizer`` is built for row-wise *and* column-wise use unless told otherwise
(``tensor/float8_tensor.py``). On a GPU whose FP8 GEMMs take only the TN layout (TE's
``is_non_tn_fp8_gemm_supported()`` is False: Ada and Hopper) the column-wise use is a separate
transpose, allocated with the data: two bytes per parameter per FP8 moment, although no GEMM
ever reads an optimizer state. On Blackwell one buffer serves both uses (one byte).

:func:`expected_bytes` says what each setting should hold per parameter; chapter 06 measures
what it does hold, in its own cells (the bytes ``torch.cuda.memory_allocated`` gains over the
first ``step``, when TE creates the state).
"""

from __future__ import annotations

import torch

from fp8lab import checks

__all__ = ["expected_bytes"]

_SIZE = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2, torch.uint8: 1}


def expected_bytes(options: dict, fp8_transpose: bool = True) -> float:
    """State bytes per parameter that ``FusedAdam(**options)`` allocates for a BF16 parameter
    (master copy plus both moments), by TE 2.20's source; ``fp8_transpose``: FP8 moments carry
    a transpose (GPUs with TN-only FP8 GEMMs, as Hopper; see the module's docstring)."""
    checks.flag("fp8_transpose", fp8_transpose)
    if not isinstance(options, dict):
        raise TypeError(f"options={options!r}: must be a dict of FusedAdam keyword arguments")
    unknown = set(options) - {"exp_avg_dtype", "exp_avg_sq_dtype", "master_weight_dtype",
                              "master_weights", "store_param_remainders"}
    if unknown:
        raise ValueError(f"options: unknown FusedAdam state options {sorted(unknown)}")
    moments = 0
    for name in ("exp_avg_dtype", "exp_avg_sq_dtype"):
        dtype = options.get(name, torch.float32)
        if dtype not in _SIZE:
            raise ValueError(f"options[{name!r}]={dtype}: must be one of {list(_SIZE)}")
        moments += _SIZE[dtype] * (2 if dtype == torch.uint8 and fp8_transpose else 1)
    if not options.get("master_weights", True):
        return float(moments)
    if options.get("store_param_remainders", False):
        return float(moments + 2)
    master = options.get("master_weight_dtype", torch.float32)
    if master not in (torch.float32, torch.float16):
        raise ValueError(f"options['master_weight_dtype']={master}: must be FP32 or FP16")
    return float(moments + _SIZE[master])
