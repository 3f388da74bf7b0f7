"""Shared pieces of the property tests (tests/test_inputs.py and the tests/inputs_*.py files).

An entry says how to call one public entry point: ``call(**kwargs)`` with each kwarg drawn from a
strategy; arguments wrapped in :func:`maybe` may also be replaced by junk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import hypothesis.strategies as st

from fp8lab.config import TransformerConfig

NAN, INF = float("nan"), float("inf")
JUNK = st.sampled_from(
    [
        None,
        True,
        False,
        0,
        -1,
        -3,
        0.5,
        -2.5,
        NAN,
        INF,
        -INF,
        "",
        "no",
        "fp8",
        [],
        {},
        (1, 2),
        object(),
    ]
)
TINY = TransformerConfig(32, 64, 4, num_layers=2, vocab_size=64, max_seq_len=16, name="tiny")
TINY_GQA = TransformerConfig(
    32,
    64,
    4,
    num_gqa_groups=2,
    num_layers=1,
    vocab_size=64,
    max_seq_len=16,
    activation="swiglu",
    normalization="RMSNorm",
    bias=False,
    position_embedding="rope",
    name="tiny-gqa",
)


def ints(low=1, high=64):
    return st.integers(low, high)


def reals(low=1e-3, high=1e6):
    return st.floats(low, high, allow_nan=False, allow_infinity=False)


@dataclass(frozen=True)
class Maybe:
    """An argument the tests may replace by junk; ``valid`` draws its valid values."""

    valid: st.SearchStrategy


def maybe(strategy) -> Maybe:
    return Maybe(strategy)


def mixed(strategy):
    """Valid values two times in three, junk otherwise (for arguments wrapped in :func:`maybe`)."""
    return (
        st.one_of(strategy.valid, strategy.valid, JUNK) if isinstance(strategy, Maybe) else strategy
    )


def valid_only(strategy):
    return strategy.valid if isinstance(strategy, Maybe) else strategy


@dataclass
class Entry:
    """How to call one public entry point: ``call(**kwargs)``, each kwarg drawn from its
    strategy."""

    call: object
    args: dict
    aliases: dict = field(default_factory=dict)  # argument -> other words its error may use
    signed: bool = False  # negative numbers are legitimate results
    missing_ok: bool = False  # NaN marks a missing entry (a table cell)
    examples: int = 40
