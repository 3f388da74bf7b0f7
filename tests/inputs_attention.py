"""Property-test entries for the attention pieces: ``fp8lab.attention`` and the attention FLOPs
of ``fp8lab.flops`` (imported by tests/test_inputs.py)."""

from __future__ import annotations

import hypothesis.strategies as st
import torch

from fp8lab import attention, flops
from tests.property_support import Entry, ints, maybe

MASKS = st.sampled_from(flops.ATTENTION_MASKS)
WINDOWS = st.sampled_from([None, (-1, -1), (-1, 0), (0, 0), (7, 0), (3, 5), (64, 0)])
SHAPE = attention.AttentionShape(1, 16, 2, 8, groups=1)
DEVICES = st.sampled_from([None, "cpu", torch.device("cpu")])


def _qkv(groups, kv_dtype):
    """q [1, 12, 4, 8] in FP32; k and v with ``groups`` heads in ``kv_dtype`` (FP64 differs from
    q's dtype), or the junk itself in their place."""
    torch.manual_seed(0)
    if not isinstance(groups, int) or groups <= 0:
        kv_dtype = groups
    if not isinstance(kv_dtype, torch.dtype):
        return torch.randn(1, 12, 4, 8), kv_dtype, kv_dtype
    k, v = (torch.randn(1, 12, groups, 8, dtype=kv_dtype) for _ in range(2))
    return torch.randn(1, 12, 4, 8), k, v


def _explicit(groups, kv_dtype, mask, window_size, dropout_p):
    return attention.explicit_attention(
        *_qkv(groups, kv_dtype), mask=mask, window_size=window_size, dropout_p=dropout_p
    )


def _shape(batch, seq, heads, head_dim, groups, mask, window_size, dropout):
    return attention.AttentionShape(
        batch, seq, heads, head_dim, groups, mask, window_size, dropout
    ).flops()


# explicit_attention's arguments and their rules
ATTENTION_CALL = {
    "args": {
        "groups": maybe(st.sampled_from([1, 2, 4])),
        "kv_dtype": maybe(st.sampled_from([torch.float32, torch.float32, torch.float64])),
        "mask": maybe(MASKS),
        "window_size": maybe(WINDOWS),
        "dropout_p": maybe(st.sampled_from([0.0, 0.1])),
    },
    "aliases": {"groups": ["k ", "heads", "q "], "kv_dtype": ["k ", "dtype"]},
    "signed": True,
    "examples": 20,
}

ENTRIES = {
    "flops.ATTENTION_MASKS": Entry(lambda: len(flops.ATTENTION_MASKS), {}, examples=2),
    "flops.attention_window": Entry(
        flops.attention_window,
        {"mask": maybe(MASKS), "window_size": maybe(WINDOWS)},
        signed=True,  # -1: no limit on that side
    ),
    "flops.attended_pairs": Entry(
        flops.attended_pairs,
        {"seq": maybe(ints(1, 5000)), "mask": maybe(MASKS), "window_size": maybe(WINDOWS)},
    ),
    "flops.attention_core_flops": Entry(
        flops.attention_core_flops,
        {
            "batch": maybe(ints()),
            "heads": maybe(st.sampled_from([8, 16, 32])),
            "seq": maybe(ints(1, 40000)),
            "head_dim": maybe(st.sampled_from([64, 128, 256])),
            "mask": maybe(MASKS),
            "window_size": maybe(WINDOWS),
            "groups": maybe(st.sampled_from([None, 1, 8])),
            "backward": maybe(st.booleans()),
            "backward_factor": maybe(st.sampled_from([2.0, 2.5])),
        },
        aliases={"heads": ["groups"], "groups": ["heads"]},
    ),
    "attention.AttentionShape": Entry(
        _shape,
        {
            "batch": maybe(ints(1, 4)),
            "seq": maybe(ints(1, 4096)),
            "heads": maybe(st.sampled_from([4, 8])),
            "head_dim": maybe(st.sampled_from([64, 128])),
            "groups": maybe(st.sampled_from([None, 1, 2, 4])),
            "mask": maybe(MASKS),
            "window_size": maybe(WINDOWS),
            "dropout": maybe(st.sampled_from([0.0, 0.1])),
        },
        aliases={"heads": ["groups"], "groups": ["heads"]},
    ),
    "attention.window_mask": Entry(
        attention.window_mask,
        {
            "seq": maybe(ints(1, 64)),
            "mask": maybe(MASKS),
            "window_size": maybe(WINDOWS),
            "device": maybe(DEVICES),
        },
    ),
    "attention.explicit_attention": Entry(_explicit, **ATTENTION_CALL),
    "attention.SelectionLog": Entry(
        lambda title: attention.SelectionLog(title, error="x").summary(),
        {"title": maybe(st.just("case"))},
    ),
    "attention.te_selection_logs": Entry(
        lambda shape, recipe, timeout_s: attention.te_selection_logs(
            [{"shape": shape, "recipe": recipe}], timeout_s=timeout_s
        ),
        {
            "shape": maybe(st.just(SHAPE)),
            "recipe": maybe(st.sampled_from([None, "delayed", "current"])),
            "timeout_s": maybe(st.sampled_from([60.0, 300.0])),
        },
        aliases={"shape": ["cases"]},
        examples=8,
    ),
    "attention.copy_batches": Entry(
        lambda vocab_size, batch, half, steps, seed: len(
            attention.copy_batches(vocab_size, batch, half, steps, seed=seed, device="cpu")
        ),
        {
            "vocab_size": maybe(ints(2, 64)),
            "batch": maybe(ints(1, 3)),
            "half": maybe(ints(2, 8)),
            "steps": maybe(ints(1, 3)),
            "seed": maybe(ints(0, 5)),
        },
        examples=12,
    ),
}
