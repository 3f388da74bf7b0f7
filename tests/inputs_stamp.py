"""Property-test entries for fp8lab.stamp (making stamps), tools/stamps.py (checking them) and
the cuDNN report (read by tests/test_inputs.py)."""

from __future__ import annotations

import hypothesis.strategies as st

from fp8lab import environment, stamp
from tests.property_support import Entry, ints, maybe
from tools import stamps

NOTEBOOK = {"cells": [{"cell_type": "code", "source": "import fp8lab.flops"}]}
MACHINE = {
    "gpu_name": "NVIDIA H200",
    "gpu_count": 1,
    "compute_capability": "9.0",
    "torch": "2.11.0",
    "cuda": "13.0",
    "transformer_engine": "2.20.2",
    "cudnn": "9.19.0",
    "cudnn_torch": "9.19.0",
}
RECORD = stamp.stamp_record(["fp8lab.flops"], MACHINE)
CHAPTER = stamps.toc_notebooks()[0]


def _state(record, name, gpus):
    return len(stamps.record_status(record, name, gpus).pending)


ENTRIES = {
    "stamp.code_cells": Entry(
        lambda notebook: len(stamp.code_cells(notebook)), {"notebook": maybe(st.just(NOTEBOOK))}
    ),
    "tools.stamps.code_hash": Entry(
        lambda notebook: len(stamps.code_hash(notebook)), {"notebook": maybe(st.just(NOTEBOOK))}
    ),
    "stamp.library_modules": Entry(
        lambda notebook: len(stamp.library_modules(notebook)),
        {"notebook": maybe(st.just(NOTEBOOK))},
    ),
    "stamp.library_hash": Entry(
        lambda modules: len(stamp.library_hash(modules)),
        {"modules": maybe(st.just(["fp8lab.flops"]))},
    ),
    "stamp.module_hashes": Entry(
        lambda modules: len(stamp.module_hashes(modules)),
        {"modules": maybe(st.just(["fp8lab.flops"]))},
    ),
    "stamp.producer_modules": Entry(
        lambda script: len(stamp.producer_modules(script)),
        {"script": maybe(st.just(stamp.ROOT / "tools" / "lane.py"))},
        examples=10,
    ),
    "tools.stamps.record_status": Entry(
        _state,
        {
            "record": maybe(st.just(RECORD)),
            "name": maybe(st.just("r.json")),
            "gpus": maybe(ints(1, 2)),
        },
    ),
    "tools.stamps.Status": Entry(
        lambda: len(stamps.record_status(RECORD, "r.json").page_note()), {}, examples=1
    ),
    "tools.stamps.notebook_status": Entry(
        lambda path: len(stamps.notebook_status(path).name),
        {"path": maybe(st.just(CHAPTER))},
        examples=10,
    ),
    "stamp.stamp_record": Entry(
        lambda modules, machine: len(stamp.stamp_record(modules, machine)),
        {"modules": maybe(st.just(["fp8lab.flops"])), "machine": st.just(MACHINE)},
    ),
    "tools.stamps.toc_notebooks": Entry(
        lambda root: len(stamps.toc_notebooks(root)), {"root": maybe(st.just(stamps.ROOT))}
    ),
    "environment.CudnnReport": Entry(
        lambda: environment.CudnnReport("9.19.0", "9.19.0", "9.19.0").describe(), {}, examples=1
    ),
    "environment.require_one_cudnn": Entry(environment.require_one_cudnn, {}, examples=1),
}
