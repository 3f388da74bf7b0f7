"""Synthetic token data that a small model can learn, for experiments that need no download.

:func:`markov_batches` samples sequences from a fixed random first-order Markov chain whose
rows are sparse (``branching`` likely successors per token), so the achievable loss is the
chain's entropy rate, far below ``log V``: a training curve has somewhere to go, and two
runs (BF16 and FP8, say) can be compared on the same stream of batches.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from fp8lab import checks
from fp8lab.devices import resolve_device

__all__ = ["MarkovChain", "markov_batches", "uniform_loss"]


class MarkovChain:
    """A random first-order Markov chain over ``vocab_size`` tokens."""

    def __init__(self, vocab_size: int, branching: int = 4, seed: int = 0):
        checks.integer("vocab_size", vocab_size)
        checks.integer("branching", branching)
        checks.integer("seed", seed, minimum=0)
        if branching > vocab_size:
            raise ValueError(f"branching={branching} must not exceed vocab_size={vocab_size}")
        generator = torch.Generator().manual_seed(seed)
        logits = torch.full((vocab_size, vocab_size), float("-inf"))
        successors = torch.rand(vocab_size, vocab_size, generator=generator).argsort(dim=1)[
            :, :branching
        ]
        weights = torch.randn(vocab_size, branching, generator=generator)
        logits.scatter_(1, successors, weights)
        self.transition = logits.softmax(dim=1)
        self.vocab_size = vocab_size
        self._successors = successors
        self._cdf = self.transition.gather(1, successors).cumsum(dim=1)

    @property
    def entropy_rate(self) -> float:
        """Nats per token under the chain's stationary distribution: the best achievable loss."""
        p = self.transition
        stationary = torch.full((self.vocab_size,), 1.0 / self.vocab_size)
        for _ in range(200):
            stationary = stationary @ p
        row_entropy = -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(1)
        return float((stationary * row_entropy).sum())

    def sample(self, batch: int, seq: int, generator: torch.Generator) -> torch.Tensor:
        """Sequences ``[B, S]``: inverse-CDF sampling over each token's few successors."""
        checks.integer("batch", batch)
        checks.integer("seq", seq)
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, not {type(generator).__name__}")
        tokens = torch.empty(batch, seq, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, self.vocab_size, (batch,), generator=generator)
        uniforms = torch.rand(seq, batch, 1, generator=generator)
        for t in range(1, seq):
            cdf = self._cdf[tokens[:, t - 1]]
            choice = torch.searchsorted(cdf, uniforms[t]).clamp(max=cdf.shape[1] - 1)
            tokens[:, t] = self._successors[tokens[:, t - 1]].gather(1, choice).squeeze(1)
        return tokens


def markov_batches(
    vocab_size: int, batch: int, seq: int, *, branching: int = 4, seed: int = 0, device=None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless ``(inputs, targets)`` pairs of shape ``[B, S]``; the same seed gives the same
    stream.

    Arguments are checked at the call, not at the first batch."""
    checks.integer("batch", batch)
    checks.integer("seq", seq)
    checks.integer("seed", seed, minimum=0)
    device = resolve_device(device)
    chain = MarkovChain(vocab_size, branching, seed)
    return _batches(chain, batch, seq, torch.Generator().manual_seed(seed + 1), device)


def _batches(chain: MarkovChain, batch: int, seq: int, generator: torch.Generator, device):
    while True:
        tokens = chain.sample(batch, seq + 1, generator)
        yield tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def uniform_loss(vocab_size: int) -> float:
    """The loss of a model that knows nothing: ``log V`` nats."""
    checks.integer("vocab_size", vocab_size)
    return math.log(vocab_size)
