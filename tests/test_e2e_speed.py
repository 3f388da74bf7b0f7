"""Chapter 09's alternated speed measurement: the committed file comes from the GPU lane and
the code here now; every setting it times is graphed on the small model or says why not; ratios
are per-round ratios; the measurement runs at smoke size."""

import json

import pytest

from fp8lab import e2e, protocol
from fp8lab import stamp as lane
from fp8lab.e2e import speed as e2e_speed
from tools import stamps

IN_THE_BOOK = any(p.name == "09_end_to_end.ipynb" for p in stamps.toc_notebooks())


@pytest.mark.skipif(not IN_THE_BOOK, reason="chapter 09 is not in _toc.yml yet")
def test_the_committed_speed_file_comes_from_the_gpu_lane():
    path = e2e_speed.RESULTS_FILE
    assert path.exists(), "no e2e_speed.json; on a GPU box run python -m tools.e2e_speed"
    record = json.loads(path.read_text())
    assert stamps.record_status(record.get("stamp"), path.name).broken == ()
    assert record["schema"] == e2e_speed.SCHEMA
    for model, groups in e2e_speed.GROUPS.items():
        entry = record["models"][model]
        assert [group["settings"] for group in entry["groups"]] == [list(g) for g in groups]
        assert entry["graphs"] == e2e_speed.GRAPHED[model]
        for group in entry["groups"]:
            for name, ran in group["what_ran"].items():
                # graphed where asked, or the reason it was refused is on record
                assert not entry["graphs"] or ran["graphs"] or ran["refused"], (model, name)


def test_every_group_holds_the_anchor_and_every_accuracy_checked_fp8_setting():
    """The speed headline may only use settings whose accuracy the small model establishes."""
    fp8 = {name for name in e2e.ACCURACY_SETTINGS if e2e.SETTINGS[name].fp8}
    for groups in e2e_speed.GROUPS.values():
        assert all(group[0] == e2e_speed.ANCHOR for group in groups)
        timed = {name for group in groups for name in group}
        assert "torch-bf16-compiled" in timed
        assert {n for n in timed if e2e.SETTINGS[n].fp8} <= fp8


def test_a_ratio_is_taken_round_by_round_within_one_group():
    record = {
        "models": {
            "large": {
                "tokens_per_step": 1000,
                "groups": [
                    {"ms_per_step": {"bf16": [100.0, 200.0, 100.0], "te-delayed": [50, 100, 80]}},
                    {"ms_per_step": {"bf16": [90.0, 90.0, 90.0], "te-block": [60, 60, 90]}},
                ],
            }
        }
    }
    # per round 2.0, 2.0, 1.25: a ratio of medians (100 / 80) would say 1.25
    found = e2e_speed.ratio(record, "large", "te-delayed")
    assert found["median"] == 2.0 and found["rounds"] == 3
    comparison = protocol.Comparison(
        "te-delayed", "bf16", (2.0, 2.0, 1.25), "wall", "host", protocol.floor_for("host")
    )
    assert found["estimate"] == pytest.approx(comparison.estimate)  # the geometric mean
    assert (found["low"], found["high"]) == pytest.approx((comparison.low, comparison.high))
    assert found["verdict"] == comparison.verdict
    assert e2e_speed.ratio(record, "large", "te-block")["median"] == pytest.approx(1.5)
    assert e2e_speed.ratio(record, "large", "te-block", "te-delayed") is None
    assert e2e_speed.tokens_per_s(record, "large", "te-delayed") == pytest.approx(1000 / 0.08)
    assert e2e_speed.tokens_per_s(record, "large", "te-current") is None


def test_the_measurement_runs_on_the_reference_without_what_it_cannot_run(tmp_path, monkeypatch):
    monkeypatch.setenv("FP8LAB_CACHE", str(tmp_path))
    bench = e2e.Bench("smoke", device="cpu", log=None)
    record = e2e_speed.measure(bench, ("small",), rounds=2, steps=1, warmup=0, log=lambda _: None)
    (group,) = record["models"]["small"]["groups"]
    assert group["settings"] == ["bf16", "te-delayed", "te-current"]  # no compiling here
    assert record["models"]["small"]["graphs"] is False  # no CUDA graphs off the GPU
    assert all(ran == {"graphs": None, "refused": None} for ran in group["what_ran"].values())
    assert all(len(times) == 2 and min(times) > 0 for times in group["ms_per_step"].values())
    assert set(group["host_ms_per_step"]) == set(group["ms_per_step"])
    assert e2e_speed.ratio(record, "small", "bf16")["median"] == 1.0
    assert e2e_speed.stamp(record, 1.0) is None
    with pytest.raises(ValueError, match="rounds"):
        e2e_speed.measure(bench, ("small",), rounds=1)

    def out_of_memory(*args):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(e2e_speed, "time_group", out_of_memory)
    out = tmp_path / "speed.json"
    failed = e2e_speed.measure_and_write(bench, ("small",), out, log=lambda _: None)
    (group,) = failed["models"]["small"]["groups"]  # on record, and the file is written
    assert group["error"] == "RuntimeError: CUDA out of memory" and out.exists()
    assert e2e_speed.ratio(failed, "small", "te-delayed") is None


@pytest.mark.parametrize(
    "argv",
    [["--models", "medium"], ["--rounds", "1"], ["--steps", "0"], ["--preset", "huge"]],
)
def test_the_command_line_refuses_bad_flags_without_a_traceback(argv):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "tools.e2e_speed", *argv],
        capture_output=True,
        text=True,
        cwd=lane.ROOT,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "error:" in result.stderr
