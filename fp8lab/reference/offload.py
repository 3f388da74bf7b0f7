"""``te.get_cpu_offload_context`` (TE 2.20 ``pytorch/cpu_offload.py``) on a CPU.

TE moves the tensors that the first ``num_layers`` of ``model_layers`` layers save for their
backward to pinned host memory, and back before their backward. On a CPU they already live in
host memory, so the reference keeps them where they are; it checks the arguments as TE does
and counts the layers, so that the same code runs on both lanes.
"""

from __future__ import annotations

import contextlib

__all__ = ["get_cpu_offload_context"]


def get_cpu_offload_context(
    enabled: bool = False,
    num_layers: int | None = 1,
    model_layers: int = 1,
    offload_activations: bool = True,
    offload_weights: bool = False,
    double_buffering: bool = False,
    manual_synchronization: bool = False,
    retain_pinned_cpu_buffers: bool = False,
    offload_stream=None,
):
    """``(context, sync_function)``: enter ``context`` around each layer's forward and pass the
    layer's output through ``sync_function``, as with TE. Manual synchronization is TE's only."""
    del double_buffering, retain_pinned_cpu_buffers  # no effect without a GPU
    if manual_synchronization or offload_stream is not None:
        raise NotImplementedError("manual offload synchronization: use Transformer Engine")
    if not enabled or offload_weights and not offload_activations:
        return contextlib.nullcontext(), lambda x: x
    if not offload_activations:
        raise ValueError(
            "CPU Offloading is enabled while it is not mentioned what to offload "
            "(weights/activations)"
        )
    if num_layers > model_layers - 1:
        raise ValueError(
            "Cannot offload all layers without manual synchronization - last layer is not"
            f" offloaded. Got num_layers={num_layers}, model_layers={model_layers}."
        )
    context = _Context()
    return context, context.synchronization_function


class _Context(contextlib.ContextDecorator):
    """Enter around a layer's forward; exit, then hand its output to the sync function."""

    def __init__(self):
        self.inside = False

    def __enter__(self):
        if self.inside:
            raise RuntimeError(
                "Offloading context was entered without synchronization function being called."
            )
        self.inside = True
        return self

    def __exit__(self, *exc):
        self.inside = False

    def synchronization_function(self, tensor):
        if not tensor.requires_grad:
            raise ValueError(
                "Tensor passed to synchronization_function must require grad to register "
                f"backward hooks, but got requires_grad=False for shape={tuple(tensor.shape)}"
            )
        if self.inside:
            raise RuntimeError(
                "Synchronization function was called without offloading context being entered."
            )
        return tensor
