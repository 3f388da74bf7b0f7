"""Chapter 09's alternated speed measurement: the committed file comes from the GPU lane and
the code here now; every setting it times on the trained model is graphed or says why not;
comparisons are per-round ratios; the measurement runs at smoke size."""

import json
import os
import signal
import sys
import types

import pytest
import torch

from fp8lab import e2e, protocol
from fp8lab import stamp as lane
from fp8lab.e2e import speed as e2e_speed
from tools import stamps

IN_THE_BOOK = any(p.name == "09_end_to_end.ipynb" for p in stamps.toc_notebooks())


@pytest.mark.skipif(not IN_THE_BOOK, reason="chapter 09 is not in _toc.yml yet")
def test_the_committed_speed_file_comes_from_the_gpu_lane():
    path = e2e_speed.COMMITTED_FILE
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


def test_every_group_holds_its_baseline_and_every_setting_is_timed_on_both_models():
    for groups in e2e_speed.GROUPS.values():
        for first, second in groups:
            assert first == e2e_speed.baseline_of(second) or (first, second) == (
                "bf16", "torch-bf16")  # the two BF16 baselines against each other
        assert {name for group in groups for name in group} == set(e2e.SETTINGS)
    assert e2e_speed.baseline_of("torchao-rowwise") == "torch-bf16"
    assert e2e_speed.baseline_of("block") == e2e_speed.ANCHOR == "bf16"
    assert e2e_speed.GRAPHED == {"llama": True, "large": False}


def test_a_comparison_is_taken_round_by_round_within_one_group():
    record = {
        "models": {
            "large": {
                "tokens_per_step": 1000,
                "groups": [
                    {"ms_per_step": {"bf16": [100.0, 200.0, 100.0], "delayed": [50, 100, 80]}},
                    {"ms_per_step": {"bf16": [90.0, 90.0, 90.0], "block": [60, 60, 90]}},
                ],
            }
        }
    }
    found = e2e_speed.comparison(record, "large", "delayed")  # per round 2.0, 2.0, 1.25
    assert found.ratios == (2.0, 2.0, 1.25)
    expected = protocol.Comparison(
        "delayed", "bf16", (2.0, 2.0, 1.25), "wall", "host", protocol.floor_for("host")
    )
    assert found.estimate == pytest.approx(expected.estimate)  # the geometric mean
    assert found.verdict == expected.verdict
    assert e2e_speed.comparison(record, "large", "block").ratios == (1.5, 1.5, 1.0)
    assert e2e_speed.comparison(record, "large", "block", "delayed") is None


def test_the_class_call_is_put_back_after_a_capture():
    class Model:
        pass

    with e2e_speed.class_call_kept(Model):
        Model.__call__ = lambda self: "wrapped"
    assert "__call__" not in Model.__dict__
    with pytest.raises(TypeError, match="cls"), e2e_speed.class_call_kept(Model()):
        pass


def test_a_failed_capture_leaves_no_capturing_flag_behind(monkeypatch):
    flag = {"capturing": True}  # TE's flag, as a capture that raised leaves it
    graph = types.ModuleType("transformer_engine.pytorch.graph")
    graph.set_capture_end = lambda: flag.update(capturing=False)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch.graph", graph)

    class Model:
        pass

    with pytest.raises(RuntimeError), e2e_speed.class_call_kept(Model):
        raise RuntimeError("capture refused")
    assert flag == {"capturing": False}


def test_a_group_where_one_side_refused_graphs_is_timed_without_graphs(monkeypatch):
    built = []

    def first_steps(bench, model, name, graphs, warmup):
        built.append((name, graphs))
        graphed = graphs and name == "bf16"  # the FP8 side's capture was refused
        return (lambda: None), {"graphs": "te.make_graphed_callables" if graphed else None,
                                "refused": None if graphed or not graphs else "refused"}

    class Bench:
        device = torch.device("cpu")

        def release(self):
            pass

    monkeypatch.setattr(e2e_speed, "_first_steps", first_steps)
    timed = e2e_speed.time_group(Bench(), "llama", ("bf16", "delayed"), 2, 1, 0)
    assert built[2:] == [("bf16", False), ("delayed", False)]  # rebuilt, both without
    assert all(ran["graphs"] is None for ran in timed["what_ran"].values())
    assert timed["what_ran"]["delayed"]["refused"] == "refused"
    assert "another side" in timed["what_ran"]["bf16"]["refused"]


def test_the_measurement_runs_on_the_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("FP8LAB_CACHE", str(tmp_path))
    bench = e2e.Bench("smoke", device="cpu", log=None)
    record = e2e_speed.measure(bench, ("llama",), rounds=2, steps=1, warmup=0,
                               log=lambda _: None)
    groups = record["models"]["llama"]["groups"]
    assert [g["settings"] for g in groups] == [list(g) for g in e2e_speed.GROUPS["llama"]]
    assert record["models"]["llama"]["graphs"] is False  # no CUDA graphs off the GPU
    for group in groups:
        if any(name.startswith("torchao") for name in group["settings"]):
            assert "needs a CUDA GPU" in group["error"]  # refused on record, not fatal
            continue
        assert all(ran == {"graphs": None, "refused": None} for ran in group["what_ran"].values())
        assert all(len(times) == 2 and min(times) > 0 for times in group["ms_per_step"].values())
    assert e2e_speed.comparison(record, "llama", "current") is not None
    assert e2e_speed.comparison(record, "llama", "torch-bf16") is not None  # against TE BF16
    assert e2e_speed.comparison(record, "llama", "torchao-rowwise", "torch-bf16") is None
    assert e2e_speed.stamp(record, 1.0) is None
    with pytest.raises(ValueError, match="rounds"):
        e2e_speed.measure(bench, ("llama",), rounds=1)

    def out_of_memory(*args):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(e2e_speed, "time_group", out_of_memory)
    out = tmp_path / "speed.json"
    failed = e2e_speed.measure_and_write(bench, ("llama",), out, log=lambda _: None)
    group = failed["models"]["llama"]["groups"][0]  # on record, and the file is written
    assert group["error"] == "RuntimeError: CUDA out of memory" and out.exists()
    assert e2e_speed.comparison(failed, "llama", "delayed") is None


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


