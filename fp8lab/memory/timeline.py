"""The training step simulated event by event: live bytes by part, and the largest total.

The step is the book's (:func:`fp8lab.training.train_step`): build the model, then for two steps
a forward and backward per micro-batch (embeddings, each layer's saved tensors and weight
copies, final norm, LM head, logits and loss; then the backward module by module, gradients
appearing while saved tensors are freed) and the optimizer step with its temporaries (states
are created by the first). Every size comes from a :class:`~fp8lab.memory.sizes.StepSizes`;
this module only says when each is allocated and freed. The peak is the largest total the
measured window sees (``window``): every moment from the build on, or, for a step after
warm-up steps, those of the last simulated step only.
"""

from __future__ import annotations

from fp8lab.memory.constants import BACKWARD_SCRATCH, FSDP2_BUFFERS
from fp8lab.memory.sizes import StepSizes
from fp8lab.parts import Part

__all__ = ["simulate"]


class Timeline:
    """Live bytes by part through a simulated step; remembers the largest total and its moment."""

    def __init__(self, counting: bool = True):
        self.live: dict[str, float] = {}
        self.events: list[tuple[str, float]] = []
        self.phases: dict[str, float] = {}
        self.peak, self.peak_event, self.at_peak = 0.0, "", {}
        self.counting = counting  # do moments count toward the peak (inside the window)?

    def add(self, part: str, nbytes: float) -> None:
        self.live[part] = max(0.0, self.live.get(part, 0.0) + nbytes)

    def set(self, part: str, nbytes: float) -> None:
        self.live[part] = nbytes

    def point(
        self, phase: str, event: str, transient: float = 0.0, part: str = Part.TEMPORARIES
    ) -> None:
        """A moment of ``phase``: what is live, plus ``transient`` bytes of ``part`` that exist
        only now."""
        total = sum(self.live.values()) + transient
        self.events.append((f"{phase}: {event}", total))
        self.phases[phase.split(", ")[-1]] = max(self.phases.get(phase.split(", ")[-1], 0), total)
        if self.counting and total > self.peak:
            self.peak, self.peak_event = total, f"{phase}: {event}"
            self.at_peak = {k: v for k, v in self.live.items() if v > 0}
            if transient:
                self.at_peak[part] = self.at_peak.get(part, 0.0) + transient


def simulate(sizes: StepSizes) -> Timeline:
    """Build the model, then two training steps (one forward and backward without optimizer).

    Under ``window="steady"`` only the last step's moments count toward the peak: a measured
    step after warm-up steps holds what every step holds (the model, its state, the caller's
    batch) and none of what the first steps do once."""
    spec = sizes.spec
    tl = Timeline(counting=spec.window == "first-steps")
    tl.set(Part.PARAMETERS, sizes.parameters)
    tl.set(Part.SCALING_STATE, sizes.scaling_state)
    if spec.persistent_grads:  # Megatron's main_grad: allocated with the model, never freed
        tl.set(Part.GRADIENTS, sizes.gradients)
    if sizes.ddp_buckets:  # DDP's reducer allocates its buckets when DDP is built
        tl.set(Part.DDP_BUCKETS, sizes.ddp_buckets)
    tl.point("build", "model built")
    if sizes.input_batch:  # the caller's batch and target, made after the model
        tl.set(Part.INPUT_BATCH, sizes.input_batch)
    steps = 2 if spec.include_optimizer else 1
    for step in range(1, steps + 1):
        if step == steps:
            tl.counting = True
        for micro in range(1, spec.accumulation + 1):
            # DDP rebuilds its buckets once, before the first forward that follows a backward
            # (torch/nn/parallel/distributed.py, _pre_forward: reducer._rebuild_buckets())
            rebuild = (step - 1) * spec.accumulation + micro == 2
            _micro_step(sizes, tl, step, micro, rebuild and spec.ddp_replaced_buckets)
        if spec.include_optimizer and spec.optimizer_used != "none":
            _optimizer_step(sizes, tl, step)
        if not spec.persistent_grads:
            tl.set(Part.GRADIENTS, 0.0)
        tl.set(Part.LOGITS, 0.0)  # train_step returns
    return tl


