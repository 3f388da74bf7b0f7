"""Property-test entries for fp8lab.weights (read by tests/test_inputs.py)."""

from __future__ import annotations

import hypothesis.strategies as st
import torch

from fp8lab import reference, weights
from fp8lab.profiling import Profile
from tests.property_support import TINY, Entry, ints, maybe, reals


def _rounds(rounds, iters):
    times = weights.alternate_rounds({"a": lambda: None, "b": lambda: None},
                                     rounds=rounds, iters=iters, warmup=0)
    return len(times.table())

ENTRIES = {
    "weights.ModelKit": Entry(
        lambda dtype: weights.ModelKit(reference, "cpu", dtype, TINY, TINY).stack_cfg.num_layers,
        {"dtype": maybe(st.sampled_from([torch.float32, torch.bfloat16]))},
        examples=10,
    ),
    "weights.alternate_rounds": Entry(
        _rounds, {"rounds": maybe(ints(1, 3)), "iters": maybe(ints(1, 3))}, examples=10
    ),
    "weights.RoundTimes": Entry(
        lambda value: weights.RoundTimes.from_times({"a": [[value], [1.0]], "b": [[1.0], [2.0]]})
        .ratio("a", "b")[0],
        {"value": maybe(reals())},
        aliases={"value": ["call time"]},
        examples=10,
    ),
    "weights.attempt": Entry(lambda value: weights.attempt(lambda: value)[0], {"value": reals()}),
    "weights.change": Entry(
        lambda value, digits: weights.change(value, digits=digits),
        {"value": maybe(st.floats(-1e6, 1e6)), "digits": maybe(ints(0, 4))},
    ),
    "weights.ratio_words": Entry(
        lambda ratio: weights.ratio_words(ratio, 0.01, 100.0),
        {"ratio": maybe(reals(0.01, 100))},
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
ENTRIES["weights.paired_difference"] = Entry(
    lambda shift, margin: weights.paired_difference([1.0 + shift, 2.0, 3.0], [1.0, 2.0, 3.1],
                                                    margin)["mean"],
    {"shift": st.floats(0, 1), "margin": maybe(reals(0, 1))},
    signed=True,
)
ENTRIES["weights.count_words"] = Entry(
    lambda count: len(weights.count_words(count, "step")), {"count": maybe(ints(0, 100))}
)
ENTRIES["weights.smallest_words"] = Entry(
    lambda value: len(weights.smallest_words({"a": value, "b": 1.0})),
    {"value": maybe(reals())},
    aliases={"value": ["values"]},
)
ENTRIES["weights.spread_words"] = Entry(
    lambda value: len(weights.spread_words([value, 1.0, 1.0], "step")),
    {"value": maybe(reals())},
    aliases={"value": ["times_ms"]},
)
ENTRIES["weights.profiled_calls"] = Entry(
    lambda iters: len(weights.profiled_calls(lambda: None, iters=iters).times_ms),
    {"iters": maybe(ints(1, 3))},
    examples=5,
)
ENTRIES["weights.ProfiledCalls"] = Entry(
    lambda value: weights.ProfiledCalls((value,), Profile((), {}, {}, 1, "cpu")).median_ms,
    {"value": maybe(reals())},
    aliases={"value": ["times_ms"]},
    examples=10,
)
