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
from fp8lab.e2e import run, worker
from tools import stamps

EXPECTED = e2e.expected_files()


IN_THE_BOOK = any(p.name == "09_end_to_end.ipynb" for p in stamps.toc_notebooks())


@pytest.mark.skipif(
    not IN_THE_BOOK, reason="chapter 09 is not in _toc.yml yet: its runs are not needed"
)
@pytest.mark.parametrize("name", EXPECTED)
def test_committed_outputs_come_from_the_gpu_lane(name):
    """Every run of the plan has a stamped result file made by the code here now, the page's
    worker cells included (once chapter 09 is in the book, its runs must be too)."""
    path = e2e.RESULTS_DIR / name
    assert path.exists(), (
        f"{name}: no result file; on a GPU box run python -m tools.train_e2e --plan for the "
        "commands, and commit their files under tests/gpu_results/e2e/"
    )
    record = json.loads(path.read_text())
    assert stamps.record_status(record.get("stamp"), name).broken == ()
    assert record["steps_run"] == record["steps_planned"] or record["error"]
    assert record["stamp"].get("worker_sha256") == run.worker_sha256(record["setting"])


def test_the_plan_pairs_every_recipe_with_its_bf16_over_five_seeds():
    assert len(e2e.SEEDS) >= 5
    settings = (*e2e.RECIPES, *e2e.TORCH_SETTINGS)
    assert len(EXPECTED) == len(settings) * len(e2e.SEEDS)
    assert {name.split("__")[0] for name in EXPECTED} == {"llama"}
    assert set(e2e.RECIPES) == {"bf16", "delayed", "current", "block"}
    assert set(e2e.TORCH_SETTINGS) == {"torch-bf16", "torchao-tensorwise", "torchao-rowwise"}
    assert sorted(s for seeds in e2e.COMMAND_SEEDS for s in seeds) == list(e2e.SEEDS)
    labels = {name: e2e.SETTINGS[name].label for name in settings}
    assert labels["torch-bf16"] == "PyTorch BF16" and labels["bf16"] == "TE BF16"
    assert labels["torchao-rowwise"] == "torchao FP8 rowwise"


def test_committed_results_were_made_by_the_worker_cells_on_the_page():
    for path in sorted(e2e.RESULTS_DIR.glob("*.json")):
        record = json.loads(path.read_text())
        assert record["worker_sha256"] == run.worker_sha256(record["setting"]), (
            f"{path.name}: made by other code than the page's worker cells; run it again"
        )


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


def test_the_trained_model_is_llama_shaped_and_over_300m():
    cfg = e2e.model_config("llama", 8192)
    assert cfg.hidden_size >= 1024 and flops.parameter_count(cfg) >= 300e6
    assert (cfg.activation, cfg.normalization, cfg.position_embedding) == (
        "swiglu", "RMSNorm", "rope")
    assert cfg.num_gqa_groups < cfg.num_attention_heads and not cfg.fp8_warnings()


def test_the_large_shape_has_llama3_8b_layers_at_the_projected_length():
    large = e2e.model_config("large", 8192)
    assert flops.layer_parameters(large) == flops.layer_parameters(preset_config("llama3-8b"))
    assert flops.parameter_count(large, include_embeddings=False) > 1e9
    assert not large.fp8_warnings()
    assert e2e.PLANS[("large", "full")].seq == 8192


def test_the_schedule_warms_up_then_follows_a_cosine():
    plan = e2e.PLANS[("llama", "full")]
    assert plan.lr_factor(0) == pytest.approx(1 / plan.warmup_steps)
    assert plan.lr_factor(plan.warmup_steps - 1) == pytest.approx(1.0)
    middle = plan.warmup_steps + (plan.steps - plan.warmup_steps) // 2
    assert plan.lr_factor(middle) == pytest.approx(plan.min_lr_ratio + (1 - plan.min_lr_ratio) / 2)
    assert plan.lr_factor(plan.steps) == pytest.approx(plan.min_lr_ratio)
    points = plan.eval_points(plan.steps)
    assert points[-1] == plan.steps
    assert {plan.before_end(0.05), plan.before_end(0.10)} <= set(points)
    assert plan.before_end(0.05) == 190 and plan.before_end(0.10) == 180
    with pytest.raises(ValueError, match="share"):
        plan.before_end(0.9)


