"""The estimate of one training step's memory: :func:`estimate` and :class:`MemoryEstimate`.

:func:`estimate` checks its inputs once (:class:`~fp8lab.memory.spec.StepSpec`, whose fields
are its options, written once), sizes every part once (:func:`~fp8lab.memory.sizes.step_sizes`),
and hands those sizes to the breakdown tree and the simulated timeline, whose largest total is
the predicted peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fp8lab.config import TransformerConfig
from fp8lab.memory.constants import (
    CUBLAS_WORKSPACE_HOPPER,
    CUBLAS_WORKSPACE_OLDER,
    CUDA_CONTEXT,
    GiB,
    MiB,
)
from fp8lab.memory.sizes import step_sizes
from fp8lab.memory.spec import StepSpec, step_spec
from fp8lab.memory.timeline import simulate
from fp8lab.memory.tree import MemoryNode, build_tree
from fp8lab.parts import Part

__all__ = ["MemoryEstimate", "estimate"]


@dataclass(frozen=True)
class MemoryEstimate:
    """The parts (a tree, each part at its largest), the predicted peak, and where it happens.

    ``phases``: the peak of each phase (``"build"``, ``"forward"``, ``"backward"``,
    ``"optimizer step"``); ``peak_event``: the moment of the peak; ``at_peak``: what is live
    then, by part; ``timeline``: ``(event, live bytes)`` through the simulated steps;
    ``runtime``: one-off memory beside the peak (cuBLAS workspace, CUDA context);
    ``compute``: the layers' compute precision (a key of :data:`COMPUTE`), which decides the
    GPUs that can run the step at all (:func:`fp8lab.memory.fits`); ``offloaded_bytes``: what
    activation offload moves to host memory per micro-batch (and back).
    """

    tree: MemoryNode
    peak_bytes: float
    runtime: MemoryNode
    phases: dict = field(default_factory=dict)
    peak_event: str = ""
    at_peak: dict = field(default_factory=dict)
    timeline: tuple = ()
    compute: str = "bf16"
    offloaded_bytes: float = 0.0

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / MiB

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GiB

    def __str__(self) -> str:
        return (
            f"{self.tree}\npredicted peak: {self.peak_mib:,.1f} MiB at {self.peak_event}\n"
            f"{self.runtime}"
        )


def estimate(cfg: TransformerConfig, batch: int, seq: int, **options) -> MemoryEstimate:
    """The memory of training ``cfg`` at micro-batch ``batch`` and sequence ``seq`` (at most
    ``cfg.max_seq_len``), e.g. ``estimate(cfg, 4, 2048, precision="fp8-delayed")``.

    ``options`` are the fields of :class:`~fp8lab.memory.spec.StepSpec` after ``seq``
    (:data:`~fp8lab.memory.spec.OPTIONS`; their meanings and defaults are written there once):
    ``precision``, ``weights``, ``optimizer``, ``momentum``, ``recompute``, ``layout``,
    ``accumulation`` and the rest.

    ``peak_bytes`` predicts the rise of ``torch.cuda.max_memory_allocated`` over building the
    model and two training steps (``include_optimizer=False``: one forward and backward, no
    optimizer state), or, with ``window="steady"``, over a step after warm-up steps, above
    what was allocated before the build; ``runtime`` holds one-off memory beside it.
    """
    spec = step_spec(cfg, batch, seq, options)
    sizes = step_sizes(spec)
    tl = simulate(sizes)
    return MemoryEstimate(
        tree=build_tree(sizes),
        peak_bytes=tl.peak,
        runtime=runtime_node(spec),
        phases=dict(tl.phases),
        peak_event=tl.peak_event,
        at_peak=dict(tl.at_peak),
        timeline=tuple(tl.events),
        compute=spec.compute,
        offloaded_bytes=sizes.offloaded_per_layer * spec.offload_layers,
    )


def runtime_node(spec: StepSpec) -> MemoryNode:
    """One-off memory beside the peak: TE's cuBLAS workspace (not in FP32) and the CUDA context."""
    runtime = MemoryNode("runtime (once per process)")
    if spec.compute != "fp32":
        workspace = CUBLAS_WORKSPACE_HOPPER if spec.hopper else CUBLAS_WORKSPACE_OLDER
        runtime.add(Part.CUBLAS_WORKSPACE, workspace)
    runtime.add(Part.CUDA_CONTEXT, CUDA_CONTEXT)
    return runtime
