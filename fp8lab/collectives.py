"""What communication costs: bus bandwidth, the alpha-beta model, and the traffic of a layout.

Pure arithmetic (no torch), used to read measured collectives and to project them.

**Bus bandwidth.** A ring all-reduce of ``m`` bytes over ``n`` ranks sends ``2 (n-1)/n * m``
bytes out of every rank; all-gather (``m`` = the gathered size) and reduce-scatter (``m`` =
each rank's input) send ``(n-1)/n * m`` (Patarasuk and Yuan 2009). nccl-tests reports
``bus bandwidth = m / t * factor`` with these factors, so that one number, comparable to the
link's speed, describes every collective at every ``n`` (NCCL tests, ``doc/PERFORMANCE.md``).

**The alpha-beta model** (Hockney 1994): ``t(m) = alpha + factor(n) * m / beta`` -- a fixed
latency ``alpha`` per call and a bus bandwidth ``beta``. :func:`fit_alpha_beta` fits it to
measured times (least squares on relative error, so that small messages weigh as much as large
ones); ``alpha * beta / factor`` is the message size that reaches half the bandwidth.

**Traffic of a layout** (:func:`step_traffic`): the collectives of one training step of a
stack of transformer layers, for data parallelism (gradient all-reduce), fully sharded data
parallelism (weights all-gathered for the forward and again for the backward, gradients
reduce-scattered; ZeRO-3, Rajbhandari et al. 2020), tensor parallelism (two all-reduces of
the layer's activations in the forward and two in the backward; Shoeybi et al. 2019), with
sequence parallelism (each all-reduce becomes an all-gather plus a reduce-scatter of the same
total; TE also re-gathers the two column-parallel inputs for the weight gradients;
Korthikanti et al. 2022) and context parallelism (K and V passed around a ring, forward and
backward, plus the gradient all-reduce). Counts are per GPU and per step.

A collective has at least 2 ranks (on one, :func:`collective_time` is 0: nothing moves), and a
layout's ``n`` must divide what it cuts: the FFN width ``F``, the heads ``A`` and the key/value
groups under tensor parallelism, the sequence ``S`` under sequence and context parallelism.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fp8lab import checks
from fp8lab.config import TransformerConfig, require_config
from fp8lab.flops import layer_parameters

__all__ = [
    "AlphaBeta",
    "Collective",
    "bus_bandwidth",
    "bus_factor",
    "collective_time",
    "fit_alpha_beta",
    "step_traffic",
    "traffic_time",
]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
LAYOUTS = ("DP", "FSDP", "TP", "TP+SP", "CP")


def bus_factor(op: str, n: int) -> float:
    """Bytes each rank sends per byte of message: ``2(n-1)/n`` for all-reduce, ``(n-1)/n`` for
    all-gather and reduce-scatter, 1 for a point-to-point send."""
    checks.choice("op", op, OPS)
    checks.integer("n", n)
    if op == "send_recv":
        return 1.0
    return (2.0 if op == "all_reduce" else 1.0) * (n - 1) / n


def _two_or_more(n: int) -> int:
    """``n`` ranks of a collective: an integer >= 2 (one rank exchanges nothing)."""
    n = checks.integer("n", n)
    if n < 2:
        raise ValueError(f"n={n}: a collective needs at least 2 ranks (one GPU sends nothing)")
    return n


def bus_bandwidth(op: str, nbytes: float, seconds: float, n: int) -> float:
    """nccl-tests' bus bandwidth in GB/s (10^9 bytes per second) of one collective."""
    _two_or_more(n)
    nbytes = checks.number("nbytes", nbytes, positive=True)
    seconds = checks.number("seconds", seconds, positive=True)
    return nbytes / seconds * bus_factor(op, n) / 1e9


