"""Property-test entries of the parallelism chapter's modules: collectives, distributed (the
launcher) and parallel (rounds across ranks, the anchored projection)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import hypothesis.strategies as st

from fp8lab import collectives, distributed
from fp8lab.parallel import projection, ranks
from tests.property_support import TINY, Entry, ints, maybe, reals

OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
LAYOUTS = ("DP", "FSDP", "TP", "TP+SP", "CP")
_FOLDER = Path(tempfile.mkdtemp(prefix="fp8lab-inputs-"))


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
    "distributed.command": Entry(
        distributed.command,
        {
            "nproc": maybe(ints(1, 8)),
            "nnodes": maybe(ints(1, 4)),
            "rdzv_endpoint": maybe(st.sampled_from([None, "node-0:29500"])),
        },
        aliases={"nnodes": ["rdzv_endpoint"]},
    ),
    "distributed.torchrun": Entry(
        lambda script, nproc: distributed.torchrun(script, nproc, timeout_s=5),
        {"script": maybe(st.just(str(_FOLDER / "missing.py"))), "nproc": maybe(ints(1, 4))},
    ),
    "distributed.first_traceback": Entry(
        distributed.first_traceback,
        {"log": maybe(st.sampled_from(["", "Traceback (most recent call last):\nValueError: x",
                                       "[rank1]: Traceback (most recent call last):"]))},
    ),
    "distributed.worker_environment": Entry(
        distributed.worker_environment, {"extra": maybe(st.just({"A": "1"}))}
    ),
    "parallel.projection.Link": Entry(
        projection.Link, {"alpha_s": maybe(reals(0, 1e-3)), "bus_gbs": maybe(reals(1, 900))}
    ),
    "parallel.projection.ring_all_reduce_s": Entry(
        lambda nbytes, n: projection.ring_all_reduce_s(nbytes, n, projection.Link(1e-5, 100)),
        {"nbytes": maybe(reals(0, 1e9)), "n": maybe(ints(1, 64))},
    ),
    "parallel.projection.buckets": Entry(
        projection.buckets,
        {"grad_bytes": maybe(reals(1, 1e9)), "bucket_bytes": maybe(reals(1, 1e9))},
    ),
    "parallel.projection.scaled_step_ms": Entry(
        projection.scaled_step_ms,
        {
            "one_ms": maybe(reals(1, 100)),
            "anchor_ms": maybe(reals(1, 100)),
            "traffic_s": maybe(reals(0, 1)),
            "anchor_traffic_s": maybe(reals(1e-3, 1)),
        },
    ),
    "parallel.projection.efficiency": Entry(
        projection.efficiency, {"one_ms": maybe(reals(1, 100)), "step_ms": maybe(reals(1, 100))}
    ),
    "parallel.ranks.combine": Entry(
        ranks.combine,
        {
            "record": maybe(st.just({"cuda": False, "orders": [["a"], ["a"]], "ranks": [
                {"times": {"a": [[1.0], [2.0]]}, "kernel": {}, "idle": {}}]})),
            "how": maybe(st.sampled_from(["median", "slowest", 0])),
        },
    ),
}
