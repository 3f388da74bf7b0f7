"""The breakdown tree: every part of a training step's memory at its largest.

:class:`MemoryNode` is a named amount of memory and its parts; :func:`build_tree` lays out a
:class:`~fp8lab.memory.sizes.StepSizes` under the names of :class:`fp8lab.parts.Part`. It sizes
nothing itself: the numbers are those the simulated timeline moves. The peak is less than the
tree's total, since not every part is live at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fp8lab import checks
from fp8lab.memory.constants import BACKWARD_SCRATCH, MiB
from fp8lab.memory.sizes import StepSizes
from fp8lab.parts import Part

__all__ = ["MemoryNode", "build_tree"]


@dataclass
class MemoryNode:
    """A named amount of memory and its parts; ``total`` sums the subtree."""

    name: str
    nbytes: float = 0.0
    note: str = ""
    children: list[MemoryNode] = field(default_factory=list)

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise TypeError(f"name={self.name!r}: must be a string")
        self.nbytes = checks.number("nbytes", self.nbytes, non_negative=True)

    def add(self, name: str, nbytes: float = 0.0, note: str = "") -> MemoryNode:
        child = MemoryNode(name, nbytes, note)
        self.children.append(child)
        return child

    @property
    def total(self) -> float:
        return self.nbytes + sum(child.total for child in self.children)

    def __getitem__(self, name: str) -> MemoryNode:
        for child in self.children:
            if child.name == name:
                return child
        raise KeyError(
            f"no part {name!r} under {self.name!r} (parts: {[c.name for c in self.children]})"
        )

    def walk(self, depth: int = 0):
        yield depth, self
        for child in self.children:
            yield from child.walk(depth + 1)

    def table(self):
        """The tree as a pandas DataFrame: one row per node, indented names, MiB and share of the
        total."""
        import pandas as pd

        rows = [
            {
                "part": "  " * depth + node.name,
                "MiB": node.total / MiB,
                "share": node.total / self.total if self.total else 0.0,
                "note": node.note,
            }
            for depth, node in self.walk()
        ]
        return pd.DataFrame(rows).set_index("part")

    def __str__(self) -> str:
        return "\n".join(
            f"{'  ' * d}{n.name}: {n.total / MiB:,.1f} MiB" + (f"  ({n.note})" if n.note else "")
            for d, n in self.walk()
        )


def build_tree(sizes: StepSizes) -> MemoryNode:
    """Every part at its largest (the peak is less than their sum: not all live at once)."""
    spec = sizes.spec
    tree = MemoryNode(
        f"{spec.cfg.name}: B={spec.batch}, S={spec.seq}, {spec.parameter_layout.name} weights, "
        f"{spec.compute}, recompute={spec.recompute}"
    )
    _training_state(tree, sizes)
    _weight_copies(tree, sizes)
    _activations(tree, sizes)
    _comm_buffers(tree, sizes)
    temps = tree.add(Part.TEMPORARIES)
    if sizes.optimizer_temporary:
        temps.add(Part.OPTIMIZER_TEMPORARIES, sizes.optimizer_temporary)
    temps.add("backward scratch", BACKWARD_SCRATCH, "measured constant")
    return tree


def _training_state(tree: MemoryNode, sizes: StepSizes) -> None:
    """Parameters, gradients, master weights and optimizer states (under DDP with
    ``gradient_as_bucket_view`` the gradients are the buckets', shown under the buffers)."""
    state = tree.add(Part.TRAINING_STATE)
    in_buckets = sizes.spec.ddp and sizes.spec.ddp_bucket_view
    for part, size in (
        (Part.PARAMETERS, sizes.parameters),
        (Part.GRADIENTS, 0.0 if in_buckets else sizes.gradients),
        (Part.MASTER_WEIGHTS, sizes.master),
        (Part.OPTIMIZER_STATES, sizes.states),
    ):
        if size:
            state.add(part, size, f"{sizes.per_parameter[part]:g} B/param")


def _weight_copies(tree: MemoryNode, sizes: StepSizes) -> None:
    """FP8 scales and weight copies, or autocast's BF16 copies (layers' and the LM head's)."""
    spec, outer = sizes.spec, sizes.outer
    copies_note = "" if sizes.kept_layers == spec.cfg.num_layers else ", one layer at a time"
    if spec.fp8:
        extras = tree.add(Part.FP8_EXTRAS)
        extras.add(Part.SCALING_STATE, sizes.scaling_state)
        if sizes.fsdp_module_copies and spec.recompute != "full":
            extras.add(
                Part.FP8_WEIGHT_COPIES,
                max(sizes.fsdp_module_copies.values()),
                "one module at a time (FSDP2)",
            )
        elif sizes.copy_per_param:
            extras.add(
                Part.FP8_WEIGHT_COPIES,
                sizes.weight_copies,
                ("data + transpose" if spec.hopper else "data") + copies_note,
            )
    if spec.parameter_layout.autocast or outer.head_copy:
        copies = tree.add(Part.AUTOCAST_COPIES)
        if not spec.fp8:
            copies.add("layers' GEMM weights", sizes.weight_copies, "2 B/param" + copies_note)
        if outer.head_copy:
            copies.add("LM head", outer.head_copy, "cached by autocast")


def _activations(tree: MemoryNode, sizes: StepSizes) -> None:
    """Saved tensors of the layers (or their checkpoints), the head's inputs, logits and loss."""
    spec, outer = sizes.spec, sizes.outer
    layers, full = spec.cfg.num_layers, spec.recompute == "full"
    acts = tree.add(Part.ACTIVATIONS)
    if full:
        acts.add(Part.CHECKPOINTS, sizes.layer_input * layers, "one per layer")
        one = acts.add(Part.RECOMPUTED_LAYER, note="during its backward only")
    else:
        one = acts.add(f"per layer x {layers}")
    for name, size in sizes.saved.items():
        if size:
            one.add(name, size if full else size * layers)
    if spec.cfg.vocab_size is None:
        acts.add(Part.OUTPUT_AND_GRADIENT, 2 * sizes.layer_input)
        return
    acts.add(Part.HEAD_INPUTS, outer.head_inputs)
    logits = tree.add(Part.LOGITS)
    logits.add(Part.HELD_LOGITS, outer.held_logits)
    logits.add(Part.LOG_PROBS, outer.log_probs, "FP32")
    logits.add(Part.LOSS_COPIES, outer.loss_forward, "a moment")
    logits.add(Part.LOSS_GRADIENTS, outer.loss_backward, "FP32, a moment")


def _comm_buffers(tree: MemoryNode, sizes: StepSizes) -> None:
    """The parallel layouts' own buffers (``comm_buffers``) and a bare stack's batch
    (``stack_batch``), each at its largest; nothing when none is modelled."""
    spec = sizes.spec
    found = []
    if sizes.ddp_buckets:
        view = "the gradients are views of them" if spec.ddp_bucket_view else "beside them"
        found.append((Part.DDP_BUCKETS, sizes.ddp_buckets, view))
        steps = (2 if spec.include_optimizer else 1) * spec.accumulation
        if spec.ddp_replaced_buckets and steps > 1:
            found.append((Part.DDP_OLD_BUCKETS, sizes.ddp_buckets, "second step"))
    if sizes.sp_gathered:
        found.append((Part.SP_GATHERED, max(sizes.sp_gathered.values()), "largest module"))
    if spec.fsdp_comm:
        layer_grads = sum(
            spec.layout.dp * (m.grads + m.grads_after) for m in sizes.modules
        )
        found.append((Part.FSDP2_REDUCE_SCATTER, layer_grads, "one layer's gradients"))
    if sizes.input_batch:
        found.append((Part.INPUT_BATCH, sizes.input_batch, ""))
    if found:
        node = tree.add(Part.COMM_BUFFERS)
        for name, nbytes, note in found:
            node.add(name, nbytes, note)
