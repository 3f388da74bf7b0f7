"""Shared fixtures: a fixed seed for every test, the repository root, and the ``gpu`` marker.

Tests marked ``@pytest.mark.gpu`` need a CUDA GPU with FP8 and Transformer Engine. Elsewhere
they are skipped with the reason: no CUDA GPU, TE that does not import (a CUDA machine without
TE skips them instead of failing collection), or TE's own ``is_fp8_available(return_reason=True)``
answer. ``pytest -m gpu`` selects them; ``pytest -m "not gpu"`` the rest.
"""

from functools import lru_cache
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake_machine() -> dict:
    """What a stamp records of the machine it was made on: an H200 with TE, for stamps made in
    tests (a fresh dict per test, free to edit)."""
    return {
        "gpu_name": "NVIDIA H200",
        "gpu_count": 1,
        "compute_capability": "9.0",
        "torch": "2.11.0",
        "cuda": "13.0",
        "transformer_engine": "2.20.2",
        "cudnn": "9.19.0",
        "cudnn_torch": "9.19.0",
    }


@pytest.fixture
def measured_floors(monkeypatch) -> dict:
    """Session floors as if the panel had run in three sessions (device 2%, host 5%, kernel
    3%), so that a test can reach every verdict word; the checkout's own floors may still be
    infinite (no panel measured yet)."""
    from fp8lab.protocol import floor

    floors = {
        regime: floor.Floor(regime, relative, 3, 1)
        for regime, relative in (("device", 0.02), ("host", 0.05), ("kernel", 0.03))
    }
    monkeypatch.setattr(floor, "FLOORS", floors)
    return floors


@lru_cache(maxsize=1)
def gpu_skip_reason() -> str | None:
    """None where the GPU tests can run, else why not."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU with Transformer Engine (GPU lane only)"
    try:
        import transformer_engine.pytorch as te
    except Exception as error:  # TE raises many kinds of errors when its library is missing
        return f"Transformer Engine does not import here: {type(error).__name__}: {error}".splitlines()[
            0
        ]
    available, reason = te.is_fp8_available(return_reason=True)
    return None if available else f"FP8 is not available here: {reason}"


def pytest_collection_modifyitems(config, items):
    reason = gpu_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def root() -> Path:
    return ROOT
