"""The parallelism chapter's pieces on CPUs: the collectives model, the anchored projection,
the protocol's rounds across ranks, the torchrun launcher (two gloo processes), and the
committed two-GPU results and four-GPU predictions against the chapter's declared bounds."""

import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest
import torch

from fp8lab import collectives, distributed
from fp8lab import reference as te
from fp8lab.config import TransformerConfig, preset_config
from fp8lab.flops import layer_parameters
from fp8lab.parallel import projection, ranks

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


# --- the anchored projection (arithmetic) ------------------------------------------------------

LINK = projection.Link(alpha_s=20e-6, bus_gbs=300.0)


def test_a_ring_all_reduce_pays_latency_steps_and_its_share_of_bytes():
    assert projection.ring_all_reduce_s(2**20, 1, LINK) == 0.0
    two = projection.ring_all_reduce_s(0, 2, LINK)
    assert two == pytest.approx(LINK.alpha_s)  # a two-rank all-reduce: the fitted alpha
    assert projection.ring_all_reduce_s(0, 8, LINK) == pytest.approx(7 * LINK.alpha_s)
    wire = projection.ring_all_reduce_s(1e9, 4, LINK) - projection.ring_all_reduce_s(0, 4, LINK)
    assert wire == pytest.approx(1.5 * 1e9 / 300e9)


def test_buckets_end_with_the_remainder():
    assert projection.buckets(450, 200) == [200, 200, 50]
    assert projection.buckets(400, 200) == [200, 200]
    assert projection.buckets(10, 200) == [10]


def test_the_projection_returns_the_anchor_at_the_anchor_and_grows_with_n():
    kwargs = {"anchor_n": 2, "anchor_ms": 30.0, "window_ms": 12.0, "grad_bytes": 8e8,
              "bucket_bytes": 200 * 2**20, "link": LINK}
    steps = [projection.dp_step_ms(n, **kwargs) for n in (2, 4, 8, 16)]
    assert steps[0] == 30.0
    assert steps == sorted(steps) and steps[-1] > steps[0]


def test_the_last_bucket_is_charged_at_every_bandwidth():
    """Halving the bandwidth slows the projected step even when the rest fits the window."""
    kwargs = {"anchor_n": 2, "anchor_ms": 30.0, "window_ms": 1e3, "grad_bytes": 8e8,
              "bucket_bytes": 200 * 2**20}
    fast = projection.dp_step_ms(16, link=projection.Link(40e-6, 370.0), **kwargs)
    slow = projection.dp_step_ms(16, link=projection.Link(40e-6, 185.0), **kwargs)
    assert slow > fast


def test_scaled_steps_and_efficiency():
    assert projection.scaled_step_ms(10.0, 12.0, 3.0, 2.0) == pytest.approx(13.0)
    assert projection.efficiency(10.0, 12.5) == pytest.approx(0.8)


@pytest.mark.parametrize(
    "call",
    [
        lambda: projection.Link(-1.0, 100.0),
        lambda: projection.Link(1e-6, 0.0),
        lambda: projection.ring_all_reduce_s(-1, 2, LINK),
        lambda: projection.ring_all_reduce_s(10, 0, LINK),
        lambda: projection.buckets(0, 10),
        lambda: projection.buckets(1e9, 1),
        lambda: projection.dp_step_ms(4, anchor_n=1, anchor_ms=1.0, window_ms=1.0,
                                      grad_bytes=1.0, bucket_bytes=1.0, link=LINK),
        lambda: projection.efficiency(1.0, 0.0),
    ],
)
def test_the_projection_refuses_bad_input(call):
    with pytest.raises(ValueError):
        call()


def test_a_link_must_be_a_link():
    with pytest.raises(TypeError, match="link"):
        projection.ring_all_reduce_s(10, 2, (1e-6, 100.0))


# --- rounds across ranks ------------------------------------------------------------------------


def _record():
    """Two ranks, two rounds, two alternatives; rank 1's baseline is slower."""
    rank0 = {"times": {"one": [[10.0, 10.0], [10.0, 10.0]], "ddp": [[12.0], [12.0]]},
             "kernel": {}, "idle": {}}
    rank1 = {"times": {"one": [[11.0], [11.0]], "ddp": [[12.5], [12.5]]},
             "kernel": {}, "idle": {}}
    return {"cuda": False, "orders": [["one", "ddp"], ["ddp", "one"]], "ranks": [rank0, rank1]}