def test_run_lists_are_parsed_and_checked():
    assert e2e.parse_runs("bf16:2, delayed") == [("bf16", 2), ("delayed", 0)]
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
    record = bench.run("llama", "bf16", seed=0)
    assert record["steps_run"] == 6 and len(record["train_loss"]) == 6
    assert record["validation"]["step"] == [3, 5, 6]  # every 3, 10% and 5% before the end
    assert record["train_loss"][-1] < record["train_loss"][0]
    assert record["corpus"]["sha256"] == bench.corpus.sha256
    assert record["corpus"]["split_by"] == "package" and record["schema"] == e2e.SCHEMA
    assert record["stamp"] is None and record["error"] is None  # a CPU run is never stamped
    assert len(record["worker_sha256"]) == 64
    path = e2e.write_record(record, tmp_path)
    assert path.name == "llama__bf16__seed0.json"
    assert e2e.load_results(tmp_path) == [json.loads(path.read_text())]


def test_runs_start_from_the_same_weights_and_batches(bench):
    first = bench.run("llama", "bf16", seed=0, steps=3)["train_loss"]
    again = bench.run("llama", "bf16", seed=0, steps=3)["train_loss"]
    other_order = bench.run("llama", "bf16", seed=1, steps=3)["train_loss"]
    fp8 = bench.run("llama", "delayed", seed=0, steps=3)["train_loss"]
    assert first == again  # deterministic on a CPU
    assert first[0] == pytest.approx(other_order[0], abs=0.2) and first != other_order
    assert fp8[0] == pytest.approx(first[0], rel=1e-2)  # same start, FP8 rounding apart
    assert first[0] == pytest.approx(math.log(bench.vocab_size), rel=0.05)


def test_pytorch_bf16_runs_like_te_bf16_from_the_same_weights(bench):
    """The PyTorch setting starts from the TE model's weights and trains the same function:
    on the CPU reference the two runs' losses agree step by step."""
    te_run = bench.run("llama", "bf16", seed=0, steps=3)
    torch_run = bench.run("llama", "torch-bf16", seed=0, steps=3)
    assert torch_run["error"] is None and torch_run["label"] == "PyTorch BF16"
    assert torch_run["train_loss"] == pytest.approx(te_run["train_loss"], rel=1e-4)
    assert torch_run["worker_sha256"] == run.worker_sha256("torch-bf16")
    assert torch_run["worker_sha256"] != te_run["worker_sha256"] == worker.source_sha256()


def test_torchao_settings_say_they_need_a_gpu(bench):
    record = bench.run("llama", "torchao-rowwise", seed=0, steps=2)
    assert record["error"].startswith("could not take a first step")
    assert "torchao's float8 training needs a CUDA GPU" in record["error"]


def _record(setting, seed, losses, steps=(270, 285, 300)):
    return {"setting": setting, "seed": seed, "steps_planned": 300, "error": None,
            "validation": {"step": list(steps), "loss": list(losses)}}


