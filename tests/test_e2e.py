"""Chapter 09's accuracy runs: the committed result files come from the GPU lane and from the
code here now; the models, the split, the schedule, the run itself (at smoke size, on the CPU
reference) and the paired statistics."""

import json
import math

import pytest
import torch

from fp8lab import e2e, flops
from fp8lab import stamp as lane
from fp8lab.config import preset_config
from tools import stamps

EXPECTED = e2e.expected_files()


IN_THE_BOOK = any(p.name == "09_end_to_end.ipynb" for p in stamps.toc_notebooks())


@pytest.mark.skipif(
    not IN_THE_BOOK, reason="chapter 09 is not in _toc.yml yet: its runs are not needed"
)
@pytest.mark.parametrize("name", EXPECTED)
def test_committed_outputs_come_from_the_gpu_lane(name):
    """Every run of the plan has a stamped result file made by the code here now (once chapter 09
    is in the book, its runs must be too)."""
    path = e2e.RESULTS_DIR / name
    assert path.exists(), (
        f"{name}: no result file; on a GPU box run python -m tools.train_e2e --plan for the "
        "commands, and commit their files under tests/gpu_results/e2e/"
    )
    record = json.loads(path.read_text())
    assert stamps.record_status(record.get("stamp"), name).broken == ()
    assert record["steps_run"] == record["steps_planned"] or record["error"]


def test_the_plan_pairs_every_fp8_setting_with_bf16_over_five_seeds():
    assert len(e2e.SEEDS) >= 5
    assert len(EXPECTED) == len(e2e.ACCURACY_SETTINGS) * len(e2e.SEEDS)
    assert {name.split("__")[0] for name in EXPECTED} == {"small"}
    for setting in e2e.ACCURACY_SETTINGS:
        assert {f"small__{setting}__seed{s}.json" for s in e2e.SEEDS} <= set(EXPECTED)
    assert {"te-delayed", "te-current"} <= set(e2e.ACCURACY_SETTINGS)


def test_the_split_keeps_each_package_on_one_side():
    """Split by package, the near-duplicate codec tables of encodings/ cannot straddle the split
    (split by file, a twentieth of them would sit in validation)."""
    from fp8lab import corpus as text

    corpus = text.stdlib_corpus(split_by=e2e.SPLIT_BY)
    sides = {}
    for side, files in (("train", corpus.train_files), ("validation", corpus.validation_files)):
        for path in files:
            sides.setdefault(path.split("/")[0] if "/" in path else path, set()).add(side)
    assert all(len(found) == 1 for found in sides.values())
    assert not any(path.startswith("encodings/") for path in corpus.validation_files)


def test_the_small_model_is_gpt2_small():
    """At GPT-2's vocabulary the small model has GPT-2 small's 124,439,808 parameters (the
    count of the released checkpoint, tied embeddings and 1024 learned positions included)."""
    assert flops.parameter_count(e2e.model_config("small", 50257)) == 124_439_808


def test_the_large_model_has_llama3_8b_layers_and_over_a_billion_parameters():
    large = e2e.model_config("large", 8192)
    assert flops.layer_parameters(large) == flops.layer_parameters(preset_config("llama3-8b"))
    assert flops.parameter_count(large, include_embeddings=False) > 1e9
    assert not large.fp8_warnings()
    assert e2e.PLANS[("large", "full")].tokens_per_step == 16384


def test_the_schedule_warms_up_then_follows_a_cosine():
    plan = e2e.PLANS[("small", "full")]
    assert plan.lr_factor(0) == pytest.approx(1 / plan.warmup_steps)
    assert plan.lr_factor(plan.warmup_steps - 1) == pytest.approx(1.0)
    middle = plan.warmup_steps + (plan.steps - plan.warmup_steps) // 2
    assert plan.lr_factor(middle) == pytest.approx(plan.min_lr_ratio + (1 - plan.min_lr_ratio) / 2)
    assert plan.lr_factor(plan.steps) == pytest.approx(plan.min_lr_ratio)
    assert plan.eval_points(plan.steps)[-1] == plan.steps
    assert plan.eval_points(50) == [30, 50]
    assert plan.eval_points(plan.steps)[0] == plan.warmup_steps  # the yardstick after warm-up


