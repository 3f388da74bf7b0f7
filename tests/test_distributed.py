"""The parallelism chapter's pieces on CPUs: the collectives model, the launcher (two gloo
processes), and tensor/sequence parallelism and amax reduction of the CPU reference checked
against one process.

One launch (module fixture) runs every multi-process check, since starting processes is the
slow part: the reference's tensor- and sequence-parallel stack against the whole stack in one
process, DDP against one process, amax reduction across ranks, and the launcher's handling of
a task that raises, one that hangs and one whose process dies.
"""

import dataclasses
import inspect
import json
import math
import subprocess
import sys
import types

import pytest
import torch

from fp8lab import collectives, distributed, protocol
from fp8lab import reference as te
from fp8lab.config import TransformerConfig, preset_config
from fp8lab.flops import layer_parameters
from fp8lab.parallel import (
    jobs,
    layouts,
    measure,
    model,
    report,
    tasks_checks,
    tasks_rounds,
    tasks_speed,
    worker,
)
from fp8lab.parallel.jobs import Task

TINY = TransformerConfig(64, 256, 4, num_layers=2, name="tiny stack")

# --- collectives (arithmetic) -----------------------------------------------------------------


def test_bus_factors_follow_nccl_tests():
    # doc/PERFORMANCE.md of nccl-tests: all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n
    assert collectives.bus_factor("all_reduce", 2) == 1.0
    assert collectives.bus_factor("all_reduce", 8) == 1.75
    assert collectives.bus_factor("all_gather", 8) == 0.875
    assert collectives.bus_factor("reduce_scatter", 4) == 0.75
    # 1 GB all-reduced in 10 ms on 8 ranks: algorithm bandwidth 100 GB/s, bus bandwidth 175 GB/s
    assert collectives.bus_bandwidth("all_reduce", 1e9, 0.01, 8) == pytest.approx(175.0)


def test_alpha_beta_fit_recovers_the_model():
    truth = collectives.AlphaBeta("all_gather", 4, 12e-6, 300.0)
    sizes = [4**k for k in range(6, 16)]
    fit = collectives.fit_alpha_beta(sizes, [truth.time_s(m) for m in sizes], "all_gather", 4)
    assert fit.alpha_s == pytest.approx(12e-6, rel=1e-6)
    assert fit.bus_gbs == pytest.approx(300.0, rel=1e-6)
    # half the bandwidth where alpha equals the transfer time
    half = fit.half_bandwidth_bytes
    assert fit.bandwidth_gbs(half) == pytest.approx(150.0, rel=1e-6)
    assert fit.bandwidth_gbs(1e12) == pytest.approx(300.0, rel=1e-3)


def test_fit_refuses_times_that_do_not_grow():
    with pytest.raises(ValueError, match="seconds"):
        collectives.fit_alpha_beta([1e3, 1e6], [2e-3, 1e-3], "all_reduce", 2)


def test_step_traffic_counts_parameters_and_activations():
    cfg = preset_config("te-tutorial").replace(num_layers=2)
    params = 2 * sum(layer_parameters(cfg).values())
    (dp,) = collectives.step_traffic(cfg, "DP", 4, 2048, 8)
    assert dp.nbytes == 2 * params and dp.bytes_sent == pytest.approx(2 * params * 1.75)
    fsdp = collectives.step_traffic(cfg, "FSDP", 4, 2048, 8, weight_bytes=1)
    assert [c.op for c in fsdp] == ["all_gather", "all_gather", "reduce_scatter"]
    assert fsdp[0].nbytes == params and fsdp[2].nbytes == 2 * params
    # TP: 4 all-reduces of S*B*H per layer; SP moves the same total as all-gathers and
    # reduce-scatters (each half of an all-reduce), plus TE's two re-gathers per layer
    tp = collectives.step_traffic(cfg, "TP", 8, 2048, 2)
    sp = collectives.step_traffic(cfg, "TP+SP", 8, 2048, 2)
    activations = 2048 * 8 * 4096 * 2
    assert sum(c.bytes_sent for c in tp) == pytest.approx(2 * 4 * activations * 0.5 * 2)
    assert sum(c.bytes_sent for c in sp) == pytest.approx(
        sum(c.bytes_sent for c in tp) + 2 * 2 * activations * 0.5
    )
    time = collectives.traffic_time(sp, 100.0, 0.0)
    assert time == pytest.approx(sum(c.bytes_sent for c in sp) / 100e9)