def test_combine_takes_the_median_the_slowest_or_one_rank():
    record = _record()
    assert ranks.combine(record, "median").round_ms("one") == (10.5, 10.5)
    assert ranks.combine(record, "slowest").round_ms("one") == (11.0, 11.0)
    assert ranks.combine(record, 0).round_ms("ddp") == (12.0, 12.0)
    ratio = ranks.combine(record, "median").compare("one", "ddp").estimate
    assert ratio == pytest.approx(12.25 / 10.5)
    assert ranks.round_ratio(ranks.combine(record, 1), "one", "ddp") == [12.5 / 11, 12.5 / 11]


@pytest.mark.parametrize("how, error", [("mean", ValueError), (2, ValueError),
                                        (True, ValueError)])
def test_combine_refuses_what_it_cannot_take(how, error):
    with pytest.raises((error, TypeError)):
        ranks.combine(_record(), how)
    with pytest.raises(TypeError, match="record"):
        ranks.combine({"times": {}})


def test_write_refuses_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="path"):
        ranks.write(tmp_path / "x.json", {})
    with pytest.raises(TypeError, match="data"):
        ranks.write(str(tmp_path / "x.json"), [1])


# --- the launcher ---------------------------------------------------------------------------------

WORKER = """
import json, sys
import torch.distributed as dist
from fp8lab.parallel.ranks import gather, rounds_on_ranks, write

args, out = json.loads(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo")
if args.get("fail"):
    raise SystemExit(3)
if args.get("raise") and dist.get_rank() == 0:
    raise RuntimeError("rank 0 says no")
found = rounds_on_ranks({"a": lambda: None, "b": lambda: dist.barrier()}, "cpu",
                        rounds=2, calls=2, warmup=1)
write(out, {"ranks": gather(dist.get_rank()), "args": args, "rounds": found})
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def worker_file(tmp_path_factory):
    if torch.cuda.is_available():
        pytest.skip("runs two gloo processes on CPUs")
    path = tmp_path_factory.mktemp("worker") / "worker.py"
    path.write_text(textwrap.dedent(WORKER))
    return path


def test_torchrun_returns_rank_zeros_result(worker_file):
    result = distributed.torchrun(worker_file, 2, {"x": 1}, timeout_s=120)
    assert result["ranks"] == [0, 1] and result["args"] == {"x": 1}
    assert result["seconds"] > 0
    found = ranks.combine(result["rounds"], "median")
    assert found.names == ("a", "b") and len(found.round_ms("a")) == 2
    orders = result["rounds"]["orders"]
    assert len(orders) == 2 and all(sorted(o) == ["a", "b"] for o in orders)


def test_a_failed_job_comes_back_as_an_error(worker_file):
    result = distributed.torchrun(worker_file, 2, {"fail": True}, timeout_s=120)
    assert set(result) == {"error", "seconds"} and "exit code" in result["error"]


def test_a_failed_job_shows_the_workers_exception(worker_file):
    result = distributed.torchrun(worker_file, 2, {"raise": True}, timeout_s=120)
    assert "RuntimeError: rank 0 says no" in result["error"]


def test_finished_jobs_are_replayed_from_the_cache_and_a_spent_budget_stops(
        worker_file, tmp_path, monkeypatch):
    cache = tmp_path / "jobs"
    monkeypatch.setenv(distributed.JOB_CACHE_ENV, str(cache))
    monkeypatch.setenv(distributed.JOB_BUDGET_ENV, "0")
    monkeypatch.setattr(distributed, "_first_job_at", None)
    first = distributed.torchrun(worker_file, 2, {"x": 2}, timeout_s=120)
    assert len(list(cache.glob("*.json"))) == 1  # the first job always runs
    with pytest.raises(distributed.JobBudgetSpent, match="run the same command again"):
        distributed.torchrun(worker_file, 2, {"x": 3}, timeout_s=120)  # budget spent
    again = distributed.torchrun(worker_file, 2, {"x": 2}, timeout_s=120)  # from the cache
    assert again == first
    failed = distributed.torchrun  # failures are not saved: they run again
    monkeypatch.setenv(distributed.JOB_BUDGET_ENV, "1e9")
    assert "error" in failed(worker_file, 2, {"fail": True}, timeout_s=120)
    assert len(list(cache.glob("*.json"))) == 1
    monkeypatch.setenv(distributed.JOB_BUDGET_ENV, "soon")
    with pytest.raises(ValueError, match="FP8LAB_JOB_BUDGET_S='soon'"):
        distributed.torchrun(worker_file, 2, {"x": 4}, timeout_s=120)


LOG = """starting
[rank0]: Traceback (most recent call last):
[rank0]:   File "pp.py", line 3, in <module>
[rank0]:     stage.step()
[rank0]: RuntimeError: shapes differ
[rank1]: waiting
Traceback (most recent call last):
  File "/venv/torch/distributed/run.py", line 990, in main
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""


