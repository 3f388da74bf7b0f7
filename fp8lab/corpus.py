"""Real text without a download: the Python standard library's source, a BPE tokenizer, packed
batches.

Every machine that runs the book has a Python interpreter, and with it a few megabytes of
well-written text: the standard library's ``.py`` files. :func:`stdlib_corpus` collects them
from the running interpreter (sorted by path; the test suite, ``site-packages`` and
``dist-packages`` left out, since distributions ship them differently) and splits them *by
file* into training and validation text: a file goes to validation when a hash of its path
says so, so the split of a file does not depend on which other files exist. The corpus
records its size and a SHA-256 of every file's path, split and bytes, because it differs
between Python versions (3.11 ships ``distutils``, 3.12 does not): a result is only comparable
with another made on the same hash.

:func:`train_tokenizer` trains a byte-level BPE tokenizer (the ``tokenizers`` library, GPT-2's
byte alphabet and pre-tokenizer) on the training files only, with a vocabulary that is a
multiple of 128 (tile- and FP8-friendly for the LM head, see :func:`fp8lab.config.pad_vocab`),
and caches it on disk under :func:`cache_dir`, keyed by the corpus hash and the vocabulary
size: training takes seconds, loading milliseconds. :func:`token_stream` turns one split into a
token stream, each file followed by an end-of-text token.

:class:`PackedLoader` packs a token stream into fixed-length sequences (consecutive windows of
``S + 1`` tokens at a stride of S, so no token is wasted and none is padding) and yields
``(inputs, targets)`` batches ``[B, S]``, targets shifted by one token. The order of the
sequences is a permutation drawn from ``seed`` and the epoch, so two runs with the same seed
see the same batches in the same order, whatever else they differ in.

Known limits: source code is not prose (indentation and identifiers dominate; a model of it
learns faster than one of English text of the same size), and a few megabytes are small for a
1B-parameter model -- a few hundred steps of a GPT-2-small-sized model already see it more
than once (the chapter says how often).
"""

from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fp8lab import checks

__all__ = [
    "Corpus",
    "PackedLoader",
    "cache_dir",
    "stdlib_corpus",
    "token_stream",
    "tokenizer_sha256",
    "train_tokenizer",
]

END_OF_TEXT = "<|endoftext|>"
# Third-party packages, the test suite (distributions ship it apart), a generated documentation
# dump (pydoc_data: one 750 kB string literal) and the build's machine-specific configuration.
EXCLUDED_DIRECTORIES = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "pydoc_data"}
)
EXCLUDED_PREFIXES = ("_sysconfigdata", "config-")
# Changes to how the tokenizer is trained change this tag, and with it every cache key.
TOKENIZER_RECIPE = "bytelevel-bpe-1"
VOCAB_MULTIPLE = 128


SPLITS = ("file", "package")


def _split_key(relative_path: str, split_by: str) -> str:
    """What decides a file's split: its path, or its top-level package (``encodings/cp437.py``
    -> ``encodings``; a module at the top, ``json.py``, is its own package)."""
    if split_by == "file":
        return relative_path
    head, _, rest = relative_path.partition("/")
    return head if rest else head.removesuffix(".py")


def _is_validation(relative_path: str, share: float) -> bool:
    """A file's split, from a hash of its path (or package) alone: stable when other files come
    or go."""
    digest = hashlib.sha256(relative_path.encode()).hexdigest()
    return int(digest[:8], 16) / 16**8 < share


