"""tools.layout_peaks: each parallel layout's own peak per GPU, for chapter 07's estimator.

The job runs here on CPU processes (gloo, the CPU reference; peaks are NaN without a GPU);
the estimator's side of the comparison is checked on a file of known peaks."""

import pandas as pd
import pytest

from fp8lab.memory import validation
from tools import layout_peaks


def test_four_gpus_add_the_hybrid_layout():
    assert layout_peaks.layouts(2) == ["DDP", "FSDP2", "TP+SP"]
    assert layout_peaks.layouts(4)[-1] == "TP2 x DP2 (SP)"
    assert "TP2 x DP2 (SP)" not in layout_peaks.layouts(3)


def test_the_job_measures_every_layout_on_cpu_processes():
    rows = layout_peaks.measure(2, "smoke", timeout_s=240)
    assert [(r["layout"], r["precision"]) for r in rows] == [
        (layout, precision) for layout in layout_peaks.layouts(2)
        for precision in layout_peaks.PRECISIONS]
    tp = [r for r in rows if r["layout"] == "TP+SP"][0]
    assert tp["seq_per_gpu"] * 2 == tp["seq"] and tp["batch_per_group"] == 2 * tp["batch"]
    steps = layout_peaks.SIZES["smoke"]["steps"]
    assert all(f"step{steps}_MiB" in r and f"step{steps + 1}_MiB" not in r for r in rows)


def test_the_estimator_is_set_beside_each_measured_peak(tmp_path):
    rows = [{"layout": name, "precision": p, "gpus": 4, "layers": 2, "seq": 2048, "batch": 4,
             "seq_per_gpu": 0, "batch_per_group": 0, "peak_MiB": 5000.0}
            for name in layout_peaks.layouts(4) for p in layout_peaks.PRECISIONS]
    path = tmp_path / "peaks.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    table = validation.layout_rows(path)
    assert len(table) == len(rows)
    fsdp, ddp = (table[(table.layout == n) & (table.precision == "bf16")].iloc[0]
                 for n in ("FSDP2", "DDP"))
    assert fsdp.predicted_MiB < ddp.predicted_MiB  # sharded states
    assert table.error.tolist() == pytest.approx((table.predicted_MiB / 5000.0 - 1).tolist())
    assert "error_last_step" not in table  # no step columns in this file
    assert validation.layout_rows(tmp_path / "absent.csv").empty


def test_step_peaks_give_the_first_and_the_last_step_and_the_error_against_the_last(
        tmp_path):  # fmt: skip
    row = {"layout": "DDP", "precision": "fp8", "gpus": 4, "layers": 2, "seq": 2048,
           "batch": 4, "seq_per_gpu": 2048, "batch_per_group": 4, "peak_MiB": 6000.0,
           "step1_MiB": 4000.0, "step2_MiB": 6000.0, "step10_MiB": 5000.0,
           "step3_MiB": 5500.0}  # step10 is the last, whatever the column order
    path = tmp_path / "peaks.csv"
    pd.DataFrame([row]).to_csv(path, index=False)
    found = validation.layout_rows(path).iloc[0]
    assert (found.step1_MiB, found.last_step_MiB) == (4000.0, 5000.0)
    assert found.error_last_step == pytest.approx(found.predicted_MiB / 5000.0 - 1)
    assert found.error == pytest.approx(found.predicted_MiB / 6000.0 - 1)


@pytest.mark.parametrize("argv", [["--gpus", "1"], ["--csv", "peaks.txt"],
                                  ["--preset", "huge"]])
def test_the_command_line_refuses_bad_flags(argv):
    with pytest.raises(SystemExit) as stop:
        layout_peaks.main(argv)
    assert stop.value.code == 2
