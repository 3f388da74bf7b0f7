"""Where a step's time goes: the profiler breakdown."""

import warnings

import pytest
import torch

from fp8lab import profiling


def test_time_breakdown_is_silent_and_its_shares_add_up():
    """A chapter prints this table: the profiler must not leave a warning beside it (torch
    2.10-2.11 warned about clearing events between cycles even with a single cycle)."""
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        by_category, by_kernel = profiling.time_breakdown(lambda: (a @ b).relu(), iters=3)
    assert by_category["share"].sum() == pytest.approx(1.0)
    assert "GEMM" in by_category.index
    assert set(by_kernel["category"]) <= {name for name, _ in profiling.CATEGORIES} | {
        profiling.OTHER
    }