def collective_time(op: str, nbytes: float, n: int, bus_gbs: float, alpha_s: float = 0.0) -> float:
    """Seconds of one collective under the alpha-beta model: ``alpha + factor * m / beta``."""
    factor = bus_factor(op, n)
    nbytes = checks.number("nbytes", nbytes, non_negative=True)
    bus = checks.number("bus_gbs", bus_gbs, positive=True)
    alpha = checks.number("alpha_s", alpha_s, non_negative=True)
    if n == 1:  # nothing to exchange
        return 0.0
    return alpha + factor * nbytes / (bus * 1e9)


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted alpha-beta model of one collective on ``n`` ranks."""

    op: str
    n: int
    alpha_s: float
    bus_gbs: float

    def __post_init__(self):
        checks.choice("op", self.op, OPS)
        _two_or_more(self.n)
        checks.number("alpha_s", self.alpha_s, non_negative=True)
        checks.number("bus_gbs", self.bus_gbs, positive=True)

    def time_s(self, nbytes: float) -> float:
        """Predicted seconds for a message of ``nbytes``."""
        return collective_time(self.op, nbytes, self.n, self.bus_gbs, self.alpha_s)

    def bandwidth_gbs(self, nbytes: float) -> float:
        """Predicted bus bandwidth (GB/s) at ``nbytes``: it approaches ``bus_gbs`` for large
        messages and falls for small ones, where ``alpha`` dominates."""
        nbytes = checks.number("nbytes", nbytes, positive=True)
        return bus_bandwidth(self.op, nbytes, self.time_s(nbytes), self.n)

    @property
    def half_bandwidth_bytes(self) -> float:
        """The message size at which the bus bandwidth is half of ``bus_gbs``."""
        return self.alpha_s * self.bus_gbs * 1e9 / bus_factor(self.op, self.n)


def fit_alpha_beta(nbytes: Sequence[float], seconds: Sequence[float], op: str, n: int) -> AlphaBeta:
    """Fit ``t = alpha + factor(n) * m / beta`` to measured times (weighted least squares on
    relative error; ``alpha`` is clipped at 0)."""
    checks.choice("op", op, OPS)
    _two_or_more(n)
    if isinstance(nbytes, (str, bytes)) or not isinstance(nbytes, Sequence):
        raise TypeError("nbytes must be a sequence of message sizes")
    if isinstance(seconds, (str, bytes)) or not isinstance(seconds, Sequence):
        raise TypeError("seconds must be a sequence of times")
    if len(nbytes) != len(seconds):
        raise ValueError(f"nbytes and seconds: {len(nbytes)} sizes but {len(seconds)} times")
    if len(nbytes) < 2:
        raise ValueError("nbytes: need at least two message sizes to fit two parameters")
    xs = [checks.number("nbytes[i]", m, positive=True) * bus_factor(op, n) for m in nbytes]
    ts = [checks.number("seconds[i]", t, positive=True) for t in seconds]
    if len(set(xs)) < 2:
        raise ValueError("nbytes: need at least two different message sizes")
    weights = [1.0 / t**2 for t in ts]
    sw = sum(weights)
    sx = sum(w * x for w, x in zip(weights, xs, strict=True))
    st = sum(w * t for w, t in zip(weights, ts, strict=True))
    sxx = sum(w * x * x for w, x in zip(weights, xs, strict=True))
    sxt = sum(w * x * t for w, x, t in zip(weights, xs, ts, strict=True))
    denominator = sw * sxx - sx * sx
    slope = (sw * sxt - sx * st) / denominator
    alpha = (st - slope * sx) / sw
    if alpha < 0:  # refit through the origin
        alpha = 0.0
        slope = sxt / sxx
    if not slope > 0 or not math.isfinite(slope):
        raise ValueError("seconds: times do not grow with message size; no bandwidth to fit")
    return AlphaBeta(op, n, alpha, 1.0 / slope / 1e9)


@dataclass(frozen=True)
class Collective:
    """``count`` calls of ``op`` on messages of ``nbytes`` over ``n`` ranks, in one step."""

    name: str
    op: str
    nbytes: float
    n: int
    count: int = 1

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise TypeError(f"name={self.name!r}: must be a string")
        checks.choice("op", self.op, OPS)
        checks.number("nbytes", self.nbytes, non_negative=True)
        _two_or_more(self.n)
        checks.integer("count", self.count)

    @property
    def bytes_sent(self) -> float:
        """Bytes each rank sends for all ``count`` calls."""
        return self.count * self.nbytes * bus_factor(self.op, self.n)


def _data_parallel_traffic(params: float, layout: str, n: int, weight_bytes, grad_bytes):
    if layout == "DP":
        return [Collective("gradients", "all_reduce", params * grad_bytes, n)]
    return [
        Collective("weights (forward)", "all_gather", params * weight_bytes, n),
        Collective("weights (backward)", "all_gather", params * weight_bytes, n),
        Collective("gradients", "reduce_scatter", params * grad_bytes, n),
    ]


def _tensor_parallel_traffic(activations: float, layout: str, n: int, layers: int):
    count = 2 * layers  # two tensor-parallel blocks per layer: attention and MLP
    if layout == "TP":
        return [
            Collective("activations (forward)", "all_reduce", activations, n, count),
            Collective("activation gradients (backward)", "all_reduce", activations, n, count),
        ]
    gather, scatter = "all_gather", "reduce_scatter"
    return [
        Collective("inputs of QKV and FC1 (forward)", gather, activations, n, count),
        Collective("outputs of proj and FC2 (forward)", scatter, activations, n, count),
        Collective("output gradients of proj and FC2", gather, activations, n, count),
        Collective("inputs of QKV and FC1 again (weight gradients)", gather, activations, n, count),
        Collective("input gradients of QKV and FC1", scatter, activations, n, count),
    ]


def _context_parallel_traffic(cfg, params, batch, seq, n, grad_bytes, activation_bytes):
    kv = 2 * (seq // n) * batch * cfg.kv_size * activation_bytes  # K and V of one chunk
    hops = cfg.num_layers * (n - 1)
    return [
        Collective("K, V around the ring (forward)", "send_recv", kv, n, hops),
        Collective("K, V and their gradients (backward)", "send_recv", 2 * kv, n, hops),
        Collective("gradients", "all_reduce", params * grad_bytes, n),
    ]


def _check_split(cfg: TransformerConfig, layout: str, seq: int, n: int) -> None:
    """What a layout cuts into ``n`` parts must divide by ``n``: the heads, key/value groups and
    FFN columns of tensor parallelism, the sequence of sequence and context parallelism."""
    if layout in ("TP", "TP+SP") and cfg.ffn_hidden_size % n:
        raise ValueError(
            f"n={n}: tensor parallelism needs n to divide cfg.ffn_hidden_size="
            f"{cfg.ffn_hidden_size} (F)"
        )
    if layout in ("TP", "TP+SP") and (cfg.num_attention_heads % n or cfg.groups % n):
        raise ValueError(
            f"n={n}: tensor parallelism needs n to divide cfg.num_attention_heads="
            f"{cfg.num_attention_heads} (A) and the key/value groups ({cfg.groups})"
        )
    if layout in ("TP+SP", "CP") and seq % n:
        name = "sequence" if layout == "TP+SP" else "context"
        raise ValueError(f"seq={seq}: {name} parallelism needs n={n} to divide it")


def step_traffic(
    cfg: TransformerConfig,
    layout: str,
    batch: int,
    seq: int,
    n: int,
    *,
    weight_bytes: float = 2,
    grad_bytes: float = 2,
    activation_bytes: float = 2,
) -> list[Collective]:
    """The collectives of one training step of ``cfg``'s layers on ``n`` GPUs in ``layout``.

    ``batch`` and ``seq`` are the micro-batch and sequence each data-parallel replica (DP,
    FSDP) or each tensor/context-parallel group (TP, TP+SP, CP) processes. ``weight_bytes`` is
    what FSDP gathers per parameter (1 for FP8 weights); ``activation_bytes`` what TP moves per
    activation element. Norms and biases are counted with the weights they belong to.
    """
    require_config(cfg)
    checks.choice("layout", layout, LAYOUTS)
    checks.integer("batch", batch)
    checks.integer("seq", seq)
    _two_or_more(n)
    _check_split(cfg, layout, seq, n)
    weight_bytes = checks.number("weight_bytes", weight_bytes, positive=True)
    grad_bytes = checks.number("grad_bytes", grad_bytes, positive=True)
    activation_bytes = checks.number("activation_bytes", activation_bytes, positive=True)
    params = cfg.num_layers * sum(layer_parameters(cfg).values())
    if layout in ("DP", "FSDP"):
        return _data_parallel_traffic(params, layout, n, weight_bytes, grad_bytes)
    if layout in ("TP", "TP+SP"):
        activations = seq * batch * cfg.hidden_size * activation_bytes
        return _tensor_parallel_traffic(activations, layout, n, cfg.num_layers)
    return _context_parallel_traffic(cfg, params, batch, seq, n, grad_bytes, activation_bytes)


def traffic_time(traffic: Sequence[Collective], bus_gbs: float, alpha_s: float = 0.0) -> float:
    """Seconds the collectives of :func:`step_traffic` take on links of ``bus_gbs`` (bus
    bandwidth) and latency ``alpha_s``, one after the other, with nothing overlapped."""
    if isinstance(traffic, Collective) or not isinstance(traffic, Sequence):
        raise TypeError("traffic must be a sequence of Collective")
    if not all(isinstance(c, Collective) for c in traffic):
        raise TypeError("traffic must be a sequence of Collective")
    bus = checks.number("bus_gbs", bus_gbs, positive=True)
    alpha = checks.number("alpha_s", alpha_s, non_negative=True)
    return sum(c.count * collective_time(c.op, c.nbytes, c.n, bus, alpha) for c in traffic)
