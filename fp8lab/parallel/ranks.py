"""The protocol's rounds in a job of several processes, and their times read back as one.

Every rank of a job runs :func:`fp8lab.protocol.rounds` on the same alternatives, in the same
shuffled order (one seed for all), with a barrier before each alternative's calls, so that a
collective inside a step always finds its partners. :func:`rounds_on_ranks` returns every
rank's times as plain data (JSON); :func:`combine` turns them back into one
:class:`fp8lab.protocol.Rounds`, taking per round either the median over the ranks (what a
typical GPU saw), the slowest rank (what a synchronous step waits for) or one rank's time.

:func:`gather` and :func:`write` are the two other things a worker needs: every rank's value
on every rank, and rank 0's result written as JSON in one step.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path

from fp8lab import checks

__all__ = ["HOW", "combine", "gather", "rounds_on_ranks", "write"]

HOW = ("median", "slowest")


def gather(value):
    """Every rank's ``value`` (any picklable object), on every rank, in rank order."""
    import torch.distributed as dist

    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def write(path: str, data: Mapping) -> None:
    """Rank 0 writes ``data`` as JSON at ``path`` (through a temporary file, so that a reader
    never sees half of it); the other ranks write nothing."""
    import torch.distributed as dist

    if not isinstance(path, str) or not path:
        raise TypeError(f"path={path!r}: must be a file path string")
    if not isinstance(data, Mapping):
        raise TypeError(f"data must be a mapping, not {type(data).__name__}")
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    target = Path(path)
    temporary = target.with_suffix(".tmp")
    temporary.write_text(json.dumps(dict(data), default=_plain))
    temporary.replace(target)


def _plain(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def rounds_on_ranks(steps: Mapping[str, Callable[[], object]], device, **options) -> dict:
    """:func:`fp8lab.protocol.rounds` of ``steps`` on every rank, shuffled with one seed, a
    barrier before each alternative; returns ``{"cuda", "orders", "ranks": [per rank: times,
    kernel, idle]}`` (JSON-ready). ``options`` go to :func:`~fp8lab.protocol.rounds`."""
    import torch.distributed as dist

    from fp8lab.protocol import rounds

    if "before_each" in options or "order" in options:
        raise ValueError("options: the order and the barrier are set here, for every rank")
    found = rounds(
        steps, order="shuffle", before_each=dist.barrier, device=device, **options
    )
    mine = {
        "times": {k: [list(r) for r in v] for k, v in found.times.items()},
        "kernel": {k: list(v) for k, v in found.kernel.items()},
        "idle": {k: list(v) for k, v in found.idle.items()},
    }
    return {"cuda": found.cuda, "orders": found.orders, "ranks": gather(mine)}


def combine(record: Mapping, how: str | int = "median"):
    """One :class:`~fp8lab.protocol.Rounds` from :func:`rounds_on_ranks`'s ``record``: per
    round and alternative, the median over the ranks of their round medians (``"median"``),
    the largest (``"slowest"``) or rank ``how``'s (an int). Kernel time and idle share are
    rank 0's (or rank ``how``'s)."""
    from fp8lab.protocol import Rounds

    if not isinstance(record, Mapping) or "ranks" not in record:
        raise TypeError("record: must be the dict rounds_on_ranks returned")
    ranks = record["ranks"]
    if isinstance(how, int) and not isinstance(how, bool):
        checks.integer("how", how, minimum=0, maximum=len(ranks) - 1)
        pick = ranks[how]
        times = {k: [[statistics.median(r)] for r in v] for k, v in pick["times"].items()}
        source = pick
    else:
        checks.choice("how", how, HOW)
        merge = statistics.median if how == "median" else max
        names = list(ranks[0]["times"])
        times = {
            name: [
                [merge(statistics.median(rank["times"][name][i]) for rank in ranks)]
                for i in range(len(ranks[0]["times"][name]))
            ]
            for name in names
        }
        source = ranks[0]
    found = Rounds.from_times(times, cuda=bool(record.get("cuda")))
    kernel = {k: tuple(v) for k, v in source.get("kernel", {}).items() if v}
    idle = {k: tuple(v) for k, v in source.get("idle", {}).items() if v}
    return Rounds(found.times, kernel, idle, found.cuda, tuple(map(tuple, record["orders"])))


def round_ratio(found, first: str, second: str) -> list[float]:
    """Per round, ``second``'s time over ``first``'s (what a comparison pairs), for a table."""
    a, b = found.round_ms(first), found.round_ms(second)
    return [y / x if x > 0 else math.nan for x, y in zip(a, b, strict=True)]