def test_collectives_is_arithmetic():
    code = "import sys, fp8lab.collectives; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_a_collective_on_one_rank_costs_nothing():
    assert collectives.collective_time("all_reduce", 1e9, 1, 100.0, 1e-5) == 0.0


@pytest.mark.parametrize(
    "call",
    [
        lambda: collectives.Collective("x", "all_reduce", 1e6, 1),
        lambda: collectives.AlphaBeta("all_gather", 1, 1e-5, 100.0),
        lambda: collectives.bus_bandwidth("all_reduce", 1e6, 1e-3, 1),
        lambda: collectives.step_traffic(TINY, "DP", 2, 32, 1),
    ],
)
def test_a_collective_with_one_rank_is_refused(call):
    with pytest.raises(ValueError, match=r"n=1: a collective needs at least 2 ranks"):
        call()


def test_tensor_and_sequence_parallel_traffic_needs_divisible_sizes():
    odd = TINY.replace(ffn_hidden_size=250)  # F not divisible by 4
    with pytest.raises(ValueError, match=r"n=4: .*ffn_hidden_size"):
        collectives.step_traffic(odd, "TP", 2, 32, 4)
    with pytest.raises(ValueError, match=r"seq=30: sequence parallelism needs n=4"):
        collectives.step_traffic(TINY, "TP+SP", 2, 30, 4)
    with pytest.raises(ValueError, match=r"seq=30: context parallelism needs n=4"):
        collectives.step_traffic(TINY, "CP", 2, 30, 4)
    assert collectives.step_traffic(TINY, "TP", 2, 30, 4)  # TP alone does not cut the sequence
    with pytest.raises(ValueError, match=r"n=8: .*num_attention_heads=4"):
        collectives.step_traffic(TINY, "TP", 2, 32, 8)  # 4 heads cannot be cut 8 ways


# --- the worker's pure helpers ---------------------------------------------------------------


def test_dual_chunks_balance_causal_work():
    x = torch.arange(8)
    assert layouts.dual_chunks(x, 0, 2).tolist() == [0, 1, 6, 7]
    assert layouts.dual_chunks(x, 1, 2).tolist() == [2, 3, 4, 5]


def test_the_launcher_knows_every_kind_of_task_the_worker_runs():
    assert set(jobs.KINDS) == set(worker.TASKS)


def test_the_chapters_plan_sits_below_the_launcher():
    """fp8lab.parallel.plan builds its tasks without importing fp8lab.distributed, which
    imports the kit (no import up the tree)."""
    code = "import sys, fp8lab.parallel.plan\nprint('fp8lab.distributed' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False"]


def test_the_chapter_shows_the_layouts_module():
    for name in ("ddp_model", "fsdp_model"):
        assert distributed.source(name) == inspect.getsource(getattr(layouts, name))
    assert distributed.source("collective").startswith("def collective(")  # other modules too
    with pytest.raises(ValueError, match="name"):
        distributed.source("no_such_function")


@pytest.mark.parametrize("lr", [math.nan, math.inf, -1e-3, 0.0])
def test_a_learning_rate_must_be_finite_and_positive(lr):
    with pytest.raises(ValueError, match=r"lr="):
        Task("ddp_check", "ddp_check", {"lr": lr})
    with pytest.raises(ValueError, match=r"lr="):
        distributed.launch([], 2, shared={"lr": lr})
    cpu = types.SimpleNamespace(cuda=False)
    with pytest.raises(ValueError, match=r"lr="):
        model.make_optimizer(cpu, torch.nn.Linear(2, 2).parameters(), lr=lr)