def test_run_lists_are_parsed_and_checked():
    assert e2e.parse_runs("bf16:2, te-delayed") == [("bf16", 2), ("te-delayed", 0)]
    with pytest.raises(ValueError, match="runs"):
        e2e.parse_runs("bf17")
    with pytest.raises(ValueError, match="seed"):
        e2e.parse_runs("bf16:x")


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FP8LAB_CACHE", str(cache))
        yield e2e.Bench("smoke", device="cpu", log=None)


def test_a_run_records_what_the_chapter_plots(bench, tmp_path):
    record = bench.run("small", "bf16", seed=0, steps=12)
    assert record["steps_run"] == 12 and len(record["train_loss"]) == 12
    assert record["validation"]["step"] == [3, 10, 12]  # warm-up end, every 10, the end
    assert record["interval_ms_per_step"]["step"] == [3, 10, 12]
    assert record["train_loss"][-1] < record["train_loss"][0]
    assert record["corpus"]["sha256"] == bench.corpus.sha256
    assert record["corpus"]["split_by"] == "package" and record["schema"] == e2e.SCHEMA
    assert record["stamp"] is None and record["error"] is None  # a CPU run is never stamped
    path = e2e.write_record(record, tmp_path)
    assert path.name == "small__bf16__seed0.json"
    assert e2e.load_results(tmp_path) == [json.loads(path.read_text())]


def test_runs_start_from_the_same_weights_and_batches(bench):
    first = bench.run("large", "bf16", seed=0, steps=6)["train_loss"]
    again = bench.run("large", "bf16", seed=0, steps=6)["train_loss"]
    other_order = bench.run("large", "bf16", seed=1, steps=6)["train_loss"]
    fp8 = bench.run("large", "te-delayed", seed=0, steps=6)["train_loss"]
    assert first == again  # deterministic on a CPU
    assert first[0] == pytest.approx(other_order[0], abs=0.2) and first != other_order
    assert fp8[0] == pytest.approx(first[0], rel=1e-2)  # same start, FP8 rounding apart
    assert first[0] == pytest.approx(math.log(bench.vocab_size), rel=0.05)


def test_gpu_settings_are_refused_on_the_cpu_with_the_reason(bench):
    with pytest.raises(ValueError, match="needs a GPU"):
        bench.run("small", "torch-bf16-compiled", steps=2)


def test_the_calibrated_setting_changes_only_its_delayed_scaling(bench):
    plain = bench._fp8_recipe(e2e.SETTINGS["te-delayed"])
    fixed = bench._fp8_recipe(e2e.SETTINGS["te-delayed-calibrated"])
    assert (plain.amax_history_len, plain.amax_compute_algo) == (1024, "max")  # TE's defaults
    assert (fixed.amax_history_len, fixed.amax_compute_algo) == (16, "most_recent")
    record = bench.run("small", "te-delayed-calibrated", steps=4)
    assert record["error"] is None and record["what_ran"]["calibration_step"]
    assert all(math.isfinite(v) for v in record["train_loss"])


def test_paired_differences_are_judged_by_the_protocol():
    from fp8lab.e2e import stats

    base = {seed: 4.0 + 0.01 * seed for seed in range(5)}
    close = {seed: v + 0.001 * (-1) ** seed for seed, v in base.items()}
    far = {seed: v + 0.2 + 0.001 * seed for seed, v in base.items()}
    found = stats.paired_difference(close, base, margin=0.02)
    assert found["verdict"] == "within the margin"
    worse = stats.paired_difference(far, base, margin=0.02)
    assert worse["verdict"] == "worse beyond the margin" and worse["low"] > 0.02
    assert worse["seeds"] == [0, 1, 2, 3, 4]
    noisy = {seed: v + (0.1 if seed % 2 else -0.1) for seed, v in base.items()}
    assert stats.paired_difference(noisy, base, margin=0.02)["verdict"] == "not resolved"
    # a diverged run is left out; four pairs are below the protocol's five: no verdict
    diverged = {**far, 4: float("nan")}
    short = stats.paired_difference(diverged, base, margin=0.02)
    assert short["seeds"] == [0, 1, 2, 3] and short["verdict"] == "not resolved"
    assert short["low"] > 0.02  # the interval is still shown
    one = stats.paired_difference({0: 4.0}, base, margin=0.02)
    assert one["low"] is None and one["mean"] == 0.0
    assert stats.paired_difference({9: 4.0}, base, margin=0.02)["mean"] is None
    band = stats.seed_band(base)
    assert band["low"] == 4.0 and band["high"] == pytest.approx(4.04) and band["sd"] > 0
    with pytest.raises(ValueError, match="margin"):
        stats.paired_difference(close, base, margin=-1.0)
    with pytest.raises(TypeError, match="setting"):
        stats.paired_difference([4.0], base, margin=0.02)


