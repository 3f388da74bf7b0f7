"""Property-test entries for fp8lab.weights (read by tests/test_inputs.py)."""

from __future__ import annotations

import hypothesis.strategies as st
import torch

from fp8lab import reference, weights
from tests.property_support import TINY, Entry, ints, maybe, reals


def _guarded(model):
    with weights.capture_guard(model) as guarded:
        return len(list(guarded.parameters()))

ENTRIES = {
    "weights.ModelKit": Entry(
        lambda dtype: weights.ModelKit(reference, "cpu", dtype, TINY, TINY).stack_cfg.num_layers,
        {"dtype": maybe(st.sampled_from([torch.float32, torch.bfloat16]))},
        examples=10,
    ),
    "weights.attempt": Entry(lambda value: weights.attempt(lambda: value)[0], {"value": reals()}),
    "weights.change": Entry(
        lambda value, digits: weights.change(value, digits=digits),
        {"value": maybe(st.floats(-1e6, 1e6)), "digits": maybe(ints(0, 4))},
    ),
    "weights.fsdp_gather_bytes": Entry(
        weights.fsdp_gather_bytes,
        {
            "n_params": maybe(ints(1, 10**9)),
            "world": maybe(ints(2, 64)),
            "weights": maybe(st.sampled_from(["bf16", "fp8"])),
            "grads": maybe(st.sampled_from(["bf16", "fp32"])),
        },
    ),
    "weights.largest_layers": Entry(
        lambda seq, memory_bytes: getattr(
            weights.largest_layers(TINY, seq, memory_bytes, max_layers=64), "num_layers", 0
        ),
        {"seq": maybe(ints(1, 16)), "memory_bytes": maybe(reals(1e9, 1e12))},
        examples=10,
    ),
}
ENTRIES["weights.capture_guard"] = Entry(
    _guarded, {"model": maybe(st.just(torch.nn.Linear(2, 2)))}, examples=5
)
ENTRIES["weights.count_words"] = Entry(
    lambda count: len(weights.count_words(count, "step")), {"count": maybe(ints(0, 100))}
)
ENTRIES["weights.smallest_words"] = Entry(
    lambda value: len(weights.smallest_words({"a": value, "b": 1.0})),
    {"value": maybe(reals())},
    aliases={"value": ["values"]},
)
