"""Property-test entries for ``fp8lab.moe`` (the byte estimate, padding and skewed counts) and
for ``fp8lab.memory.offload_overhead_ms`` (imported by tests/test_inputs.py)."""

from __future__ import annotations

import hypothesis.strategies as st

from fp8lab import memory, moe
from tests.property_support import Entry, ints, maybe, reals

SHAPE = moe.MoEShape(64, 32, 48, 8, 2)


def _offload(layer_bytes, offloaded, layers, forward_ms, backward_ms, d2h_gb_s, h2d_gb_s):
    return memory.offload_overhead_ms(layer_bytes, offloaded, layers, forward_ms, backward_ms,
                                      d2h_gb_s, h2d_gb_s)["total"]


ENTRIES = {
    "memory.offload_overhead_ms": Entry(
        _offload,
        {
            "layer_bytes": maybe(reals(0, 1e10)),
            "offloaded": maybe(ints(0, 3)),
            "layers": maybe(ints(4, 48)),
            "forward_ms": maybe(reals(0, 1e3)),
            "backward_ms": maybe(reals(0, 1e3)),
            "d2h_gb_s": maybe(reals(1, 100)),
            "h2d_gb_s": maybe(reals(1, 100)),
        },
    ),
    "moe.MoEShape": Entry(
        lambda T, H, F, E, k: moe.MoEShape(T, H, F, E, k).T * 0 + 1,
        {
            "T": maybe(ints(1, 4096)),
            "H": maybe(ints(1, 512)),
            "F": maybe(ints(1, 512)),
            "E": maybe(ints(4, 64)),
            "k": maybe(ints(1, 4)),
        },
    ),
    "moe.moe_layer_bytes": Entry(
        lambda shape, recipe, param_bytes: sum(
            moe.moe_layer_bytes(shape, recipe, param_bytes=param_bytes).values()),
        {
            "shape": maybe(st.just(SHAPE)),
            "recipe": maybe(st.sampled_from(["bf16", "delayed", "current", "block"])),
            "param_bytes": maybe(st.sampled_from([1, 2, 4])),
        },
    ),
    "moe.padded_rows": Entry(
        moe.padded_rows,
        {
            "tokens_per_expert": maybe(st.lists(ints(0, 300), min_size=1, max_size=16)),
            "align": maybe(st.sampled_from([1, 8, 16, 128])),
        },
    ),
    "moe.skewed_counts": Entry(
        lambda rows, experts, imbalance: sum(moe.skewed_counts(rows, experts, imbalance)),
        {
            "rows": maybe(ints(0, 10_000)),
            "experts": maybe(ints(8, 64)),
            "imbalance": maybe(reals(1, 8)),
        },
    ),
}
