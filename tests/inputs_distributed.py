"""Property-test entries of the parallelism chapter's modules: collectives, distributed (the
launcher) and parallel (the processes it starts)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import hypothesis.strategies as st

from fp8lab import collectives, distributed
from fp8lab.parallel import jobs, worker
from tests.property_support import TINY, Entry, ints, maybe, reals

OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
LAYOUTS = ("DP", "FSDP", "TP", "TP+SP", "CP")
_FOLDER = Path(tempfile.mkdtemp(prefix="fp8lab-inputs-"))


def _empty_run(nproc=2):
    return distributed.launch([], nproc)


def _save(nproc, name):
    run = distributed.Run(nproc, "gloo", {}, {"preset": "smoke"}, 0.0)
    return distributed.save(run, _FOLDER / name if isinstance(name, str) else name)


def _load(name):
    return distributed.load(name if not isinstance(name, str) else _FOLDER / name)


def _traffic(layout, n, bus_gbs):
    traffic = collectives.step_traffic(TINY, layout, 2, 16, n)
    return collectives.traffic_time(traffic, bus_gbs)


ENTRIES = {
    "collectives.bus_factor": Entry(
        collectives.bus_factor, {"op": maybe(st.sampled_from(OPS)), "n": maybe(ints(1, 64))}
    ),
    "collectives.bus_bandwidth": Entry(
        collectives.bus_bandwidth,
        {
            "op": maybe(st.sampled_from(OPS)),
            "nbytes": maybe(reals(1, 1e10)),
            "seconds": maybe(reals(1e-6, 10)),
            "n": maybe(ints(1, 64)),
        },
    ),
    "collectives.collective_time": Entry(
        collectives.collective_time,
        {
            "op": maybe(st.sampled_from(OPS)),
            "nbytes": maybe(reals(0, 1e10)),
            "n": maybe(ints(1, 64)),
            "bus_gbs": maybe(reals(1, 1000)),
            "alpha_s": maybe(reals(0, 1e-3)),
        },
    ),
    "collectives.AlphaBeta": Entry(
        lambda op, n, alpha_s, bus_gbs, nbytes: collectives.AlphaBeta(
            op, n, alpha_s, bus_gbs
        ).bandwidth_gbs(nbytes),
        {
            "op": maybe(st.sampled_from(OPS[:3])),
            "n": maybe(ints(2, 64)),
            "alpha_s": maybe(reals(0, 1e-3)),
            "bus_gbs": maybe(reals(1, 1000)),
            "nbytes": maybe(reals(1, 1e10)),
        },
    ),
    "collectives.fit_alpha_beta": Entry(
        collectives.fit_alpha_beta,
        {
            "nbytes": maybe(st.just([1e3, 1e5, 1e7])),
            "seconds": maybe(st.just([1e-5, 2e-5, 1e-4])),
            "op": maybe(st.sampled_from(OPS[:3])),
            "n": maybe(ints(2, 8)),
        },
    ),
    "collectives.Collective": Entry(
        lambda name, op, nbytes, n, count: (
            collectives.Collective(name, op, nbytes, n, count).bytes_sent
        ),
        {
            "name": maybe(st.just("x")),
            "op": maybe(st.sampled_from(OPS)),
            "nbytes": maybe(reals(0, 1e9)),
            "n": maybe(ints(1, 16)),
            "count": maybe(ints(1, 8)),
        },
    ),
    "collectives.step_traffic": Entry(
        collectives.step_traffic,
        {
            "cfg": maybe(st.just(TINY)),
            "layout": maybe(st.sampled_from(LAYOUTS)),
            "batch": maybe(ints(1, 8)),
            "seq": maybe(st.sampled_from([16, 32])),
            "n": maybe(st.sampled_from([1, 2, 4, 8])),
        },
    ),
    "collectives.traffic_time": Entry(
        _traffic,
        {
            "layout": maybe(st.sampled_from(LAYOUTS)),
            "n": maybe(st.sampled_from([1, 2, 4])),
            "bus_gbs": maybe(reals(1, 1000)),
        },
    ),
    "parallel.jobs.Task": Entry(
        jobs.Task,
        {
            "name": maybe(st.sampled_from(["links", "a_b", "x1"])),
            "kind": maybe(st.sampled_from(["links", "ddp", "sleep"])),
            "args": maybe(st.just({"seq": 16})),
            "timeout_s": maybe(reals(1, 600)),
        },
    ),
    "distributed.TaskResult": Entry(
        distributed.TaskResult,
        {
            "name": maybe(st.just("t")),
            "kind": maybe(st.just("sleep")),
            "ok": maybe(st.booleans()),
            "data": maybe(st.just({"rows": []})),
            "seconds": maybe(reals(0, 10)),
        },
    ),
    "distributed.Run": Entry(
        lambda nproc, seconds: distributed.Run(nproc, "gloo", {}, {}, seconds),
        {"nproc": maybe(ints(1, 8)), "seconds": maybe(reals(0, 100))},
    ),
    "distributed.command": Entry(
        distributed.command,
        {
            "nproc": maybe(ints(1, 8)),
            "nnodes": maybe(ints(1, 4)),
            "rdzv_endpoint": maybe(st.sampled_from([None, "node-0:29500"])),
        },
        aliases={"nnodes": ["rdzv_endpoint"]},
    ),
    "distributed.launch": Entry(
        lambda tasks, nproc, deadline_s: distributed.launch(tasks, nproc, deadline_s=deadline_s),
        {
            "tasks": maybe(st.just([])),
            "nproc": maybe(ints(1, 4)),
            "deadline_s": maybe(reals(1, 100)),
        },
        examples=20,
    ),
    "distributed.save": Entry(
        _save,
        {"nproc": maybe(ints(1, 4)), "name": maybe(st.just("saved.json"))},
        aliases={"name": ["path"]},
        examples=20,
    ),
    "distributed.load": Entry(
        _load, {"name": maybe(st.just("missing.json"))}, aliases={"name": ["path"]}
    ),
    "distributed.source": Entry(
        distributed.source, {"name": maybe(st.sampled_from(["ddp_model", "fsdp_model"]))}
    ),
    "distributed.worker_environment": Entry(
        distributed.worker_environment, {"extra": maybe(st.just({"A": "1"}))}
    ),
    "parallel.worker.main": Entry(
        worker.main,
        {"argv": maybe(st.just(["--plan", "/nonexistent/plan.json", "--out", "/tmp"]))},
    ),
}