def test_first_traceback_finds_the_workers_not_torchruns():
    found = distributed.first_traceback(LOG)
    assert found.splitlines()[0].startswith("Traceback")
    assert found.endswith("RuntimeError: shapes differ") and "[rank0]" not in found
    only_torchrun = LOG.split("[rank1]: waiting\n")[1]
    assert distributed.first_traceback(only_torchrun) == ""
    assert distributed.first_traceback("no traceback here") == ""
    with pytest.raises(TypeError, match="log must be a str"):
        distributed.first_traceback(None)


HANGING = """
import json, os, signal, sys, time
from pathlib import Path

signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a worker stuck where SIGTERM cannot reach

rank = int(os.environ["RANK"])
Path(sys.argv[2] + f".pid{rank}").write_text(str(os.getpid()))
if rank == 0:
    Path(sys.argv[2]).write_text(json.dumps({"written": "before the hang"}))
time.sleep(600)
"""


def test_a_job_past_its_time_is_stopped_with_its_workers(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HANGING)
    seen = {}
    real = distributed._stop

    def stop(job):  # note the workers' pids before they are stopped
        folder = Path(job.args[-1]).parent
        seen.update({p.name: int(p.read_text()) for p in folder.glob("result.json.pid*")})
        return real(job)

    with mock.patch.object(distributed, "_stop", stop):
        result = distributed.torchrun(script, 2, timeout_s=15)
    assert "timed out after 15 s" in result["error"]
    assert result["written"] == "before the hang"  # what rank 0 wrote is kept
    assert len(seen) == 2
    for pid in seen.values():
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(
            f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_the_launcher_refuses_bad_input(tmp_path):
    with pytest.raises(ValueError, match="script"):
        distributed.torchrun(tmp_path / "missing.py", 2)
    (tmp_path / "w.py").write_text("")
    with pytest.raises(TypeError, match="args"):
        distributed.torchrun(tmp_path / "w.py", 2, {"x": object()})
    with pytest.raises(ValueError, match="nproc"):
        distributed.torchrun(tmp_path / "w.py", 0)


# --- the launch command and the environment -------------------------------------------------


def test_every_process_keeps_nvlink_multicast_off():
    env = distributed.worker_environment({"EXTRA": "1"})
    for key, value in distributed.MULTICAST_OFF.items():
        assert env[key] == value
    assert env["EXTRA"] == "1" and env["OMP_NUM_THREADS"]
    with pytest.raises(TypeError):
        distributed.worker_environment({"A": 1})


def test_commands_for_one_and_several_nodes():
    one = distributed.command(2, "w.py")
    assert "--standalone" in one and one[-1] == "w.py"
    several = distributed.command(8, "w.py", nnodes=2, rdzv_endpoint="node-0:29500")
    assert several[3:5] == ["--nnodes", "2"] and "node-0:29500" in several
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        distributed.command(8, "w.py", nnodes=2)


# --- the chapter ------------------------------------------------------------------------------


def _notebook(root):
    return json.loads((root / "notebooks" / "08_parallelism.ipynb").read_text())


def test_visible_code_cells_of_the_chapter_stay_short(root):
    for number, cell in enumerate(_notebook(root)["cells"]):
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] == "code" and "hide-input" not in tags:
            assert "".join(cell["source"]).count("\n") + 1 <= 40, number


