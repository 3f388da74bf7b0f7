"""FlexAttention for a sliding window: the fair PyTorch baseline beside TE's windowed kernels.

``F.scaled_dot_product_attention`` has no window argument; given the window as a dense boolean
mask, its kernels read and score the whole ``S x S`` square, so a dense-mask SDPA row is a
worst case, not a baseline. ``torch.nn.attention.flex_attention`` takes the window as a
``mask_mod`` and, through ``create_block_mask``, skips the tiles that lie wholly outside it;
under ``torch.compile`` it becomes one generated (Triton) kernel for the forward and one for
the backward. Eager ``flex_attention`` (no compile) runs the same mask with plain PyTorch
operations, which is how it runs on a CPU here.
"""

from __future__ import annotations

import warnings

import torch

from fp8lab import flops
from fp8lab.attention.functional import AttentionShape
from fp8lab.devices import resolve_device

__all__ = ["flex_step"]


def _mask_mod(left: int, right: int):
    """TE's window rule as a FlexAttention ``mask_mod``: key j within ``[i - left, i + right]``
    of query i (-1: no limit on that side)."""

    def mask_mod(batch, head, query, key):
        allowed = query >= 0  # all True, as a tensor of the traced kind
        if right >= 0:
            allowed = allowed & (key <= query + right)
        if left >= 0:
            allowed = allowed & (key >= query - left)
        return allowed

    return mask_mod


def flex_step(shape: AttentionShape, *, device=None, compile: bool | None = None):
    """One forward + backward of FlexAttention on fresh ``shape`` inputs (dropout must be 0), as
    a zero-argument callable. ``compile`` defaults to True on a GPU (``torch.compile`` of
    ``flex_attention``) and False elsewhere (eager). On a CPU the step is the forward alone:
    PyTorch's FlexAttention has no CPU backward."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if not isinstance(shape, AttentionShape):
        raise TypeError(f"shape must be an AttentionShape, not {type(shape).__name__}")
    if shape.dropout:
        raise ValueError(f"shape.dropout={shape.dropout}: FlexAttention has no dropout")
    device = resolve_device(device, default=True)
    if compile is None:
        compile = device.type == "cuda"
    elif not isinstance(compile, bool):
        raise TypeError(f"compile={compile!r}: must be True, False or None")
    left, right = flops.attention_window(shape.mask, shape.window_size)
    block_mask = create_block_mask(
        _mask_mod(left, right), None, None, shape.seq, shape.seq, device=str(device)
    )
    attend = torch.compile(flex_attention) if compile else flex_attention
    backward = device.type != "cpu"
    q, k, v = (
        t.detach().transpose(1, 2).requires_grad_(backward) for t in shape.make_inputs(device)
    )
    grad = torch.randn_like(q)
    gqa = shape.kv_groups != shape.heads

    def step() -> None:
        with warnings.catch_warnings():
            # eager on purpose (the CPU lane): PyTorch warns that eager materialises the scores
            warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
            out = attend(q, k, v, block_mask=block_mask, enable_gqa=gqa)
        if backward:
            out.backward(grad)
        for t in (q, k, v):
            t.grad = None

    return step
