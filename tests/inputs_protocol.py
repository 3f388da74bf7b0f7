"""Property-test entries for fp8lab.protocol, fp8lab.recipes and the one clock (read by
tests/test_inputs.py)."""

from __future__ import annotations

import hypothesis.strategies as st

from fp8lab import protocol, recipes, speedometer
from fp8lab.reference import recipe as reference_recipe
from tests.property_support import Entry, ints, maybe, reals

_FLOOR = protocol.Floor("device", 0.02, 3, 1)
_RATIOS = st.lists(reals(0.5, 2.0), min_size=1, max_size=6)
_NAMES = st.sampled_from(["fp8_vs_bf16_fc1", "nn_vs_tn_smallest"])  # one with its own floor
_SEEDS = st.dictionaries(st.integers(0, 9), reals(0.5, 5.0), min_size=1, max_size=8)


def _clock(marks):
    clock = speedometer.Clock("cpu")
    for _ in range(marks):
        clock.mark()
    return clock.read(), clock.host_ms


ENTRIES = {
    "protocol.mean_interval": Entry(
        lambda values: protocol.mean_interval(values)[0],
        {"values": maybe(st.lists(reals(-10, 10), min_size=1, max_size=6))},
        signed=True,
    ),
    "protocol.ratio_interval": Entry(
        lambda ratios: protocol.ratio_interval(ratios)[0], {"ratios": maybe(_RATIOS)}
    ),
    "protocol.unpaired_ratio_interval": Entry(
        lambda numerator, denominator: protocol.unpaired_ratio_interval(numerator, denominator)[0],
        {"numerator": maybe(_RATIOS), "denominator": maybe(_RATIOS)},
    ),
    "protocol.detectable_difference": Entry(
        protocol.detectable_difference,
        {"sd": maybe(reals(0, 1)), "n": maybe(ints(2, 20))},
    ),
    "protocol.speed_verdict": Entry(
        lambda estimate, floor: protocol.speed_verdict(estimate, 0.9, 1.1, floor),
        {"estimate": maybe(reals(0.5, 2.0)), "floor": maybe(reals(0, 0.1))},
    ),
    "protocol.floor_for": Entry(
        lambda regime: protocol.floor_for(regime).regime,
        {"regime": maybe(st.sampled_from(["device", "host", "kernel"]))},
    ),
    "protocol.floor_of": Entry(
        lambda name, regime: protocol.floor_of(name, regime).relative,
        {"name": maybe(_NAMES), "regime": maybe(st.sampled_from(["device", "host", "kernel"]))},
    ),
    "protocol.judged": Entry(
        lambda name, ratios: protocol.judged(
            name, protocol.Comparison("a", "b", ratios, "wall", "device", _FLOOR)
        ).estimate,
        {"name": maybe(_NAMES), "ratios": maybe(_RATIOS.map(tuple))},
    ),
    "protocol.Floor": Entry(
        lambda relative: str(protocol.Floor("device", relative, 3, 1)),
        {"relative": maybe(reals(0, 0.1))},
    ),
    "protocol.Comparison": Entry(
        lambda ratios: protocol.Comparison("a", "b", ratios, "wall", "device", _FLOOR)
        .record()["estimate"],
        {"ratios": maybe(_RATIOS.map(tuple))},
    ),
    "protocol.Rounds": Entry(
        lambda value: protocol.Rounds.from_times({"a": [[value], [1.0]], "b": [[2.0], [2.0]]})
        .compare("a", "b")
        .estimate,
        {"value": maybe(reals(0.1, 10))},
        aliases={"value": ["call time", "times"]},
    ),
    "protocol.rounds": Entry(
        lambda rounds, calls, order: protocol.rounds(
            {"a": lambda: None, "b": lambda: None},
            rounds=rounds,
            calls=calls,
            warmup=0,
            order=order,
            device="cpu",
        ).median_ms("a"),
        {
            "rounds": maybe(ints(2, 3)),
            "calls": maybe(ints(1, 2)),
            "order": maybe(st.sampled_from(["reverse", "shuffle"])),
        },
        examples=10,
    ),
    "protocol.paired": Entry(
        lambda treated, margin: protocol.paired(
            treated, {s: 1.0 for s in range(10)}, margin=margin, min_seeds=2
        ).mean,
        {"treated": maybe(_SEEDS), "margin": maybe(reals(1e-3, 1))},
        signed=True,
    ),
    "protocol.Paired": Entry(
        lambda margin: protocol.Paired("a", "b", (0, 1, 2), (0.1, 0.2, 0.15), margin).verdict,
        {"margin": maybe(reals(1e-3, 1))},
    ),
    "protocol.paired_summary": Entry(
        lambda treated, margin: protocol.paired_summary(
            treated, {s: 1.0 for s in range(10)}, margin=margin
        )["mean"],
        {"treated": maybe(_SEEDS), "margin": maybe(reals(1e-3, 1))},
        signed=True,
    ),
    "recipes.make": Entry(
        lambda recipe_module, name: type(recipes.make(recipe_module, name)).__name__,
        {
            "recipe_module": maybe(st.just(reference_recipe)),
            "name": maybe(st.sampled_from(recipes.NAMES)),
        },
    ),
    "recipes.label": Entry(recipes.label, {"name": maybe(st.sampled_from(recipes.NAMES))}),
    "speedometer.Clock": Entry(_clock, {"marks": ints(0, 3)}, examples=5),
    "speedometer.time_calls": Entry(
        lambda calls, device: speedometer.time_calls(lambda: None, calls, device),
        {"calls": maybe(ints(1, 3)), "device": maybe(st.just("cpu"))},
        examples=10,
    ),
    "speedometer.CallTimes": Entry(
        lambda calls: speedometer.time_calls(lambda: None, calls, "cpu").host_ms,
        {"calls": maybe(ints(1, 3))},
        examples=5,
    ),
}