def test_shard_parameter_follows_te_layouts():
    cfg = TransformerConfig(64, 256, 4, num_gqa_groups=2, num_layers=1)
    d, per_group = cfg.head_dim, cfg.num_attention_heads // cfg.groups + 2
    qkv = torch.arange(cfg.qkv_size * 64).reshape(cfg.qkv_size, 64)
    local = tasks_checks.shard_parameter(
        "0.self_attention.layernorm_qkv.weight", qkv, (cfg.qkv_size // 2, 64), 1, 2, cfg
    )
    rows = qkv.reshape(per_group, cfg.groups, d, 64)[:, 1].reshape(-1, 64)
    assert torch.equal(local, rows)
    fc2 = torch.arange(64 * 256).reshape(64, 256)
    assert torch.equal(
        tasks_checks.shard_parameter("0.layernorm_mlp.fc2_weight", fc2, (64, 128), 1, 2, cfg),
        fc2[:, 128:],
    )
    swiglu = cfg.replace(activation="swiglu")
    fc1 = torch.arange(512 * 64).reshape(512, 64)
    local = tasks_checks.shard_parameter("0.layernorm_mlp.fc1_weight", fc1, (256, 64), 0, 2, swiglu)
    assert torch.equal(local, torch.cat([fc1[:128], fc1[256:384]]))


# --- the reference's refusals ------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: te.Linear(64, 32, tp_size=2), "needs tp_group"),
        (
            lambda: te.TransformerLayer(64, 128, 4).set_context_parallel_group(None, [0], None),
            "context parallelism",
        ),
        (lambda: te.initialize_ub([64, 64], 2), "Userbuffers"),
        (lambda: te.TransformerLayer(64, 128, 4, ub_tp_comm_overlap=True), "ub_tp_comm_overlap"),
    ],
)
def test_the_reference_refuses_what_it_does_not_model(call, message):
    with pytest.raises(NotImplementedError, match=message):
        call()


# --- one launch on two gloo processes ---------------------------------------------------------


@pytest.fixture(scope="module")
def run():
    if torch.cuda.is_available():
        pytest.skip("runs the CPU reference on gloo; with CUDA the chapter runs TE itself")
    shared = {"model": dataclasses.asdict(TINY), "seq": 32, "batch": 2, "warmup": 1, "iters": 2}
    tasks = [
        Task("tp_check", "tp_check", {"steps": 3}),
        Task("ddp_check", "ddp_check", {"steps": 3}),
        Task("amax", "amax", {"steps": 2, "calls": 3}),
        Task("rounds", "rounds", {"rounds": 2}),
        Task("ok", "sleep", {"seconds": 0}),
        Task("raises", "sleep", {"raise": True}),
        Task("after_raise", "sleep", {"seconds": 0}),
        Task("hangs", "sleep", {"seconds": 120}, timeout_s=3),
        Task("after_hang", "sleep", {"seconds": 0}),
        Task("dies", "sleep", {"exit_rank": 1}),
        Task("after_death", "sleep", {"seconds": 0}),
    ]
    return distributed.launch(tasks, 2, shared=shared, deadline_s=400)


def test_the_launcher_returns_each_ranks_data(run):
    assert run.nproc == 2 and run.machine["backend"] == "gloo"
    assert run.machine["cudnn"] is None and "cudnn_torch" in run.machine  # no cuDNN on CPUs
    assert run["ok"].ok and [r["rank"] for r in run["ok"].rows] == [0, 1]
    assert run["ok"].data["world"] == 2


def test_failures_become_rows_and_the_rest_still_runs(run):
    assert not run["raises"].ok and "asked to fail" in run["raises"].error
    assert run["after_raise"].ok
    assert not run["hangs"].ok and "timed out after 3 s" in run["hangs"].error
    assert run["after_hang"].ok
    assert not run["dies"].ok and run["after_death"].ok
    assert len(run.commands) == 3  # the hang and the death each needed a new job


