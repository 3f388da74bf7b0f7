"""Shared fixtures: a fixed seed for every test, and the repository root."""

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def root() -> Path:
    return ROOT


def has_real_te() -> bool:
    from fp8lab.environment import detect

    return detect().uses_real_te


gpu = pytest.mark.skipif(not has_real_te(), reason="needs a CUDA GPU with Transformer Engine (GPU lane only)")