def _micro_step(
    sizes: StepSizes, tl: Timeline, step: int, micro: int, rebuild: bool = False
) -> None:
    """Forward, loss and backward of one micro-batch.

    ``rebuild``: DDP rebuilds its buckets before this forward. ``Reducer::rebuild_buckets``
    (``torch/csrc/distributed/c10d/reducer.cpp``) allocates new buckets; the old ones stay
    referenced by the first step's all-reduce, which ``ProcessGroupNCCL`` stashes and releases
    only at the next collective on the group after its watchdog (polling every 100 ms) has seen
    the all-reduce complete (``collective()``, ``Watchdog::runLoop``, ``workEnqueue``; the
    reducer waits on the bucket's future in ``finalize_backward``, not on ``Work::wait()``,
    whose ``synchronizeStream`` would unstash at once): where nothing else runs on DDP's group,
    the next collective is the all-reduce of the backward's first full bucket, so both sets of
    buckets are live until then, and, when the watchdog has not yet looked, until the same
    moment of a later step. Within the 100 ms of a poll and a collective after it they are
    gone, so a window after warm-up steps longer than that (``window="steady"``) sees none of
    them.
    """
    spec = sizes.spec
    grads_full = micro > 1 or spec.persistent_grads  # earlier gradients persist
    # under DDP with gradient_as_bucket_view the head's and embeddings' gradients go into
    # their buckets like the existing ones of accumulation: only the fresh one is new
    outer_full = grads_full or (spec.ddp and spec.ddp_bucket_view)
    name = f"step {step}" + (f", micro-batch {micro}" if spec.accumulation > 1 else "")
    if rebuild:
        tl.set(Part.DDP_OLD_BUCKETS, sizes.ddp_buckets)
    _forward(sizes, tl, f"{name}, forward")
    bwd = f"{name}, backward"
    outer, copies_part = sizes.outer, spec.copies_part
    tl.point(bwd, "cross-entropy (two logit gradients)", outer.loss_backward, Part.LOGITS)
    tl.add(Part.LOGITS, -outer.log_probs)
    tied = spec.cfg.tied_embeddings
    if spec.cfg.vocab_size is not None:
        if not outer_full:
            tl.add(Part.GRADIENTS, sizes.head_gradients + (sizes.tied_head_gradient if tied else 0))
        tl.point(bwd, "LM head", outer.head_backward, Part.LOGITS)
        tl.add(copies_part, -outer.head_copy)
        tl.add(Part.ACTIVATIONS, -outer.head_inputs)
        if not tied:  # an untied head's gradient fills DDP's first bucket
            _release_old_buckets(tl)
    tl.add(Part.TEMPORARIES, outer.incoming)  # the gradient flowing into the layers
    _layer_walk(sizes, tl, bwd, grads_full)
    embedding = sizes.embedding_gradients
    if spec.cfg.vocab_size is not None:  # a dense gradient of the whole table, then accumulated
        if not outer_full and not tied:
            tl.add(Part.GRADIENTS, embedding)
            tl.point(bwd, "embeddings")
        else:
            if not outer_full:
                tl.add(Part.GRADIENTS, embedding - sizes.tied_head_gradient)
            tl.point(bwd, "embeddings (gradient accumulated)", embedding)
    tl.set(Part.TEMPORARIES, 0.0)
    tl.set(Part.LOGITS, outer.held_logits)  # the step's loop still holds them
    tl.set(Part.ACTIVATIONS, 0.0)
    tl.set(copies_part, 0.0)
    tl.set(FSDP2_BUFFERS, 0.0)
    if Part.FSDP2_REDUCE_SCATTER in tl.live:  # FSDP2's finalize_backward drops the last one
        tl.set(Part.FSDP2_REDUCE_SCATTER, 0.0)