def test_tensor_and_sequence_parallel_stack_equals_one_process(run):
    rows = run["tp_check"].rows
    reduced = [r for r in rows if r["amax reduction"] == "TP group"]
    assert {(r["precision"], r["sequence_parallel"]) for r in reduced} == {
        (p, sp) for p in ("bf16", "fp8") for sp in (True, False)
    }
    for row in reduced:
        assert "error" not in row, row
        # FP32 on CPUs: the same function up to the order of additions
        for key in ("output", "input gradient", "worst parameter gradient"):
            assert row[key] < 1e-5, (row, key)
    (control,) = [r for r in rows if r["amax reduction"] != "TP group"]
    assert control["precision"] == "fp8" and control["sequence_parallel"]
    assert control["output"] > 1e-4  # amaxes per rank: no longer the same function


def test_ddp_losses_equal_one_process(run):
    rows = {(r["precision"], r["layout"]): r["losses"] for r in run["ddp_check"].rows}
    one, two = rows["bf16", "1 GPU"], rows["bf16", "DDP, 2 GPUs"]
    assert max(abs(a - b) / b for a, b in zip(one, two, strict=True)) < 1e-5
    assert one[-1] < one[0]  # it trains


def test_amax_reduction_aligns_scales_across_ranks(run):
    rows = {r["setting"]: r["scales"] for r in run["amax"].rows}
    alone = rows["per rank (reduce_amax=False)"]
    assert alone[0]["input scale"] != alone[1]["input scale"]  # different data, scales
    assert alone[0]["weight scale"] == alone[1]["weight scale"]  # DDP keeps weights equal
    for setting in ("default group (amax_reduction_group=None)", "amax_reduction_group=world"):
        assert rows[setting][0] == rows[setting][1]
    assert run["amax"].data["reduction"]["time_us"] > 0


def test_save_and_load_keep_the_results(run, tmp_path):
    path = tmp_path / "run.json"
    distributed.save(run, path)
    back = distributed.load(path)
    assert back.results == run.results and back.nproc == 2
    assert json.loads(path.read_text())["stamp"]["backend"] == "gloo"


# --- the launch command and the environment -------------------------------------------------


def test_every_process_keeps_nvlink_multicast_off():
    env = distributed.worker_environment({"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["UB_SKIPMC"] == "1"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_commands_for_one_and_several_nodes():
    one = distributed.command(2, python="python")
    assert one[:4] == ["python", "-m", "torch.distributed.run", "--standalone"]
    assert one[one.index("--nproc-per-node") + 1] == "2"
    two = distributed.command(8, nnodes=2, rdzv_endpoint="node-0:29500", python="python")
    assert "--standalone" not in two and two[two.index("--nnodes") + 1] == "2"
    assert two[two.index("--rdzv-endpoint") + 1] == "node-0:29500"
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        distributed.command(8, nnodes=2)


def test_the_worker_refuses_to_run_outside_torchrun(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"tasks": []}))
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from fp8lab.parallel.worker import main; "
            f"main(['--plan', {str(plan)!r}, '--out', {str(tmp_path)!r}])",
        ],
        capture_output=True,
        text=True,
        env={
            k: v
            for k, v in distributed.worker_environment().items()
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
        },
    )
    assert done.returncode != 0 and "run this module under torchrun" in done.stderr


# --- committed multi-GPU results -------------------------------------------------------------


def test_committed_multi_gpu_results_are_stamped(root):
    from tools import stamps

    files = sorted((root / "notebooks" / "results").glob("08_parallelism_*gpu.json"))
    for path in files:
        gpus = int(path.stem.split("_")[-1].removesuffix("gpu"))
        record = distributed.load(path).stamp
        status = stamps.record_status(record, path.name, gpus=gpus)
        assert status.broken == () and status.state in ("fresh", "pending")
        assert not math.isnan(float(record.get("gpu_count", math.nan)))


def test_results_of_a_module_that_moved_are_pending_not_broken():
    from fp8lab import stamp as stamp_module
    from tools import stamps

    modules = ["fp8lab.distributed", "fp8lab.parallel_worker"]  # the worker's old home
    record = stamp_module.stamp_record(
        ["fp8lab.distributed"],
        {"gpu_name": "NVIDIA H100", "gpu_count": 2, "cuda": "13.0", "cudnn": "9.1.0"},
        transformer_engine="2.0",
    )
    record["library_modules"] = modules
    status = stamps.record_status(record, "results.json", gpus=2)
    assert status.state == "pending" and "fp8lab.parallel_worker" in status.changed


