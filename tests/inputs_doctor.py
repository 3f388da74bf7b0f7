"""Property-test entries for fp8lab.doctor (read by tests/test_inputs.py)."""

from __future__ import annotations

import hypothesis.strategies as st

from fp8lab import doctor
from tests.property_support import Entry, maybe

ENTRIES = {
    "doctor.Check": Entry(
        lambda name, status, detail: doctor.Check(name, status, detail).line(),
        {
            "name": maybe(st.sampled_from(["GPU", "cuDNN"])),
            "status": maybe(st.sampled_from(["ok", "WARN", "FAIL"])),
            "detail": maybe(st.sampled_from(["1 x NVIDIA H200", "not used (no CUDA GPU)"])),
        },
    ),
    "doctor.run_checks": Entry(
        lambda smoke: len(doctor.run_checks(smoke=smoke)[0]),
        {"smoke": maybe(st.booleans())},
        examples=4,
    ),
    # argv=None would read pytest's own command line, so only lists are drawn
    "doctor.main": Entry(
        doctor.main,
        {"argv": st.sampled_from([["--skip-smoke"], ["--json", "--skip-smoke"], ("--json",)])},
        examples=3,
    ),
}