def _release_old_buckets(tl: Timeline) -> None:
    """The first full bucket's all-reduce releases the buckets DDP replaced (see
    :func:`_micro_step`)."""
    if tl.live.get(Part.DDP_OLD_BUCKETS):
        tl.set(Part.DDP_OLD_BUCKETS, 0.0)


def _forward(sizes: StepSizes, tl: Timeline, fwd: str) -> None:
    """The forward through the model and the loss: saved tensors, copies and logits appear."""
    spec, outer = sizes.spec, sizes.outer
    layers, copies_part = spec.cfg.num_layers, spec.copies_part
    tl.set(FSDP2_BUFFERS, sizes.fsdp_held)
    tl.point(fwd, "embeddings", outer.embedding_forward)
    if spec.recompute == "full":  # te.checkpoint keeps each layer's input, runs it without saving
        tl.add(Part.ACTIVATIONS, sizes.layer_input * layers)
        one_layer = sizes.saved_per_layer + sizes.copy_per_param * sizes.gemm_per_layer
        tl.point(fwd, f"layer {layers} (not saved)", one_layer)
    else:  # TE's offload keeps L - N layers' saved tensors on the GPU at the forward's end
        offloaded = sizes.offloaded_per_layer * spec.offload_layers
        tl.add(Part.ACTIVATIONS, sizes.saved_per_layer * layers - offloaded)
        if sizes.copies_kept:
            tl.add(copies_part, sizes.copy_per_param * sizes.gemm_per_layer * layers)
    tl.add(Part.ACTIVATIONS, outer.head_inputs)
    tl.add(copies_part, outer.head_copy)
    previous = tl.live.get(Part.LOGITS, 0.0)  # the last micro-batch's, until replaced
    tl.add(Part.LOGITS, outer.held_logits)
    tl.point(fwd, "logits")
    tl.add(Part.LOGITS, -previous)
    tl.point(fwd, "loss (FP32 logits)", outer.loss_forward, Part.LOGITS)
    tl.add(Part.LOGITS, outer.log_probs)
    tl.point(fwd, "end")


def _reload(sizes: StepSizes, tl: Timeline, index: int) -> float:
    """TE's offload schedule (cpu_offload.py, DefaultOffloadSynchronizer): the backward of
    layer ``index`` (1-based) first frees the reloaded tensors of the layer after it, then
    starts reloading offloaded layer ``index - L + N`` (0-based, if any). Returns the bytes of
    layer ``index``'s saved tensors that its own backward does not free (they are held as a
    group until the next layer's backward starts)."""
    n, layers = sizes.spec.offload_layers, sizes.spec.cfg.num_layers
    moved = sizes.offloaded_per_layer
    if not n:
        return 0.0
    if index < n:  # the layer after this one was offloaded: its reloaded group is freed now
        tl.add(Part.ACTIVATIONS, -moved)
    if 0 <= index - 1 - (layers - 1 - n) < n:
        tl.add(Part.ACTIVATIONS, moved)
    return moved if index <= n else 0.0


def _fresh_gradient(module, bucketed: bool, grads_full: bool) -> float:
    """What a module's backward holds beside its saved tensors: its temporaries and the cast
    of its weight gradient, with the fresh gradient itself under DDP's bucket view (until the
    reducer copies it into its bucket) or under accumulation (added into the existing one)."""
    if bucketed:
        return module.transient + module.grads + module.wgrad_cast
    if grads_full:
        return module.transient + module.grads + module.grads_after + module.wgrad_cast
    return module.transient + module.wgrad_cast


def _fsdp_post_backward(sizes: StepSizes, tl: Timeline, phase: str, index: int,
                        unsharded: float, sharded: float) -> None:
    """FSDP2's post_backward of layer ``index``: reshard, then the reduce-scatter's copy-in
    (kept until the next layer's post_backward), and the layer's sharded gradients."""
    tl.set(FSDP2_BUFFERS, sizes.fsdp_root + sizes.fsdp_layer * (index > 1))
    tl.set(Part.FSDP2_REDUCE_SCATTER, unsharded)
    tl.point(phase, f"layer {index} reduce-scatter", unsharded)
    tl.add(Part.GRADIENTS, sharded)


