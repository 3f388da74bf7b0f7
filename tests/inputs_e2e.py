"""Property-test entries for chapter 09's kit, :mod:`fp8lab.e2e` (read by tests/test_inputs.py)."""

from __future__ import annotations

import tempfile

import hypothesis.strategies as st
import torch

from fp8lab import e2e
from fp8lab.e2e.results import COMMANDS
from tests.inputs_corpus import TINY, TOKENIZER
from tests.property_support import Entry, maybe

OUT = tempfile.mkdtemp(prefix="fp8lab-e2e-")
RECORD = {"model": "llama", "setting": "bf16", "seed": 0, "train_loss": [1.0]}
MODEL = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8))
BATCHES = [(torch.randint(0, 8, (2, 5)), torch.randint(0, 8, (2, 5))) for _ in range(2)]


def _bench(preset, device, corpus, tokenizer):
    return e2e.Bench(preset, device=device, log=None, corpus=corpus, tokenizer=tokenizer).vocab_size


ENTRIES = {
    "e2e.parse_runs": Entry(
        e2e.parse_runs,
        {"runs": maybe(st.sampled_from(["bf16", "bf16:1, delayed", "current:2,block"]))},
        examples=20,
    ),
    "e2e.model_config": Entry(
        e2e.model_config,
        {
            "model": maybe(st.sampled_from(e2e.MODELS)),
            "vocab_size": maybe(st.sampled_from([512, 8192, 50257])),
            "preset": maybe(st.sampled_from(e2e.PRESETS)),
        },
        examples=20,
    ),
    "e2e.result_modules": Entry(
        lambda command: len(e2e.result_modules(command)),
        {"command": maybe(st.sampled_from(COMMANDS))},
        examples=4,
    ),
    "e2e.load_results": Entry(
        lambda directory: len(e2e.load_results(directory)),
        {"directory": maybe(st.sampled_from([e2e.RESULTS_DIR, str(e2e.RESULTS_DIR)]))},
        examples=4,
    ),
    "e2e.write_record": Entry(
        lambda record, out: e2e.write_record(record, out).stat().st_size,
        {"record": maybe(st.just(RECORD)), "out": maybe(st.just(OUT))},
        examples=10,
    ),
    "e2e.evaluate": Entry(
        lambda model, batches: e2e.evaluate(model, batches),
        {"model": maybe(st.just(MODEL)), "batches": maybe(st.just(BATCHES))},
        examples=10,
    ),
    "e2e.RotaryStandIn": Entry(
        lambda dim, seq, offset: tuple(e2e.RotaryStandIn(dim)(seq, offset).shape),
        {
            "dim": maybe(st.sampled_from([2, 8, 64, 128])),
            "seq": st.integers(1, 64),  # valid only: forward adds offset before checking it
            "offset": maybe(st.integers(0, 8)),
        },
        examples=20,
    ),
    "e2e.Bench": Entry(
        _bench,
        {
            "preset": maybe(st.just("smoke")),
            "device": maybe(st.just("cpu")),
            "corpus": maybe(st.just(TINY)),
            "tokenizer": maybe(st.just(TOKENIZER)),
        },
        examples=6,
    ),
}
