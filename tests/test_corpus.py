"""The corpus, the tokenizer and the loader: deterministic, split by file, cached, packed right."""

import hashlib
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from fp8lab import corpus as text

FILES = {
    "a.py": "def a():\n    return 1\n",
    "b.py": "import os\n\nprint(os.sep)\n",
    "pkg/__init__.py": "",
    "pkg/c.py": "class C:\n    x = 'naïve'\n",
    "pkg/tests/test_c.py": "assert True\n",
    "site-packages/third.py": "x = 1\n",
    "pydoc_data/topics.py": "topics = {}\n",
    "_sysconfigdata__linux.py": "build = {}\n",
    "notes.txt": "not python\n",
}


@pytest.fixture
def tree(tmp_path):
    for name, content in FILES.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    return tmp_path


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FP8LAB_CACHE", str(tmp_path / "cache"))


def test_only_library_sources_are_read_in_path_order(tree):
    corpus = text.stdlib_corpus(validation_share=0.5, root=tree)
    files = sorted(corpus.train_files + corpus.validation_files)
    assert files == ["a.py", "b.py", "pkg/__init__.py", "pkg/c.py"]
    assert list(corpus.train_files) == sorted(corpus.train_files)
    assert corpus.train_bytes + corpus.validation_bytes == sum(
        len(FILES[name].encode()) for name in files
    )
    assert "naïve" in "".join(corpus.train_texts + corpus.validation_texts)


def test_the_split_depends_on_the_path_alone(tree):
    """A file's split is a hash of its path: adding a file moves no other file."""
    before = text.stdlib_corpus(validation_share=0.5, root=tree)
    (tree / "zzz.py").write_text("z = 0\n")
    after = text.stdlib_corpus(validation_share=0.5, root=tree)
    for name in before.validation_files:
        assert name in after.validation_files
    for name in before.train_files:
        assert name in after.train_files
    share = int(hashlib.sha256(b"a.py").hexdigest()[:8], 16) / 16**8
    assert ("a.py" in before.validation_files) == (share < 0.5)


def test_the_hash_follows_every_byte_and_the_split(tree):
    first = text.stdlib_corpus(validation_share=0.5, root=tree).sha256
    assert text.stdlib_corpus(validation_share=0.5, root=tree).sha256 == first
    (tree / "b.py").write_text("import os\n\nprint(os.sep) \n")
    assert text.stdlib_corpus(validation_share=0.5, root=tree).sha256 != first


def test_the_running_interpreters_library():
    corpus = text.stdlib_corpus()
    files = corpus.train_files + corpus.validation_files
    assert corpus.root == sysconfig.get_paths()["stdlib"]
    assert "os.py" in files and "json/decoder.py" in files
    assert not any("site-packages" in name or "/test/" in f"/{name}" for name in files)
    assert 0.02 < len(corpus.validation_files) / len(files) < 0.10  # 5% by a hash of the path
    assert corpus.train_bytes > 5_000_000  # several megabytes on every CPython since 3.8
    assert corpus.describe()["python"].count(".") == 2


def test_a_slice_keeps_within_its_budget_and_both_splits():
    corpus = text.stdlib_corpus(max_bytes=200_000)
    assert corpus.train_bytes <= 200_000 * 0.95 and corpus.validation_bytes <= 200_000 * 0.05
    assert corpus.train_files and corpus.validation_files
    with pytest.raises(ValueError, match="max_bytes"):
        text.stdlib_corpus(max_bytes=10)


def test_bad_arguments_are_named(tree):
    with pytest.raises(ValueError, match="validation_share"):
        text.stdlib_corpus(validation_share=0.9, root=tree)
    with pytest.raises(ValueError, match="root"):
        text.stdlib_corpus(root=tree / "missing")
    with pytest.raises(ValueError, match="vocab_size"):
        text.train_tokenizer(text.stdlib_corpus(root=tree, validation_share=0.5), 1000)
    with pytest.raises(TypeError, match="corpus"):
        text.train_tokenizer("corpus", 512)


@pytest.fixture(scope="module")
def small_corpus():
    return text.stdlib_corpus(max_bytes=150_000)


def test_the_tokenizer_round_trips_and_has_the_vocabulary_asked_for(small_corpus):
    tokenizer = text.train_tokenizer(small_corpus, 512, cache=False)
    assert tokenizer.get_vocab_size() == 512
    sample = small_corpus.validation_texts[0][:2000]
    assert tokenizer.decode(tokenizer.encode(sample).ids) == sample
    assert len(tokenizer.encode(sample).ids) < 0.7 * len(sample.encode())  # merges compress