def test_the_rounds_alternate_every_variant_and_give_intervals(run):
    rows = run["rounds"].rows
    assert {(r["variant"], r["precision"]) for r in rows} == {
        (v, p) for v in tasks_rounds.VARIANTS for p in ("bf16", "fp8")
    }
    for row in rows:
        assert "error" not in row, row
        assert len(row["round_ms"]) == 2 and min(row["round_ms"]) > 0
    fair = report.round_efficiency(rows)
    ones = fair[fair.variant == "1 GPU"]
    assert (ones.efficiency == 1.0).all()
    assert (fair.low <= fair.efficiency).all() and (fair.efficiency <= fair.high).all()


# --- the chapter's reading of results ---------------------------------------------------------


def test_an_interval_gives_a_verdict_only_when_it_clears_the_threshold(measured_floors):
    assert report.against(1.02, 1.06, 0.95) == "above"
    assert report.against(0.80, 0.86, 0.95) == "below"
    assert report.against(0.93, 0.97, 0.95) == "not distinguishable from"  # holds it
    assert report.against(0.96, 0.99, 0.95) == "not distinguishable from"  # inside the floor
    assert report.against(math.nan, math.nan, 0.95) == "not distinguishable from"
    with pytest.raises(ValueError, match="low"):
        report.against(-0.1, 0.99, 0.95)
    low, high = report.ratio_interval([10.0, 10.2, 9.9, 10.1], [5.0, 5.1, 4.9, 5.05])
    assert 1.9 < low <= high < 2.1
    assert math.isnan(report.ratio_interval([10.0], [5.0, 5.1])[0])


def test_no_threshold_is_cleared_without_a_measured_floor(monkeypatch):
    from fp8lab.protocol import floor

    monkeypatch.setattr(floor, "FLOORS", {})
    assert report.against(1.5, 1.6, 0.95) == "not distinguishable from"


def test_the_efficiency_interval_is_the_protocols_ratio_interval():
    rows = [
        {"variant": "1 GPU", "precision": "bf16", "round_ms": [10.0, 10.2, 9.9]},
        {"variant": "DDP", "precision": "bf16", "round_ms": [10.5, 10.6, 10.4]},
    ]
    ddp = report.round_efficiency(rows).set_index("variant").loc["DDP"]
    ratios = [10.0 / 10.5, 10.2 / 10.6, 9.9 / 10.4]
    assert (ddp.efficiency, ddp.low, ddp.high) == pytest.approx(protocol.ratio_interval(ratios))


def test_an_older_result_file_is_read_and_its_gaps_named(root):
    path = root / "notebooks" / "results" / "08_parallelism_2gpu.json"
    missing = report.missing_fields(distributed.load(path))
    for line in missing:
        assert line.split(":")[0] in report.NEW_FIELDS


def test_collective_latency_is_timed_over_calls_back_to_back():
    assert tasks_speed.back_to_back(4096) == 100
    assert tasks_speed.back_to_back(4096, most=4) == 4
    assert tasks_speed.back_to_back(2**26) == 1 and tasks_speed.back_to_back(2**30) == 1


def test_the_hiding_window_ignores_small_collectives():
    comm = [(0.0, 0.01), (10.0, 14.0), (20.0, 23.0)]  # an amax reduction, two buckets
    compute = [(0.0, 9.0), (9.0, 22.0), (25.0, 30.0)]  # forward, backward, optimizer
    window = measure.hiding_window(comm, compute)
    assert window["window_us"] == pytest.approx(12.0)  # 10..22: the backward after bucket 1
    assert window["large_communication_us"] == pytest.approx(7.0)


def test_the_negative_control_input_differs_by_half():
    x = torch.zeros(8, 1, 16)
    y = tasks_checks.outlier_half(x)
    assert y[:4].abs().max() == 0 and y[4:, :, 0].min() == pytest.approx(32.0)


