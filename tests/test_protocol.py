"""The one measurement protocol: rounds, intervals, verdict words, the session floor."""

import json
import math
import time

import pytest

from fp8lab import protocol
from fp8lab.protocol import floor as floor_module
from fp8lab.protocol.floor import Floor, floors_from
from fp8lab.protocol.verdicts import BETTER, IDENTICAL, WITHIN, WORSE

FLOOR = Floor("device", 0.03, 3, 2)


def comparison(ratios, floor=FLOOR):
    return protocol.Comparison("a", "b", tuple(ratios), "wall", floor.regime, floor)


def test_mean_interval_matches_the_t_table():
    mean, low, high = protocol.mean_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert mean == 3.0
    # t(0.975, 4) = 2.7764; sd = 1.5811; half-width = 2.7764 * 1.5811 / sqrt(5) = 1.9632
    assert high - mean == pytest.approx(1.9632, abs=1e-4)
    assert low == pytest.approx(2 * mean - high)


def test_one_value_has_no_interval_and_equal_values_a_point():
    assert math.isnan(protocol.mean_interval([2.0])[1])
    assert protocol.mean_interval([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)


def test_ratio_interval_is_symmetric_on_a_log_scale():
    estimate, low, high = protocol.ratio_interval([1.5, 1.6, 1.4, 1.55, 1.45])
    inverse = protocol.ratio_interval([1 / r for r in (1.5, 1.6, 1.4, 1.55, 1.45)])
    assert estimate == pytest.approx(1 / inverse[0])
    assert low == pytest.approx(1 / inverse[2]) and high == pytest.approx(1 / inverse[1])


def test_detectable_difference_shrinks_with_more_pairs():
    five, twenty = (protocol.detectable_difference(0.01, n) for n in (5, 20))
    assert twenty < five
    # (t(0.975, 4) + t(0.8, 4)) * 0.01 / sqrt(5) = (2.7764 + 0.9410) * 0.01 / 2.2361
    assert five == pytest.approx(0.016625, abs=1e-5)


@pytest.mark.parametrize(
    ("estimate", "low", "high", "word"),
    [
        (1.50, 1.45, 1.55, protocol.FASTER),
        (0.60, 0.55, 0.65, protocol.SLOWER),
        (1.01, 0.995, 1.02, protocol.TIED),
        (1.02, 1.01, 1.03, protocol.TIED),  # excludes 1, but inside the floor
        (1.04, 1.01, 1.07, protocol.FASTER),  # beyond the floor, interval excludes 1
        (1.04, 0.98, 1.10, protocol.NOT_RESOLVED),  # beyond the floor, interval holds 1
        (1.02, 0.99, 1.05, protocol.NOT_RESOLVED),  # inside, but the interval leaves it
    ],
)
def test_speed_verdict_needs_the_interval_and_the_floor(estimate, low, high, word):
    assert protocol.speed_verdict(estimate, low, high, 0.03) == word


def test_no_floor_means_no_verdict():
    assert protocol.speed_verdict(2.0, 1.9, 2.1, math.inf) == protocol.NOT_RESOLVED


def test_a_comparison_phrases_and_records_its_verdict():
    c = comparison([1.50, 1.52, 1.49, 1.51, 1.50])
    assert c.verdict == protocol.FASTER
    assert c.phrase().startswith("1.50× faster (95% interval")
    assert "session floor 3.0%" in c.phrase()
    record = c.record()
    assert record["verdict"] == "faster" and record["floor"] == 0.03
    json.dumps(record)  # the glue keeps it as JSON
    slow = comparison([0.5, 0.51, 0.49])
    assert slow.phrase().startswith("2.00× slower")


def test_a_comparison_refuses_bad_ratios():
    with pytest.raises(TypeError, match="ratios"):
        protocol.Comparison("a", "b", [1.0], "wall", "device", FLOOR)
    with pytest.raises(ValueError, match="ratios"):
        comparison([1.0, -1.0])
    with pytest.raises(ValueError, match="basis"):
        protocol.Comparison("a", "b", (1.0,), "host", "device", FLOOR)


def test_paired_verdicts_against_the_margin():
    base = {s: 2.0 for s in range(5)}

    def shifted(offsets):
        return {s: 2.0 + d for s, d in zip(range(5), offsets, strict=True)}

    assert protocol.paired(base, base, margin=0.01).verdict == IDENTICAL
    small = shifted([0.001, -0.001, 0.002, 0.0, 0.001])
    assert protocol.paired(small, base, margin=0.01).verdict == WITHIN
    worse = shifted([0.05, 0.06, 0.055, 0.052, 0.058])
    assert protocol.paired(worse, base, margin=0.01).verdict == WORSE
    better = shifted([-0.05, -0.06, -0.055, -0.052, -0.058])
    assert protocol.paired(better, base, margin=0.01).verdict == BETTER
    noisy = shifted([0.05, -0.06, 0.04, -0.03, 0.0])
    result = protocol.paired(noisy, base, margin=0.01)
    assert result.verdict == protocol.NOT_RESOLVED
    assert result.detectable > 0.01  # and the power statement says why
    assert "detects" in result.phrase()


def test_paired_needs_five_seeds_and_finite_values():
    four = {s: 1.0 for s in range(4)}
    with pytest.raises(ValueError, match="at least 5"):
        protocol.paired(four, four, margin=0.01)
    with pytest.raises(ValueError, match="treated"):
        protocol.paired({**four, 4: math.nan}, {s: 1.0 for s in range(5)}, margin=0.01)
    with pytest.raises(ValueError, match="margin"):
        protocol.paired({s: 1.0 for s in range(5)}, {s: 1.0 for s in range(5)}, margin=0)
    with pytest.raises(TypeError, match="treated"):
        protocol.paired([1.0] * 5, {s: 1.0 for s in range(5)}, margin=0.01)


def test_rounds_time_every_alternative_in_alternating_order():
    # long enough that a loaded machine's late wake-ups (milliseconds) cannot hide a 3x gap
    steps = {"short": lambda: time.sleep(0.02), "long": lambda: time.sleep(0.06)}
    result = protocol.rounds(steps, rounds=4, calls=2, warmup=1, device="cpu")
    assert result.orders == (("short", "long"), ("long", "short")) * 2
    assert all(len(result.times[name]) == 4 for name in steps)
    c = result.compare("short", "long")
    assert c.estimate > 1.5  # a sleep three times longer
    assert result.regime() == "host"  # no kernel time on a CPU: the wider floor
    table = result.table()
    assert list(table.columns) == ["ms", "round range", "kernel ms", "GPU idle"]


def test_shuffled_rounds_are_seeded():
    steps = {name: (lambda: None) for name in "abcd"}
    first = protocol.rounds(steps, rounds=3, calls=1, warmup=0, order="shuffle", device="cpu")
    second = protocol.rounds(steps, rounds=3, calls=1, warmup=0, order="shuffle", device="cpu")
    assert first.orders == second.orders


def test_rounds_refuse_bad_arguments_by_name():
    with pytest.raises(TypeError, match="steps"):
        protocol.rounds({}, device="cpu")
    with pytest.raises(ValueError, match="rounds"):
        protocol.rounds({"a": lambda: None}, rounds=1, device="cpu")
    with pytest.raises(ValueError, match="order"):
        protocol.rounds({"a": lambda: None}, order="random", device="cpu")
    with pytest.raises(ValueError, match="kernel_time"):
        protocol.rounds({"a": lambda: None}, kernel_time="always", device="cpu")


def test_times_from_elsewhere_follow_the_same_rules():
    result = protocol.Rounds.from_times({"a": [[1.0, 1.1], [1.0]], "b": [[2.0], [2.1, 2.0]]})
    assert result.compare("a", "b").estimate == pytest.approx(math.sqrt(2.0 / 1.05 * 2.05))
    with pytest.raises(ValueError, match="same number of rounds"):
        protocol.Rounds.from_times({"a": [[1.0]], "b": [[1.0], [1.0]]})
    with pytest.raises(ValueError, match="kernel"):
        result.compare("a", "b", basis="kernel")


def test_the_regime_follows_the_measured_idle_share():
    times = {"a": ((1.0,), (1.0,)), "b": ((2.0,), (2.0,))}
    device_bound = protocol.Rounds(times, {"a": (0.9,), "b": (1.9,)}, {"a": (0.02,), "b": (0.05,)})
    host_bound = protocol.Rounds(times, {"a": (0.2,), "b": (1.9,)}, {"a": (0.8,), "b": (0.05,)})
    assert device_bound.regime() == "device"
    assert host_bound.regime() == "host"
    assert host_bound.compare("a", "b").regime == "host"


def test_floors_come_from_three_sessions_or_more():
    panel = {
        "x": ("device", {"s1": 1.50, "s2": 1.534, "s3": 1.51}),
        "y": ("device", {"s2": 1.00, "s3": 1.03}),  # two sessions: its move counts too
        "z": ("host", {"s1": 0.8, "s2": 1.0}),  # no host comparison has three sessions yet
        "w": ("kernel", {"s1": 1.0}),
    }
    floors = floors_from(panel)
    assert set(floors) == {"device"}
    assert floors["device"].relative == 0.03  # 1.03 / 1.00 - 1 = 3%
    assert floors["device"].sessions == 3 and floors["device"].comparisons == 2
    del panel["y"]
    assert floors_from(panel)["device"].relative == 0.025  # 1.534 / 1.50 - 1 = 2.3%, up


def test_a_missing_regime_borrows_the_widest_floor(monkeypatch):
    monkeypatch.setattr(floor_module, "FLOORS", {"device": Floor("device", 0.02, 3, 1),
                                                 "host": Floor("host", 0.3, 3, 1)})
    assert floor_module.floor_for("kernel").relative == 0.3
    monkeypatch.setattr(floor_module, "FLOORS", {})
    assert math.isinf(floor_module.floor_for("device").relative)


def test_the_panel_in_the_library_is_the_committed_sessions():
    from tools.session_floor import panel_of

    assert panel_of() == floor_module.PANEL


def test_the_books_floor_table_is_current():
    from tools.session_floor import PAGE, page

    assert PAGE.read_text() == page(), "run python -m tools.session_floor summary --write"


def test_two_samples_measured_apart_get_welchs_interval():
    estimate, low, high = protocol.unpaired_ratio_interval([2.0, 2.2, 1.8], [1.0, 1.1])
    logs_a = [math.log(v) for v in (2.0, 2.2, 1.8)]
    logs_b = [math.log(v) for v in (1.0, 1.1)]
    assert estimate == pytest.approx(math.exp(sum(logs_a) / 3 - sum(logs_b) / 2))
    assert low < estimate < high
    # Welch: the wider sample sets the width; a one-value side gives no interval
    assert math.isnan(protocol.unpaired_ratio_interval([2.0], [1.0, 1.1])[1])
    assert protocol.unpaired_ratio_interval([2.0, 2.0], [1.0, 1.0]) == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError, match="denominator"):
        protocol.unpaired_ratio_interval([2.0, 2.0], [1.0, 0.0])


