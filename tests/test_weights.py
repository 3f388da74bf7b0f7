"""Chapter 06's library: sentences from signs, rounds, sizing, optimizer states, and the CPU
reference's FusedAdam without master weights (as TE 2.20)."""

from __future__ import annotations

import math

import pytest
import torch

from fp8lab import memory
from fp8lab.config import preset_config as preset
from fp8lab.weights import (
    alternate_rounds,
    attempt,
    change,
    fsdp_gather_bytes,
    largest_layers,
    ratio_words,
)
from fp8lab.weights.optimizer_states import STATE_OPTIONS, expected_bytes


def test_change_words_follow_the_sign_and_the_rounding():
    assert change(0.42) == "0.42 ms less"
    assert change(-0.1, "GiB", 1) == "0.1 GiB more"
    assert change(0.001).startswith("no change")
    assert change(math.nan) == "not measured"
    with pytest.raises(ValueError, match="value"):
        change(math.inf)


def test_ratio_words_say_the_protocols_verdict(measured_floors):
    assert ratio_words(1.12, 1.08, 1.16).endswith("(faster)")
    assert ratio_words(0.90, 0.88, 0.92, slower="caching slower").endswith("(caching slower)")
    # beyond 1 but inside the 5% host floor: no "faster"
    assert ratio_words(1.03, 1.02, 1.04) == "tied (1.02x-1.04x)"
    assert ratio_words(1.12, 0.97, 1.3).startswith("not resolved")  # the interval holds 1
    assert ratio_words(1.12, math.nan, math.nan).startswith("not resolved")  # one round
    assert ratio_words(math.nan, math.nan, math.nan) == "not measured"
    with pytest.raises(ValueError, match="low"):
        ratio_words(1.0, 1.2, 1.1)


def test_without_a_measured_floor_nothing_is_faster(monkeypatch):
    from fp8lab.protocol import floor

    monkeypatch.setattr(floor, "FLOORS", {})
    assert ratio_words(2.0, 1.9, 2.1).startswith("not resolved")


def test_alternate_rounds_follow_the_protocol():
    order = []
    steps = {"A": lambda: order.append("A"), "B": lambda: order.append("B")}
    times = alternate_rounds(steps, rounds=3, iters=2, warmup=1)
    # after one warm-up call of each, the order reverses every other round
    assert order[2:] == ["A", "A", "B", "B"] + ["B", "B", "A", "A"] + ["A", "A", "B", "B"]
    assert times.orders == (("A", "B"), ("B", "A"), ("A", "B"))
    ratio, low, high = times.ratio("A", "B")
    assert low <= ratio <= high
    table = times.table()
    assert list(table.index) == ["A", "B"] and table["GPU idle"].isna().all()
    assert len(times.flat("A")) == 6
    assert len(alternate_rounds(steps, rounds=1, iters=1, warmup=0).times["A"]) == 2
    with pytest.raises(ValueError, match="name"):
        times.median("C")


def test_a_round_times_ratio_is_the_protocols_comparison():
    from fp8lab.weights import RoundTimes

    times = RoundTimes.from_times({"slow": [[2.0], [2.2], [2.1]], "fast": [[1.0], [1.0], [1.1]]})
    found = times.compare("fast", "slow")
    assert times.ratio("slow", "fast") == (found.estimate, found.low, found.high)
    assert times.ratio("slow", "fast")[0] == pytest.approx((2.0 * 2.2 * 2.1 / 1.1) ** (1 / 3))
    assert times.median("slow") == 2.1


def test_largest_layers_fits_and_one_more_does_not():
    cfg = preset("llama3-8b")
    h200 = 141e9
    best = largest_layers(cfg, 4096, h200)
    budget = 0.9 * h200 - memory.CUDA_CONTEXT
    assert memory.estimate(best, 1, 4096).peak_bytes <= budget
    more = cfg.replace(num_layers=best.num_layers + 1)
    assert memory.estimate(more, 1, 4096).peak_bytes > budget
    assert largest_layers(cfg, 4096, 1e9) is None


def test_fsdp_fp8_gather_halves_the_weight_traffic():
    bf16 = fsdp_gather_bytes(1000, 2)
    fp8 = fsdp_gather_bytes(1000, 2, "fp8")
    assert fp8["all-gather"] * 2 == bf16["all-gather"] == 2000
    assert fp8["reduce-scatter"] == bf16["reduce-scatter"] == 1000
    with pytest.raises(ValueError, match="world"):
        fsdp_gather_bytes(1000, 1)