def test_visible_code_cells_of_the_chapter_stay_short(root):
    notebook = json.loads((root / "notebooks" / "08_parallelism.ipynb").read_text())
    for number, cell in enumerate(notebook["cells"]):
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] == "code" and "hide-input" not in tags:
            assert "".join(cell["source"]).count("\n") + 1 <= 28, number


# --- the committed two-GPU results, against bounds declared in the chapter ----------------------

TP_BOUND = 1.5  # TP's (CP's) distance from FP32 at most 1.5 times one GPU's
CONTROL_RATIO, CONTROL_SPREAD = 2.0, 0.01  # the control fails: 2x the distance or 1% scales
LOSS_BOUND = 2.0**-7  # DDP and FSDP2 losses within BF16's spacing near 1 of one GPU's
FLOOR = 1e-6  # distances below FP32's rounding count as this


def _committed(root):
    files = sorted((root / "notebooks" / "results").glob("08_parallelism_*gpu.json"))
    if not files:
        pytest.skip("no committed multi-GPU results")
    return distributed.load(files[-1])


def _ratio(row, split):
    parts = ("output", "input gradient", "worst parameter gradient")
    mine = max(row[f"{split} from FP32: {p}"] for p in parts)
    one = max(row[f"1 GPU from FP32: {p}"] for p in parts)
    return max(mine, FLOOR) / max(one, FLOOR)


@pytest.mark.parametrize("task, split", [("tp_check", "TP"), ("cp_check", "CP")])
def test_committed_parallel_results_stand_as_close_to_fp32_as_one_gpu(root, task, split):
    results = _committed(root)
    rows = [r for r in results[task].rows if f"{split} from FP32: output" in r]
    if not rows:
        pytest.skip(f"pending: the committed {task} results predate the FP32 reference")
    for row in rows:
        if row.get("amax reduction", "TP group") == "TP group":
            assert _ratio(row, split) <= TP_BOUND, row


def test_committed_negative_control_fails_visibly(root):
    rows = [r for r in _committed(root)["tp_check"].rows if "amax reduction" in r]
    if not rows:
        pytest.skip("pending: the committed tp_check results predate the negative control")
    (control,) = [r for r in rows if r["amax reduction"] != "TP group"]
    if "error" in control:  # TE refusing the layout is a visible failure too
        assert "amax reduction" in control["error"].lower(), control
        return
    spread = control.get("scale spread") or 0.0
    assert _ratio(control, "TP") >= CONTROL_RATIO or spread > CONTROL_SPREAD, control


def test_committed_ddp_and_fsdp2_losses_match_one_gpu(root):
    rows = _committed(root)["ddp_check"].rows
    if not any(r["layout"].startswith("FSDP2") for r in rows):
        pytest.skip("pending: the committed ddp_check results predate the FSDP2 checks")
    one = {r["precision"]: r["losses"] for r in rows if r["layout"] == "1 GPU"}
    for row in rows:
        if row["layout"] == "1 GPU" or "reduce_amax" in row["layout"]:
            continue
        if row["precision"] == "fp8_weights":
            continue  # held apart: test_committed_fsdp2_fp8_weights_gap_stands_reported
        assert "error" not in row, row
        base = one[row["precision"]]
        gap = max(abs(a - b) / abs(b) for a, b in zip(row["losses"], base, strict=True))
        assert gap <= LOSS_BOUND, (row["precision"], row["layout"], gap)


@pytest.mark.xfail(strict=True, reason="the committed run's FSDP2 with FP8 weights lands ~0.15 "
                   "from one GPU's loss, unexplained; chapter 08 reports it as not verified")
def test_committed_fsdp2_fp8_weights_gap_stands_reported(root):
    rows = _committed(root)["ddp_check"].rows
    weights = [r for r in rows if r["precision"] == "fp8_weights"]
    if len(weights) < 2:
        pytest.skip("pending: the committed ddp_check results predate the FP8-weight check")
    base = next(r["losses"] for r in weights if r["layout"] == "1 GPU")
    for row in weights:
        assert "error" not in row, row
        gap = max(abs(a - b) / abs(b) for a, b in zip(row["losses"], base, strict=True))
        assert gap <= LOSS_BOUND, (row["layout"], gap)