def test_a_stamp_covers_this_script_and_the_library_it_imports(tmp_path, monkeypatch, fake_machine):
    modules = e2e.result_modules()
    assert {"tools.train_e2e", "fp8lab.corpus", "fp8lab.training", "fp8lab.models"} <= set(modules)
    stamp = lane.stamp_record(modules, fake_machine, run_seconds=1.0)
    assert stamps.record_status(stamp, "r.json").state == stamps.FRESH
    monkeypatch.setattr(lane, "module_hashes", lambda modules, root=lane.ROOT: dict.fromkeys(modules, "0"))
    assert stamps.record_status(stamp, "r.json").state == stamps.PENDING


def test_whole_plan_runs_on_a_gpu_are_stamped_failures_included(monkeypatch, fake_machine):
    from types import SimpleNamespace

    monkeypatch.setattr(lane, "where_it_runs", lambda: dict(fake_machine))
    gpu = SimpleNamespace(on_gpu=True, preset="full")
    whole = {"steps_requested": 300, "steps_planned": 300, "error": None, "wall_s": 9.0}
    diverged = dict(whole, error="non-finite loss by step 40: stopped")
    assert stamps.record_status(e2e.Bench._stamp(gpu, whole), "r.json").broken == ()
    assert e2e.Bench._stamp(gpu, diverged) is not None  # a diverged run is a result too
    assert e2e.Bench._stamp(gpu, dict(whole, steps_requested=60)) is None  # cut short
    cpu = SimpleNamespace(on_gpu=False, preset="full")
    assert e2e.Bench._stamp(cpu, whole) is None


def test_evaluate_is_the_mean_token_loss():
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8))
    batches = [(torch.randint(0, 8, (2, 5)), torch.randint(0, 8, (2, 5))) for _ in range(3)]
    expected = torch.stack(
        [torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()) for x, y in batches]
    ).mean()
    assert e2e.evaluate(model, batches) == pytest.approx(expected.item(), rel=1e-6)


def test_evaluation_runs_without_gradients():
    """Without gradients TE does not roll a delayed-scaling amax history on autocast exit, so
    validation leaves the scales of the next training steps alone."""
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8))
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(torch.is_grad_enabled()))
    batches = [(torch.randint(0, 8, (2, 5)), torch.randint(0, 8, (2, 5)))]
    e2e.evaluate(model, batches)
    assert seen == [False] and model.training


def test_a_recorded_module_that_is_gone_makes_a_stamp_pending(fake_machine):
    modules = ["fp8lab.checks", "fp8lab.flops"]
    stamp = lane.stamp_record(modules, fake_machine, run_seconds=1.0)
    stamp["library_modules"].append("fp8lab.no_longer_here")
    stamp["module_sha256"]["fp8lab.no_longer_here"] = "0" * 64
    status = stamps.record_status(stamp, "r.json")
    assert status.state == stamps.PENDING and status.broken == ()
    assert status.changed == ("fp8lab.no_longer_here",)


def _cli(*argv):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "tools.train_e2e", *argv],
        capture_output=True,
        text=True,
        cwd=lane.ROOT,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "medium", "--group", "accuracy"],
        ["--model", "large", "--group", "accuracy"],
        ["--group", "gpus"],
        ["--runs", "bf17"],
        ["--runs", "bf16:x"],
        ["--group", "accuracy", "--steps", "0"],
        ["--model", "small"],
        ["--group", "accuracy", "--budget-s", "-1"],
        ["--group", "accuracy", "--seeds", "9"],
        ["--group", "accuracy", "--seeds", "x"],
    ],
)
def test_the_command_line_refuses_bad_flags_without_a_traceback(argv):
    result = _cli(*argv)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "error:" in result.stderr
