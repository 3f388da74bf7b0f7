"""Property-test entries for fp8lab.corpus (read by tests/test_inputs.py)."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np

from fp8lab import corpus as text
from tests.property_support import Entry, ints, maybe, reals

TINY = text.stdlib_corpus(max_bytes=60_000)
TOKENIZER = text.train_tokenizer(TINY, 384, cache=False)


def _corpus(train_files, train_bytes):
    return text.Corpus(
        root="lib",
        python="3.12.0",
        train_files=train_files,
        validation_files=("v.py",),
        train_texts=("x = 1\n",),
        validation_texts=("y = 2\n",),
        train_bytes=train_bytes,
        validation_bytes=6,
        sha256="0" * 64,
    ).describe()


def _loader(batch, seq, seed, shuffle, step):
    loader = text.PackedLoader(
        np.arange(2000, dtype=np.uint16), batch, seq, seed=seed, shuffle=shuffle
    )
    inputs, targets = loader.batch_at(step)
    return int(inputs.sum()) + int(targets.sum())


ENTRIES = {
    "corpus.stdlib_corpus": Entry(
        lambda validation_share, max_bytes: text.stdlib_corpus(
            validation_share, max_bytes
        ).describe(),
        {
            "validation_share": maybe(reals(0.02, 0.5)),
            "max_bytes": maybe(st.sampled_from([None, 40_000, 100_000])),
        },
        examples=10,
    ),
    "corpus.Corpus": Entry(
        _corpus,
        {
            "train_files": maybe(st.just(("t.py",))),
            "train_bytes": maybe(ints(1, 100)),
        },
        examples=15,
    ),
    "corpus.cache_dir": Entry(lambda: str(text.cache_dir()), {}, examples=2),
    "corpus.train_tokenizer": Entry(
        lambda corpus, vocab_size, cache: text.train_tokenizer(
            corpus, vocab_size, cache
        ).get_vocab_size(),
        {
            "corpus": maybe(st.just(TINY)),
            "vocab_size": maybe(st.sampled_from([384, 512])),
            "cache": st.just(False),  # not junked: True is a valid flag that writes the cache
        },
        examples=8,
    ),
    "corpus.token_stream": Entry(
        lambda corpus, tokenizer, split: text.token_stream(corpus, tokenizer, split).size,
        {
            "corpus": maybe(st.just(TINY)),
            "tokenizer": maybe(st.just(TOKENIZER)),
            "split": maybe(st.sampled_from(["train", "validation"])),
        },
        examples=10,
    ),
    "corpus.tokenizer_sha256": Entry(
        text.tokenizer_sha256, {"tokenizer": maybe(st.just(TOKENIZER))}, examples=5
    ),
    "corpus.PackedLoader": Entry(
        _loader,
        {
            "batch": maybe(ints(1, 8)),
            "seq": maybe(ints(1, 32)),
            "seed": maybe(ints(0, 5)),
            "shuffle": maybe(st.booleans()),
            "step": maybe(ints(0, 50)),
        },
        aliases={"batch": ["tokens"], "seq": ["tokens"]},
        examples=30,
    ),
}