def test_the_tokenizer_is_deterministic_and_cached(small_corpus, tmp_path):
    one = text.train_tokenizer(small_corpus, 384, cache=False)
    two = text.train_tokenizer(small_corpus, 384, cache=False)
    assert text.tokenizer_sha256(one) == text.tokenizer_sha256(two)
    text.train_tokenizer(small_corpus, 384)
    files = list(text.cache_dir().glob(f"*v384-{small_corpus.sha256[:24]}.json"))
    assert len(files) == 1 and text.cache_dir() == tmp_path / "cache"
    other = text.train_tokenizer(small_corpus, 512, cache=False)
    other.save(str(files[0]))  # what the cache holds is what comes back
    assert text.tokenizer_sha256(text.train_tokenizer(small_corpus, 384)) == text.tokenizer_sha256(
        other
    )


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage"])
def test_a_damaged_tokenizer_cache_is_trained_again_with_a_warning(small_corpus, damage):
    expected = text.tokenizer_sha256(text.train_tokenizer(small_corpus, 384))
    (path,) = text.cache_dir().glob(f"*v384-{small_corpus.sha256[:24]}.json")
    whole = path.read_text()
    path.write_text({"truncated": whole[: len(whole) // 2], "empty": "", "garbage": "\x00{"}[damage])
    with pytest.warns(RuntimeWarning, match="tokenizer cache .* unreadable"):
        again = text.train_tokenizer(small_corpus, 384)
    assert text.tokenizer_sha256(again) == expected
    assert path.read_text() == whole  # the cache holds a good copy again


def test_the_token_stream_marks_the_end_of_every_file(small_corpus):
    tokenizer = text.train_tokenizer(small_corpus, 512, cache=False)
    stream = text.token_stream(small_corpus, tokenizer, "validation")
    end = tokenizer.token_to_id(text.END_OF_TEXT)
    assert stream.dtype == np.uint16 and stream[-1] == end
    assert int((stream == end).sum()) == len(small_corpus.validation_files)
    with pytest.raises(ValueError, match="split"):
        text.token_stream(small_corpus, tokenizer, "test")


def test_the_loader_packs_shifted_windows():
    tokens = np.arange(1000, dtype=np.uint16)
    loader = text.PackedLoader(tokens, batch=4, seq=10, seed=3)
    assert loader.sequences.shape == (99, 11) and len(loader) == 24
    inputs, targets = loader.batch_at(0)
    assert inputs.shape == targets.shape == (4, 10) and inputs.dtype == torch.long
    assert torch.equal(targets, inputs + 1)  # the next token
    assert torch.equal(inputs[:, 0] % 10, torch.zeros(4, dtype=torch.long))  # windows at stride S


def test_the_loader_order_is_a_function_of_seed_and_step():
    tokens = np.arange(5000, dtype=np.uint16)
    a, b = (text.PackedLoader(tokens, 8, 16, seed=1) for _ in range(2))
    c = text.PackedLoader(tokens, 8, 16, seed=2)
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a.batches(50), b.batches(50), strict=True))
    assert not torch.equal(a.batch_at(0)[0], c.batch_at(0)[0])
    epoch = torch.cat([a.batch_at(step)[0][:, 0] for step in range(len(a))])
    assert epoch.unique().numel() == epoch.numel()  # no sequence twice in an epoch
    assert not torch.equal(a.batch_at(0)[0], a.batch_at(len(a))[0])  # a new order next epoch
    assert torch.equal(a.batch_at(7)[0], next(iter(a.batches(1, start=7)))[0])


def test_the_loader_without_shuffle_walks_the_stream():
    loader = text.PackedLoader(torch.arange(100), 2, 10, shuffle=False)
    assert loader.batch_at(0)[0][:, 0].tolist() == [0, 10]
    assert loader.batch_at(1)[0][:, 0].tolist() == [20, 30]


def test_the_loader_refuses_too_little_text():
    with pytest.raises(ValueError, match="batch"):
        text.PackedLoader(np.arange(50, dtype=np.uint16), 8, 10)
    with pytest.raises(TypeError, match="tokens"):
        text.PackedLoader(np.linspace(0, 1, 100), 2, 10)


def test_cache_dir_defaults_outside_the_repository(monkeypatch, tmp_path):
    monkeypatch.delenv("FP8LAB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert text.cache_dir() == tmp_path / "xdg" / "fp8lab"
    root = Path(__file__).resolve().parent.parent
    assert root not in text.cache_dir().parents
