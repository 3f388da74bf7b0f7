"""All-reduce times per message size: eager calls, and calls in a CUDA graph."""
import time

import torch
import torch.distributed as dist

from common import ARGS, CUDA, OUT, start, write

te, recipe, device = start()
CALLS = ARGS["calls"]


def sync():
    if CUDA:
        torch.cuda.synchronize()


def eager_us(buffer):
    """Per call: CALLS all-reduces issued one by one (the host launches each)."""
    sync()
    begin = time.perf_counter()
    for _ in range(CALLS):
        dist.all_reduce(buffer)
    sync()
    return (time.perf_counter() - begin) / CALLS * 1e6


def graph_us(buffer):
    """Per call: CALLS all-reduces captured in one CUDA graph, then replayed."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            dist.all_reduce(buffer)
    graph.replay()
    sync()
    begin = time.perf_counter()
    for _ in range(ARGS["replays"]):
        graph.replay()
    sync()
    return (time.perf_counter() - begin) / (ARGS["replays"] * CALLS) * 1e6


rows, graph_error = [], None
for nbytes in ARGS["sizes"]:
    buffer = torch.ones(nbytes // 4, device=device)  # FP32 elements
    for _ in range(3):  # warm-up: NCCL sets up its channels for this size
        dist.all_reduce(buffer)
    row = {"bytes": nbytes, "eager_us": eager_us(buffer), "graph_us": None}
    if CUDA and graph_error is None:
        try:
            row["graph_us"] = graph_us(buffer)
        except Exception as error:  # what this machine refused, to print, not guess
            graph_error = f"{type(error).__name__}: {str(error)[:300]}"
    rows.append(row)
write(OUT, {"rows": rows, "n": dist.get_world_size(), "graph_error": graph_error})
dist.destroy_process_group()