def test_a_paired_summary_keeps_the_interval_of_a_short_run():
    base = {s: 2.0 for s in range(5)}
    worse = {s: 2.05 + 0.001 * s for s in range(5)}
    row = protocol.paired_summary(worse, base, margin=0.01)
    full = protocol.paired(worse, base, margin=0.01)
    assert row == {
        "seeds": 5, "mean": full.mean, "low": full.low, "high": full.high, "verdict": WORSE
    }
    three = protocol.paired_summary({s: worse[s] for s in range(3)}, base, margin=0.01)
    assert three["seeds"] == 3 and three["verdict"] == protocol.NOT_RESOLVED
    assert three["low"] > 0.01  # beyond the margin, but three seeds give no verdict
    with pytest.raises(ValueError, match="no seed"):
        protocol.paired_summary({7: 1.0}, base, margin=0.01)
    with pytest.raises(ValueError, match="margin"):
        protocol.paired_summary({0: 1.0}, base, margin=0.0)


def test_rounds_keep_the_hosts_time_to_issue_each_round():
    steps = {"a": lambda: time.sleep(0.002), "b": lambda: None}
    result = protocol.rounds(steps, rounds=2, calls=2, warmup=0, kernel_time=None, device="cpu")
    assert set(result.host) == {"a", "b"} and all(len(v) == 2 for v in result.host.values())
    assert min(result.host["a"]) > 1.5  # on a CPU the host's time is the call's
    with pytest.raises(ValueError, match="above 0 ms"):
        protocol.Rounds.from_times({"a": [[0.0], [1.0]], "b": [[1.0], [1.0]]}).compare("a", "b")


def test_a_slowdown_is_phrased_in_its_own_terms_interval_included():
    floor = protocol.Floor("device", 0.03, 3, 2)
    slow = protocol.Comparison("FP8", "BF16", (0.61, 0.612, 0.609), "wall", "device", floor)
    assert slow.verdict == "slower"
    head, interval = slow.phrase().split(" (95% interval ")
    low, high = (float(v) for v in interval.split("×")[0].split("–"))
    assert head == f"{1 / slow.estimate:.2f}× slower"
    assert low <= 1 / slow.estimate <= high and low > 1


def test_an_interval_that_rounds_to_one_number_gets_a_digit_more():
    floor = protocol.Floor("device", 0.03, 3, 2)
    tight = protocol.Comparison("a", "b", (1.5001, 1.5002, 1.5003), "wall", "device", floor)
    assert "interval 1.500–1.500×" in tight.phrase()