def _layer_walk(sizes: StepSizes, tl: Timeline, phase: str, grads_full: bool) -> None:
    """The backward through the layers, last first, module by module.

    With ``comm_buffers``: under DDP with ``gradient_as_bucket_view`` each fresh weight gradient
    lives only while its module's backward does (the reducer copies it into its bucket view);
    under sequence parallelism each module's backward holds what it all-gathered; under FSDP2
    (``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``) a layer's backward holds
    the layer and the one prefetched below it (``_backward_prefetch``) and the previous layer's
    reduce-scatter input (kept until this layer's ``post_backward``), its sharded gradients
    appear at its reduce-scatter (``foreach_reduce``), and under FP8 its weight copies are made
    module by module.
    """
    spec = sizes.spec
    copies_part, full = spec.copies_part, spec.recompute == "full"
    layers = spec.cfg.num_layers
    bucketed = spec.ddp and spec.ddp_bucket_view
    fsdp_comm = spec.fsdp_comm
    module_copies = sizes.fsdp_module_copies if not full else {}
    for index in range(layers, 0, -1):
        held = _reload(sizes, tl, index) / sizes.saved_per_layer
        unsharded = 0.0  # FSDP2: the layer's full gradients so far, before the reduce-scatter
        dp = spec.layout.dp if spec.fsdp else 0
        if fsdp_comm:  # this layer and, but for the first, the one prefetched below it
            tl.set(FSDP2_BUFFERS, sizes.fsdp_root + sizes.fsdp_layer * (1 + (index > 1)))
        if full:  # the recomputed forward brings this layer's saved tensors back
            tl.add(Part.ACTIVATIONS, sizes.saved_per_layer)
        if (full or not sizes.copies_kept) and not module_copies:  # and its weight copies
            tl.add(copies_part, sizes.layer_weight_copies)
        sharded = 0.0  # FSDP2 (comm_buffers): the layer's sharded gradients, after its RS
        for first, module in enumerate(sizes.modules):
            transient = _fresh_gradient(module, bucketed, grads_full)
            if not (bucketed or grads_full):
                if fsdp_comm:
                    sharded += module.grads
                else:
                    tl.add(Part.GRADIENTS, module.grads)
            unsharded += dp * module.grads
            transient += unsharded + BACKWARD_SCRATCH
            transient += sizes.sp_gathered.get(module.name, 0.0)
            transient += module_copies.get(module.name, 0.0)
            tl.point(phase, f"layer {index} {module.name} backward", transient)
            if first == 0 and index == layers:  # the first full bucket is all-reduced
                _release_old_buckets(tl)
            tl.add(Part.ACTIVATIONS, -module.saved * (1 - held))
            if not module_copies:
                tl.add(copies_part, -module.weight_copies)
            if not grads_full and not bucketed:
                if fsdp_comm:
                    sharded += module.grads_after
                else:
                    tl.add(Part.GRADIENTS, module.grads_after)
            unsharded += dp * module.grads_after
        if fsdp_comm:
            _fsdp_post_backward(sizes, tl, phase, index, unsharded, sharded)
        if full:
            tl.add(Part.ACTIVATIONS, -sizes.layer_input)
    if spec.offload_layers:  # the first layer's reloaded group, freed when the backward ends
        tl.add(Part.ACTIVATIONS, -sizes.offloaded_per_layer)
    tl.point(phase, "input gradient of the first layer", sizes.layer_input)


def _optimizer_step(sizes: StepSizes, tl: Timeline, step: int) -> None:
    phase = f"step {step}, optimizer step"
    if step == 1:  # states (and master weights) are created by the first step
        tl.set(Part.OPTIMIZER_STATES, sizes.states)
        tl.set(Part.MASTER_WEIGHTS, sizes.master)
        tl.point(phase, "states created", sizes.state_init_transient)
    tl.point(phase, "update", sizes.optimizer_temporary)