def test_the_margin_is_read_in_compute_from_bf16s_own_runs():
    from fp8lab.e2e import stats

    runs = [_record("bf16", s, (3.10 + s / 100, 3.05 + s / 100, 3.00 + s / 100))
            for s in range(5)]
    runs += [_record("delayed", s, (3.2, 3.1, 3.03 + s / 100)) for s in range(5)]
    margin = stats.compute_margin(runs, 0.05)
    assert (margin["from_step"], margin["to_step"], margin["seeds"]) == (285, 300, 5)
    assert margin["nats"] == pytest.approx(0.05)
    assert stats.by_seed(runs, "delayed") == pytest.approx({s: 3.03 + s / 100 for s in range(5)})
    assert stats.by_seed(runs, "bf16", 270)[0] == pytest.approx(3.10)
    # the control's step comes from the runs' own length, whatever preset reads them
    assert stats.before_end(runs, 0.10) == 270 and stats.before_end(runs, 0.05) == 285
    # BF16's mean curve (3.12, 3.07, 3.02) reaches 3.05 two fifths of the way from 285 to 300
    assert stats.bf16_steps_to(runs, 3.05) == pytest.approx(291)
    assert stats.bf16_steps_to(runs, 2.0) is None  # below anything BF16 reached
    flat = [_record("bf16", s, (3.0, 3.0, 3.0)) for s in range(5)]
    with pytest.raises(ValueError, match="descend"):
        stats.compute_margin(flat, 0.05)
    with pytest.raises(ValueError, match="share"):
        stats.compute_margin(runs, 0.9)
    with pytest.raises(TypeError, match="runs"):
        stats.by_seed("runs", "bf16")


def test_accuracy_is_judged_by_the_protocol_with_power():
    from fp8lab.e2e import report

    runs = [_record("bf16", s, (3.1, 3.05, 3.0 + s / 100)) for s in range(5)]
    runs += [_record("current", s, (3.1, 3.05, 3.0 + s / 100 + 0.001 * (-1) ** s))
             for s in range(5)]
    found = report.accuracy(runs, margin=0.05)
    assert found["current"].verdict == "within the margin"
    assert found["current"].detectable > 0
    short = report.accuracy(runs[:2] + runs[5:7], margin=0.05)
    assert short["current"]["verdict"] == "not resolved" and short["current"]["seeds"] == 2
    gap = report.gradient_gap(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0]))
    assert gap["zeroed"] == 0.5 and gap["relative error"] == pytest.approx(0.5**0.5)
    with pytest.raises(ValueError, match="shape"):
        report.gradient_gap(torch.ones(2), torch.ones(3))


def test_a_stamp_covers_this_script_and_the_library_it_imports(tmp_path, monkeypatch, fake_machine):
    modules = e2e.result_modules()
    assert {"tools.train_e2e", "fp8lab.corpus", "fp8lab.e2e.worker"} <= set(modules)
    stamp = lane.stamp_record(modules, fake_machine, run_seconds=1.0)
    assert stamps.record_status(stamp, "r.json").state == stamps.FRESH
    monkeypatch.setattr(lane, "module_hashes", lambda modules, root=lane.ROOT: dict.fromkeys(modules, "0"))
    assert stamps.record_status(stamp, "r.json").state == stamps.PENDING


def test_whole_plan_runs_on_a_gpu_are_stamped_failures_included(monkeypatch, fake_machine):
    from types import SimpleNamespace

    monkeypatch.setattr(lane, "where_it_runs", lambda: dict(fake_machine))
    gpu = SimpleNamespace(on_gpu=True, preset="full")
    whole = {"steps_requested": 300, "steps_planned": 300, "error": None, "wall_s": 9.0,
             "worker_sha256": worker.source_sha256()}
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
        ["--model", "llama"],
        ["--group", "accuracy", "--budget-s", "-1"],
        ["--group", "accuracy", "--seeds", "9"],
        ["--group", "accuracy", "--seeds", "x"],
    ],
)
def test_the_command_line_refuses_bad_flags_without_a_traceback(argv):
    result = _cli(*argv)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "error:" in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal off the GPU")
def test_the_command_line_refuses_smoke_runs_it_was_not_asked_for(tmp_path):
    result = _cli("--group", "accuracy", "--seeds", "0", "--out", str(tmp_path))
    assert result.returncode == 2 and "--preset smoke" in result.stderr
    assert not list(tmp_path.iterdir())