def test_expected_state_bytes():
    values = {label: expected_bytes(o) for label, o in STATE_OPTIONS.items()}
    assert values["FP32 master, FP32 moments (default)"] == 12
    assert values["FP32 master, FP8 moments"] == 8  # Hopper: each FP8 moment keeps a transpose
    assert expected_bytes(STATE_OPTIONS["FP32 master, FP8 moments"], fp8_transpose=False) == 6
    assert values["FP32 master as BF16 remainders"] == 10
    assert values["no master weights"] == 8
    with pytest.raises(ValueError, match="options"):
        expected_bytes({"lr": 1.0})


def test_attempt_turns_an_error_into_a_row():
    assert attempt(lambda: 3) == (3, None)
    value, reason = attempt(lambda: 1 / 0)
    assert value is None and reason.startswith("refused: ZeroDivisionError")

    def refuse():
        raise RuntimeError("Use master_weights=True.")

    assert attempt(refuse)[1] == "refused: RuntimeError: Use master_weights=True"


def test_words_agree_tie_and_locate_the_spread():
    from fp8lab.weights.words import count_words, smallest_words, spread_words

    assert count_words(1, "micro-batch") == "1 micro-batch"
    assert count_words(4, "micro-batch") == "4 micro-batches"
    assert smallest_words({"a": 12.0, "b": 8.0, "c": 7.99}) == "“b” and “c” tie at 8.0 B/param"
    assert smallest_words({"a": 12.0, "b": 6.0}) == "“b”, at 6.0 B/param"
    assert smallest_words({"a": math.nan}) == "not measured"
    one_slow = spread_words([96.0, 58.0, 57.0, 58.5], "step")
    assert one_slow.startswith("1 of 4 steps ran slow (the 1st: 96.0 ms")
    assert spread_words([1.0, 1.1, 0.9, 1.0]).endswith("scatter evenly around the median")


def test_profiled_calls_time_the_profiled_calls():
    from fp8lab.weights import profiled_calls

    calls = profiled_calls(lambda: torch.ones(64, 64) @ torch.ones(64, 64), iters=3)
    assert len(calls.times_ms) == 3 and calls.median_ms >= 0
    assert math.isnan(calls.idle_fraction)  # no kernels on a CPU
    times = alternate_rounds({"A": lambda: None}, rounds=2, iters=1, warmup=0)
    row = times.table({"A": calls}).loc["A"]
    assert row["profiled step (ms)"] == calls.mean_ms


def _fp8_linear(te, recipe):
    torch.manual_seed(0)
    with te.quantized_model_init(enabled=True, recipe=recipe):
        return te.Linear(16, 16, bias=False, params_dtype=torch.float32)


def _one_step(te, layer, recipe):
    optimizer = te.optimizers.FusedAdam(layer.parameters(), lr=0.1, master_weights=False)
    with te.autocast(enabled=True, recipe=recipe):
        layer(torch.randn(8, 16)).sum().backward()
    optimizer.step()


def test_reference_fused_adam_skips_delayed_fp8_weights_without_master_weights():
    from fp8lab import reference as te
    from fp8lab.reference.recipe import DelayedScaling, Float8CurrentScaling

    layer = _fp8_linear(te, DelayedScaling())
    before = layer.weight.detach().clone()
    _one_step(te, layer, DelayedScaling())
    assert torch.equal(layer.weight.detach(), before)  # silently not updated, as TE 2.20
    layer = _fp8_linear(te, Float8CurrentScaling())
    with pytest.raises(RuntimeError, match="master_weights"):
        _one_step(te, layer, Float8CurrentScaling())


def test_paired_difference_is_the_protocols():
    from fp8lab.weights import paired_difference

    same = paired_difference([1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0, 5.0], 0.01)
    assert same["verdict"] == "identical" and same["mean"] == 0
    close = paired_difference([1.001, 2.0, 3.001, 4.0, 5.0], [1.0, 2.001, 3.0, 4.001, 5.0], 0.05)
    assert close["verdict"] == "within the margin"
    far = paired_difference([1.5, 2.5, 3.6, 4.5, 5.55], [1.0, 2.0, 3.0, 4.0, 5.0], 0.05)
    assert far["verdict"] == "worse beyond the margin" and far["low"] > 0.05
    short = paired_difference([1.5, 2.5, 3.6], [1.0, 2.0, 3.0], 0.05)  # three seeds: no verdict
    assert short["verdict"] == "not resolved" and short["low"] > 0.05
    with pytest.raises(ValueError, match="one value per seed"):
        paired_difference([1.0], [1.0, 2.0], 0.1)
    with pytest.raises(ValueError, match="margin"):
        paired_difference([1.0, 2.0], [1.0, 2.0], 0.0)