class _ChildBench:
    preset, device, on_gpu = "smoke", torch.device("cpu"), False

    class tokenizer:  # noqa: N801 -- stands in for a tokenizers.Tokenizer
        @staticmethod
        def save(path):
            open(path, "w").close()


def test_a_group_whose_process_dies_is_timed_again_without_graphs(monkeypatch):
    jobs, timed = [], {"settings": ["bf16", "torch-bf16"], "ms_per_step": {},
                       "host_ms_per_step": {}, "what_ran": {"bf16": {"graphs": None,
                                                                     "refused": None}}}
    answers = iter([(-int(signal.SIGSEGV), None), (0, timed)])

    def run_child(job):
        jobs.append(job)
        return next(answers)

    monkeypatch.setattr(e2e_speed, "run_child", run_child)
    found = e2e_speed.time_group_in_child(_ChildBench(), "llama", ("bf16", "torch-bf16"), 2, 1, 0)
    assert [job["graphs"] for job in jobs] == [True, False]
    assert "SIGSEGV" in found["what_ran"]["bf16"]["refused"]


def test_a_group_whose_process_dies_twice_is_an_error_on_record(monkeypatch):
    monkeypatch.setattr(e2e_speed, "run_child", lambda job: (-int(signal.SIGSEGV), None))
    with pytest.raises(RuntimeError, match="SIGSEGV.*and then"):
        e2e_speed.time_group_in_child(_ChildBench(), "llama", ("bf16", "torch-bf16"), 2, 1, 0)
    with pytest.raises(RuntimeError, match="exit status 3"):  # no graphs to turn off
        monkeypatch.setattr(e2e_speed, "run_child", lambda job: (3, None))
        e2e_speed.time_group_in_child(_ChildBench(), "large", ("bf16", "torch-bf16"), 2, 1, 0)


def test_a_group_runs_in_a_process_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("FP8LAB_CACHE", str(tmp_path))
    bench = e2e.Bench("smoke", device="cpu", log=None)
    record = e2e_speed.measure(bench, ("llama",), rounds=2, steps=1, warmup=0,
                               log=lambda _: None, isolate=True)
    groups = {tuple(g["settings"]): g for g in record["models"]["llama"]["groups"]}
    mixed = groups[("bf16", "torch-bf16")]  # run in a child: TE BF16 beside PyTorch BF16
    assert "error" not in mixed and all(len(t) == 2 for t in mixed["ms_per_step"].values())
    assert "needs a CUDA GPU" in groups[("torch-bf16", "torchao-rowwise")]["error"]


def test_parts_measured_side_by_side_merge_into_one_record(tmp_path, monkeypatch):
    monkeypatch.setenv("FP8LAB_CACHE", str(tmp_path))
    bench = e2e.Bench("smoke", device="cpu", log=None)

    def fake_group(bench, model, settings, rounds, steps, warmup, graphs=None):
        times = {n: [float(len(n))] * rounds for n in settings}
        return {"settings": list(settings), "ms_per_step": times, "host_ms_per_step": times,
                "what_ran": {n: {"graphs": None, "refused": None} for n in settings}}

    monkeypatch.setattr(e2e_speed, "time_group", fake_group)
    quiet = lambda _: None  # noqa: E731
    paths = []
    for name, only in (("a", [0, 3]), ("b", [1, 2, 4, 5])):
        paths.append(tmp_path / f"{name}.json")
        part = e2e_speed.measure_and_write(bench, ("llama",), paths[-1], rounds=2, steps=1,
                                           log=quiet, only=only)
        assert part["stamp"] is None and part["models"]["llama"]["group_indices"] == only
    parts = [json.loads(p.read_text()) for p in paths]
    merged = e2e_speed.merge(parts)
    groups = merged["models"]["llama"]["groups"]
    assert [g["settings"] for g in groups] == [list(g) for g in e2e_speed.GROUPS["llama"]]
    assert "group_indices" not in merged["models"]["llama"]
    assert [p["models"] for p in merged["parts"]] == [{"llama": [0, 3]}, {"llama": [1, 2, 4, 5]}]
    assert e2e_speed.comparison(merged, "llama", "torchao-rowwise", "torch-bf16") is not None
    with pytest.raises(ValueError, match="measured twice"):
        e2e_speed.merge([parts[0], parts[0], parts[1]])
    with pytest.raises(ValueError, match=r"lacks group\(s\) \[1, 2, 4, 5\]"):
        e2e_speed.merge([parts[0]])
    with pytest.raises(ValueError, match="preset differs"):
        e2e_speed.merge([parts[0], {**parts[1], "preset": "full"}])
    with pytest.raises(ValueError, match="groups 0 to 5"):
        e2e_speed.chosen_groups("llama", [6])


def test_a_verdict_rerun_can_point_the_chapter_at_its_own_measurement(tmp_path):
    import subprocess

    code = "from fp8lab.e2e import speed; print(speed.RESULTS_FILE)"
    env = {**os.environ, e2e_speed.RESULTS_ENV: str(tmp_path / "again.json")}
    shown = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True, cwd=lane.ROOT).stdout.strip()
    assert shown == str(tmp_path / "again.json")
    assert e2e_speed.RESULTS_FILE == e2e_speed.COMMITTED_FILE  # unset: the committed file