def _twins(seed=1234):
    """The smoke Llama of TE layers (the CPU reference) and its plain-PyTorch copy."""
    import fp8lab
    from fp8lab.e2e import settings

    te, _ = fp8lab.import_te()
    code = worker.load()
    cfg = settings.model_config("llama", 512, "smoke")
    torch.manual_seed(seed)
    te_model = code.Llama(cfg, te, torch.device("cpu"))
    return code, te_model, code.copy_from_te(code.TorchLlama(cfg, torch.device("cpu")), te_model)


def test_the_plain_pytorch_llama_computes_what_the_te_llama_does():
    """Same weights, same function: logits and every layer's weight gradients agree (FP32)."""
    code, te_model, torch_model = _twins()
    tokens = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(0))
    targets = tokens.roll(-1, dims=1)
    with torch.no_grad():
        te_logits, torch_logits = te_model(tokens), torch_model(tokens)
    assert ((te_logits - torch_logits).norm() / te_logits.norm()).item() < 1e-5
    te_model(tokens, targets).backward()
    torch_model(tokens, targets).backward()
    theirs = dict(te_model.named_parameters())
    for mine, te_name in code.TE_NAMES.items():
        a, b = torch_model.get_parameter(f"layers.0.{mine}").grad, theirs[f"layers.0.{te_name}"].grad
        assert ((a - b).norm() / b.norm()).item() < 1e-5, mine


def test_a_wrong_gate_order_would_be_caught():
    """The check above can fail: SwiGLU gating the second half (PyTorch's GLU convention)."""
    code, te_model, torch_model = _twins()
    with torch.no_grad():
        fc1 = torch_model.layers[0].fc1.weight
        fc1.copy_(torch.cat(fc1.chunk(2, dim=0)[::-1]))
    tokens = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        te_logits, torch_logits = te_model(tokens), torch_model(tokens)
    assert ((te_logits - torch_logits).norm() / te_logits.norm()).item() > 1e-3


def test_copy_from_te_refuses_weights_it_would_leave_behind():
    code, te_model, _ = _twins()
    te_model.register_parameter("extra", torch.nn.Parameter(torch.zeros(1)))
    from fp8lab.e2e import settings

    cfg = settings.model_config("llama", 512, "smoke")
    with pytest.raises(ValueError, match="unmapped TE weights: \\['extra'\\]"):
        code.copy_from_te(code.TorchLlama(cfg, torch.device("cpu")), te_model)


def test_te_runs_hash_only_the_te_cells():
    te_only = worker.source(tags=worker.TE_CELLS)
    both = worker.source(tags=worker.TORCH_CELLS)
    assert "class Llama" in te_only and "TorchLlama" not in te_only
    assert "TorchLlama" in both and both.startswith(te_only.split("\n\n")[0])
    assert worker.source_sha256() != worker.source_sha256(tags=worker.TORCH_CELLS)
    with pytest.raises(TypeError, match="tags"):
        worker.source(tags="worker")


def test_the_run_table_and_origin_name_every_setting_and_every_stack():
    from fp8lab.e2e import report

    def run_of(setting, seed, gpu, date):
        stamp = {"gpu_name": gpu, "torch": "2.11", "transformer_engine": "2.20",
                 "cudnn": "9.19", "date": date}
        return {"setting": setting, "seed": seed, "wall_s": 60.0, "steps_run": 200,
                "error": None, "stamp": stamp}

    runs = [run_of("bf16", 0, "H200", "day 1"), run_of("bf16", 1, "H200", "day 2"),
            run_of("torchao-rowwise", 0, "H100", "day 3"), {**run_of("delayed", 0, "", ""),
                                                            "stamp": None}]
    table = report.run_table(runs)
    assert list(table["setting"]) == ["TE BF16", "TE FP8 delayed", "torchao FP8 rowwise"]
    said = report.origin(runs, made_here=False)
    assert said.startswith("2 on H200, torch 2.11, TE 2.20, cuDNN 9.19, day 1 to day 2; ")
    assert "1 on H100" in said and said.endswith("1 not stamped")
    assert report.origin(runs, made_here=True).startswith("made here")
