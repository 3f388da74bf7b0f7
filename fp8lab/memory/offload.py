"""What activation offload costs in time, predicted from the host link's bandwidth.

``te.get_cpu_offload_context(num_layers=N, model_layers=L)`` copies the saved tensors of
layers 0..N-1 to pinned host memory on a stream of its own, and back in the backward (TE 2.20
``cpu_offload.py``, ``DefaultOffloadSynchronizer``): layer i's copy starts when its forward has
made its tensors, and must be done before layer L-N+i's forward starts (its GPU memory is then
freed); its reload starts when the backward reaches layer L-1-N+i, and layer i's backward waits
for it. :func:`offload_overhead_ms` plays that schedule with copies of a measured bandwidth
and layers of a measured compute time: the step is slower only where a copy misses its
deadline. The host's cost of TE's saved-tensor hooks, and copies slowing kernels by sharing
memory bandwidth, are not in it.
"""

from __future__ import annotations

from fp8lab import checks

__all__ = ["offload_overhead_ms"]


def offload_overhead_ms(
    layer_bytes: float,
    offloaded: int,
    layers: int,
    forward_ms: float,
    backward_ms: float,
    d2h_gb_s: float,
    h2d_gb_s: float,
) -> dict[str, float]:
    """Predicted stalls (ms) of one step that offloads ``offloaded`` of ``layers`` layers of
    ``layer_bytes`` each, with the layers' forward and backward taking ``forward_ms`` and
    ``backward_ms`` in all and copies at ``d2h_gb_s`` / ``h2d_gb_s`` (GB/s, 1e9 bytes):
    ``{"forward": ..., "backward": ..., "total": ..., "copies": ...}``, where ``copies`` is
    the time of every copy, what the step would lose if none overlapped compute."""
    layer_bytes = checks.number("layer_bytes", layer_bytes, non_negative=True)
    layers = checks.integer("layers", layers)
    checks.integer("offloaded", offloaded, minimum=0, maximum=max(0, layers - 1))
    f = checks.number("forward_ms", forward_ms, non_negative=True) / layers
    b = checks.number("backward_ms", backward_ms, non_negative=True) / layers
    out = layer_bytes / checks.number("d2h_gb_s", d2h_gb_s, positive=True) / 1e6
    back = layer_bytes / checks.number("h2d_gb_s", h2d_gb_s, positive=True) / 1e6
    n, lead = offloaded, layers - offloaded
    t, free, done = 0.0, 0.0, {}
    for k in range(layers):  # forward
        if k >= lead:  # layer k - lead's memory is freed now: its copy must be done
            t = max(t, done[k - lead])
        t += f
        if k < n:
            free = done[k] = max(t, free) + out
    stall_forward = t - layers * f
    t, free, ready = 0.0, 0.0, {}
    for k in range(layers - 1, -1, -1):  # backward
        i = k - (layers - 1 - n)
        if 0 <= i < n:
            free = ready[i] = max(t, free) + back
        if k < n:
            t = max(t, ready[k])
        t += b
    stall_backward = t - layers * b
    return {
        "forward": stall_forward,
        "backward": stall_backward,
        "total": stall_forward + stall_backward,
        "copies": n * (out + back),
    }