@dataclass(frozen=True)
class Corpus:
    """Training and validation text, with the facts a result must record: files, bytes, hash."""

    root: str
    python: str
    train_files: tuple[str, ...]
    validation_files: tuple[str, ...]
    train_texts: tuple[str, ...] = field(repr=False, compare=False)
    validation_texts: tuple[str, ...] = field(repr=False, compare=False)
    train_bytes: int
    validation_bytes: int
    sha256: str

    def __post_init__(self):
        for name in ("root", "python", "sha256"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name}={getattr(self, name)!r}: must be a string")
        for name in ("train_files", "validation_files", "train_texts", "validation_texts"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
                raise TypeError(f"{name}: must be a tuple of strings")
        for files, texts in (
            ("train_files", "train_texts"),
            ("validation_files", "validation_texts"),
        ):
            if not getattr(self, files):
                raise ValueError(f"{files}: a corpus needs at least one file in each split")
            if len(getattr(self, files)) != len(getattr(self, texts)):
                raise ValueError(f"{files} and {texts}: must have one text per file")
        checks.integer("train_bytes", self.train_bytes)
        checks.integer("validation_bytes", self.validation_bytes)

    def texts(self, split: str) -> tuple[str, ...]:
        """The file texts of ``"train"`` or ``"validation"``, in path order."""
        checks.choice("split", split, ("train", "validation"))
        return self.train_texts if split == "train" else self.validation_texts

    def describe(self) -> dict:
        """What a result file records about its corpus (JSON-ready). The folder it was read
        from is left out: it names a machine, and the hash already identifies the text."""
        return {
            "source": "Python standard library",
            "python": self.python,
            "train_files": len(self.train_files),
            "validation_files": len(self.validation_files),
            "train_bytes": self.train_bytes,
            "validation_bytes": self.validation_bytes,
            "sha256": self.sha256,
        }


def _source_files(root: Path) -> list[tuple[str, Path]]:
    """``(posix relative path, path)`` of every ``.py`` file under ``root``, sorted, without the
    excluded directories and without following links."""
    found = []
    for directory, subdirectories, files in os.walk(root, followlinks=False):
        subdirectories[:] = sorted(
            d
            for d in subdirectories
            if d not in EXCLUDED_DIRECTORIES and not d.startswith(EXCLUDED_PREFIXES)
        )
        for name in files:
            path = Path(directory) / name
            if name.startswith(EXCLUDED_PREFIXES) or not name.endswith(".py"):
                continue
            if path.is_file() and not path.is_symlink():
                found.append((path.relative_to(root).as_posix(), path))
    return sorted(found)


def _digest(chosen: dict[bool, list[tuple[str, bytes]]]) -> str:
    """SHA-256 over every file's split, path and bytes."""
    digest = hashlib.sha256()
    for validation in (False, True):
        for relative, data in chosen[validation]:
            digest.update((b"V" if validation else b"T") + relative.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()


def stdlib_corpus(
    validation_share: float = 0.05,
    max_bytes: int | None = None,
    root: str | Path | None = None,
    split_by: str = "file",
) -> Corpus:
    """The standard library of the running interpreter as a corpus (or of ``root``, any folder).

    ``validation_share`` of the files (by a hash of their path) are held out; with
    ``split_by="package"``, of the top-level packages (a hash of the package's name), so that
    near-duplicate files of one package (the codec tables of ``encodings/``) never sit on both
    sides. ``max_bytes`` keeps a slice for quick runs: files in path order, skipping any that
    would overflow the split's share of the budget, at least one file per split.
    """
    share = checks.number("validation_share", validation_share, positive=True, maximum=0.5)
    checks.choice("split_by", split_by, SPLITS)
    if max_bytes is not None:
        max_bytes = checks.integer("max_bytes", max_bytes)
    if root is None:
        root = sysconfig.get_paths()["stdlib"]
    if not isinstance(root, (str, Path)):
        raise TypeError(f"root={root!r}: must be a folder path")
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"root={str(root)!r}: not a folder")
    budgets = (
        None if max_bytes is None else {False: max_bytes * (1 - share), True: max_bytes * share}
    )
    chosen: dict[bool, list[tuple[str, bytes]]] = {False: [], True: []}
    used = {False: 0, True: 0}
    for relative, path in _source_files(root):
        validation = _is_validation(_split_key(relative, split_by), share)
        size = path.stat().st_size
        if budgets is not None and used[validation] + size > budgets[validation]:
            continue
        chosen[validation].append((relative, path.read_bytes()))
        used[validation] += size
    for validation, name in ((False, "training"), (True, "validation")):
        if not chosen[validation]:
            raise ValueError(
                f"max_bytes={max_bytes}: leaves no {name} file under {root}"
                if max_bytes is not None
                else f"root={str(root)!r}: has no .py file for the {name} split"
            )
    digest = _digest(chosen)

    def texts(validation):
        return tuple(data.decode("utf-8", errors="replace") for _, data in chosen[validation])

    return Corpus(
        root=str(root),
        python=platform.python_version(),
        train_files=tuple(relative for relative, _ in chosen[False]),
        validation_files=tuple(relative for relative, _ in chosen[True]),
        train_texts=texts(False),
        validation_texts=texts(True),
        train_bytes=sum(len(data) for _, data in chosen[False]),
        validation_bytes=sum(len(data) for _, data in chosen[True]),
        sha256=digest,
    )


def cache_dir() -> Path:
    """Where fp8lab keeps what it derives (tokenizers): ``$FP8LAB_CACHE``, else
    ``$XDG_CACHE_HOME/fp8lab``, else ``~/.cache/fp8lab`` -- outside the repository. Falls back
    to a folder under the system's temporary directory where that one cannot be created."""
    chosen = os.environ.get("FP8LAB_CACHE")
    if chosen:
        path = Path(chosen)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        path = Path(base) / "fp8lab"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        path = Path(tempfile.gettempdir()) / "fp8lab-cache"
        path.mkdir(parents=True, exist_ok=True)
    return path


def _require_corpus(value) -> Corpus:
    if not isinstance(value, Corpus):
        raise TypeError(
            f"corpus must be a Corpus (from fp8lab.corpus.stdlib_corpus()), not "
            f"{type(value).__name__}"
        )
    return value


def _require_tokenizer(value):
    if not all(hasattr(value, name) for name in ("encode_batch", "token_to_id", "to_str")):
        raise TypeError(
            f"tokenizer must be a tokenizers.Tokenizer (from train_tokenizer()), not "
            f"{type(value).__name__}"
        )
    return value


def _tokenizers():
    try:
        import tokenizers
    except ImportError:  # pragma: no cover - a requirement of the book
        raise ImportError(
            "fp8lab.corpus needs the 'tokenizers' package: pip install tokenizers"
        ) from None
    return tokenizers


def train_tokenizer(corpus: Corpus, vocab_size: int = 8192, cache: bool = True):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``corpus``'s training files.

    ``vocab_size`` must be a multiple of 128 (256 byte tokens, the end-of-text token and the
    merges); a corpus too small for that many merges yields fewer, and a model over it pads its
    vocabulary back up (:func:`fp8lab.config.pad_vocab`). With ``cache``, the tokenizer is read
    from (or written to) :func:`cache_dir`, keyed by the corpus hash and ``vocab_size``; a cached
    file that cannot be read (cut short, damaged) is trained again and replaced, with a
    ``RuntimeWarning``.
    """
    _require_corpus(corpus)
    vocab_size = checks.integer("vocab_size", vocab_size, minimum=384)
    if vocab_size % VOCAB_MULTIPLE:
        raise ValueError(f"vocab_size={vocab_size}: must be a multiple of {VOCAB_MULTIPLE}")
    checks.flag("cache", cache)
    tk = _tokenizers()
    path = cache_dir() / f"bpe-{TOKENIZER_RECIPE}-v{vocab_size}-{corpus.sha256[:24]}.json"
    if cache and path.exists():
        try:
            return tk.Tokenizer.from_file(str(path))
        except Exception as error:  # tokenizers raises a bare Exception for a damaged file
            reason = f"{type(error).__name__}: {error}".splitlines()[0][:200]
            warnings.warn(
                f"tokenizer cache {path} is unreadable ({reason}): training it again",
                RuntimeWarning,
                stacklevel=2,
            )
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(
        corpus.train_texts, trainer=trainer, length=len(corpus.train_texts)
    )
    if cache:
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        tokenizer.save(str(partial))
        os.replace(partial, path)  # atomic: a reader never sees half a file
    return tokenizer


def tokenizer_sha256(tokenizer) -> str:
    """SHA-256 of a tokenizer's serialised form: two runs used the same tokens iff it matches."""
    _require_tokenizer(tokenizer)
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()


def token_stream(corpus: Corpus, tokenizer, split: str) -> np.ndarray:
    """The token stream of one split: each file's ids, then the end-of-text id, in path order
    (``uint16`` where the vocabulary fits, else ``int32``)."""
    _require_corpus(corpus)
    _require_tokenizer(tokenizer)
    texts = corpus.texts(split)
    end = tokenizer.token_to_id(END_OF_TEXT)
    if end is None:
        raise ValueError(f"tokenizer: has no {END_OF_TEXT} token; train it with train_tokenizer()")
    dtype = np.uint16 if tokenizer.get_vocab_size() <= 2**16 else np.int32
    pieces = []
    for encoding in tokenizer.encode_batch(list(texts)):
        pieces.append(np.asarray(encoding.ids, dtype=dtype))
        pieces.append(np.asarray([end], dtype=dtype))
    return np.concatenate(pieces)


class PackedLoader:
    """Fixed-length training batches from a token stream: ``(inputs [B, S], targets [B, S])``.

    Sequence i holds tokens ``[i S, i S + S]`` (``S + 1`` tokens: inputs are the first S,
    targets the last S). Each epoch visits the sequences in a permutation drawn from ``seed``
    and the epoch number (in order with ``shuffle=False``), B at a time; the last
    ``N mod B`` sequences of an epoch's order are left out of it, so a batch never spans two
    epochs. The sequences live on ``device`` (a few megabytes), so loading a batch is one
    gather there.
    """

    def __init__(
        self,
        tokens,
        batch: int,
        seq: int,
        seed: int = 0,
        device: torch.device | str | None = None,
        shuffle: bool = True,
    ):
        self.batch = checks.integer("batch", batch)
        self.seq = checks.integer("seq", seq)
        self.seed = checks.integer("seed", seed, minimum=0)
        self.shuffle = checks.flag("shuffle", shuffle)
        if isinstance(tokens, np.ndarray):
            if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
                raise TypeError(f"tokens: must be a 1-D array of token ids, not {tokens.dtype}")
            tokens = torch.from_numpy(tokens.astype(np.int64))
        checks.tensor("tokens", tokens, dims=1, floating=False)
        count = (tokens.numel() - 1) // seq
        if count < batch:
            raise ValueError(
                f"tokens: {tokens.numel()} tokens make {count} sequences of seq={seq}; "
                f"batch={batch} needs at least {batch}"
            )
        from fp8lab.devices import resolve_device

        self.device = resolve_device(device) or torch.device("cpu")
        windows = tokens.long()[: count * seq + 1].unfold(0, seq + 1, seq)  # [N, S + 1]
        self.sequences = windows.contiguous().to(self.device)
        self._orders: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        """Batches per epoch."""
        return self.sequences.shape[0] // self.batch

    @property
    def tokens_per_epoch(self) -> int:
        return len(self) * self.batch * self.seq

    def order(self, epoch: int) -> torch.Tensor:
        """The sequence indices of ``epoch``, in the order the batches take them."""
        epoch = checks.integer("epoch", epoch, minimum=0)
        if epoch not in self._orders:
            count = self.sequences.shape[0]
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                order = torch.randperm(count, generator=generator)
            else:
                order = torch.arange(count)
            self._orders = {epoch: order.to(self.device)}  # keep one epoch's order
        return self._orders[epoch]

    def batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of training step ``step`` (0-based): the same for every run with this seed."""
        step = checks.integer("step", step, minimum=0)
        epoch, index = divmod(step, len(self))
        rows = self.order(epoch)[index * self.batch : (index + 1) * self.batch]
        window = self.sequences[rows]  # [B, S + 1]
        return window[:, :-1].contiguous(), window[:, 1:].contiguous()

    def batches(self, steps: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of steps ``start`` .. ``start + steps - 1``, one at a time."""
        steps = checks.integer("steps", steps, minimum=0)
        start = checks.integer("start", start, minimum=0)
        return (self.batch_at(step) for step in range(start, start + steps))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        step = 0
        while True:
            yield self.batch_at(step)
            step += 1