def test_the_parallel_code_is_in_visible_cells(root):
    """Every worker file is written by a visible cell, and no hidden cell calls TE or
    torch.distributed."""
    visible, hidden = "", ""
    for cell in _notebook(root)["cells"]:
        if cell["cell_type"] != "code":
            continue
        text = "".join(cell["source"])
        if "hide-input" in cell.get("metadata", {}).get("tags", []):
            hidden += text
        else:
            visible += text
    for name in ("common", "links", "dp", "fsdp", "tp", "cp", "pp"):
        assert f"%%writefile workers08/{name}.py" in visible
    for api in ("fully_shard", "amax_reduction_group", "set_context_parallel_group",
                "PipelineStage", "dist.", "te."):
        assert api in visible and api not in hidden, api


# --- the committed two-GPU results, against bounds declared in the chapter ----------------------

TP_BOUND = 1.5  # TP's (CP's) distance from FP32 at most 1.5 times one GPU's
CONTROL_RATIO, CONTROL_SPREAD = 2.0, 0.01  # the control fails: 2x the distance or 1% scales
LOSS_BOUND = 2.0**-7  # DDP and FSDP2 losses within BF16's spacing near 1 of one GPU's
FLOOR = 1e-6  # distances below FP32's rounding count as this
TWO_GPU = "08_parallelism_2gpu.json"


def _committed(root):
    path = root / "notebooks" / "results" / TWO_GPU
    if not path.exists():
        pytest.skip("no committed two-GPU results")
    return json.loads(path.read_text())


def _rows(root, task):
    return _committed(root)["results"][task]["data"]["rows"]


def test_committed_two_gpu_results_are_stamped(root):
    from tools import stamps

    record = _committed(root)["stamp"]
    status = stamps.record_status(record, TWO_GPU, gpus=2)
    assert status.broken == () and status.state in ("fresh", "pending")
    assert record["gpu_count"] == 2


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


def _ratio(row, split):
    parts = ("output", "input gradient", "worst parameter gradient")
    mine = max(row[f"{split} from FP32: {p}"] for p in parts)
    one = max(row[f"1 GPU from FP32: {p}"] for p in parts)
    return max(mine, FLOOR) / max(one, FLOOR)


@pytest.mark.parametrize("task, split", [("tp_check", "TP"), ("cp_check", "CP")])
def test_committed_parallel_results_stand_as_close_to_fp32_as_one_gpu(root, task, split):
    rows = [r for r in _rows(root, task) if f"{split} from FP32: output" in r]
    assert rows
    for row in rows:
        if row.get("amax reduction", "TP group") == "TP group":
            assert _ratio(row, split) <= TP_BOUND, row


def test_committed_negative_control_was_refused(root):
    """The old control (reduce_amax=False under SP) never ran: TE refused it. The chapter's
    control now passes a one-rank amax_reduction_group instead, which TE accepts."""
    (control,) = [r for r in _rows(root, "tp_check") if r["amax reduction"] != "TP group"]
    assert "amax reduction" in control["error"].lower(), control


def test_committed_ddp_and_fsdp2_losses_match_one_gpu(root):
    rows = _rows(root, "ddp_check")
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


@pytest.mark.xfail(strict=True, reason="in the committed two-GPU run the one-GPU FP8-weight "
                   "reference skipped the transpose refresh after each optimizer step (its "
                   "loss stalls); the chapter's FSDP2 check now refreshes both sides")
def test_committed_fsdp2_fp8_weights_gap_stands_reported(root):
    weights = [r for r in _rows(root, "ddp_check") if r["precision"] == "fp8_weights"]
    base = next(r["losses"] for r in weights if r["layout"] == "1 GPU")
    for row in weights:
        gap = max(abs(a - b) / abs(b) for a, b in zip(row["losses"], base, strict=True))
        assert gap <= LOSS_BOUND, (row["layout"], gap)


# --- the four-GPU predictions, committed before any four-GPU run --------------------------------


def test_the_four_gpu_predictions_are_current_and_stamped(root):
    done = subprocess.run([sys.executable, "-m", "tools.ch08_predict", "--check"], cwd=root,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((root / "notebooks" / "results"
                         / "08_parallelism_4gpu_prediction.json").read_text())
    assert record["stamp"]["source_gpu"] and len(record["stamp"]["source_sha256"]) == 64
    layouts = {(r["layout"], r["precision"]) for r in record["steps"]}
    assert {("DDP", "fp8"), ("FSDP2", "fp8"), ("TP=4+SP", "fp8")} <= layouts
    assert all(0 < r["efficiency"] <= 1 for r in record["steps"])
    assert statistics.median(r["peak_mib"] for r in record["peaks"]) > 0
