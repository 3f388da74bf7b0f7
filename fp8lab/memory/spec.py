"""The inputs of one memory estimate, written and checked once: :class:`StepSpec`.

:func:`fp8lab.memory.estimate` takes the model, the micro-batch and the sequence, and options (the
parameter layout, the compute precision, the optimizer, recompute, parallelism and more): its
options are the fields of :class:`StepSpec`, which holds them, rejects bad ones with a
``ValueError``/``TypeError`` naming the argument, and resolves what they imply (the parameter
layout, the compute precision, whether ``torch.autocast`` runs), so the sizing code downstream
trusts its input. :func:`step_spec` builds one from a dict of options, naming an unknown one.
:func:`require_seq` is the one check of a sequence length against the model's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from fp8lab import checks
from fp8lab.config import TransformerConfig, require_config
from fp8lab.flops import RECOMPUTE
from fp8lab.memory.constants import ADAMW_IMPLS, OPTIMIZERS, WINDOWS
from fp8lab.memory.layouts import Layout, Weights, resolve_precision
from fp8lab.parts import Part

__all__ = ["OPTIONS", "StepSpec", "require_seq", "step_spec"]


def require_seq(cfg: TransformerConfig, seq: int, name: str = "seq") -> int:
    """``seq`` if it is a positive integer no longer than ``cfg.max_seq_len``, else a
    ``ValueError``/``TypeError`` naming ``name`` (the model has no positions beyond it)."""
    checks.integer(name, seq)
    if seq > cfg.max_seq_len:
        raise ValueError(
            f"{name}={seq}: must be at most the model's max_seq_len={cfg.max_seq_len}"
        )
    return seq


@dataclass(frozen=True)
class StepSpec:
    """What one training step of ``cfg`` runs: micro-batch ``batch`` x ``seq`` tokens (``seq`` at
    most ``cfg.max_seq_len``), and how. Every field after ``seq`` is an option of
    :func:`fp8lab.memory.estimate`:

    ``precision``: the layers' compute (:data:`~fp8lab.memory.COMPUTE`, or ``"fp8-weights"``);
    ``weights``: the parameter layout (a key of :data:`~fp8lab.memory.WEIGHTS`; by default BF16
    parameters with FP32 master weights, or FP8 ones for ``"fp8-weights"``, see
    :func:`~fp8lab.memory.resolve_precision`); ``optimizer`` (``"adamw"``, ``"sgd"`` or
    ``"none"``); ``momentum``: ``torch.optim.SGD``'s (0 by default, as in torch: no momentum
    buffer; only ``optimizer="sgd"`` takes one); ``adamw_impl``: ``torch.optim.AdamW``'s
    implementation; ``recompute`` through ``te.checkpoint`` (``"selective"``:
    ``checkpoint_core_attention``); ``layout``: tensor, sequence and data parallelism with a ZeRO
    stage (``None``: one GPU); ``accumulation``: micro-batches per step; ``bf16_autocast``:
    ``torch.autocast`` around the forward (``None``: as ``train_step`` on a GPU, on unless the
    compute is FP32); ``fp32_grads``; ``hidden_dropout``; ``flash_attention`` (no S x S term);
    ``hopper`` (FP8 weights keep a transpose, and the cuBLAS workspace is Hopper's);
    ``amax_history_len`` of delayed scaling; ``include_optimizer=False``: one forward and
    backward, no optimizer state; ``offload_layers``: the activations of the first N layers
    moved to host memory by ``te.get_cpu_offload_context(num_layers=N, model_layers=L)``
    (at most L - 1, TE's rule; not with recompute); ``persistent_grads``: gradient buffers
    allocated once and never freed (Megatron's ``main_grad``; with ``fp32_grads``, 4 B/param);
    ``fsdp_buffers``: under ZeRO-3 with dp > 1, FSDP2's all-gathered layers and unsharded
    gradient (``False``: the sharded state only, as before they were modelled);
    ``comm_buffers``: what the parallel layouts hold beside the model's own tensors (``False``,
    the default: left out, as in the estimates chapter 08's committed four-GPU predictions were
    made from): under DDP (dp > 1, ZeRO stage 0 or 1) the reducer's gradient buckets and, in
    the second step, the first step's buckets (DDP rebuilds its buckets once, and the old ones
    live on until their all-reduce is released, :mod:`fp8lab.memory.timeline`); under sequence
    parallelism the tensors TE all-gathers in each module's backward, and only the row-wise
    FP8 copy of the QKV input saved; under FSDP2 the sharded gradients from each layer's
    reduce-scatter on, the previous layer's reduce-scatter input, and FP8 weight copies made
    module by module in the backward (:mod:`fp8lab.memory.sizes` cites the source of each);
    ``ddp_bucket_view``: DDP's ``gradient_as_bucket_view`` (``True``: the gradients are views
    of the buckets; ``False``, DDP's default: the buckets are allocated beside them);
    ``window``: the steps the peak spans, above what was allocated before the model was built
    (:data:`~fp8lab.memory.constants.WINDOWS`): ``"first-steps"``, the default, from the build
    through the first two steps (``tools/memory_check`` and ``tools/layout_peaks_worker.py``
    reset the peak counter before the build); ``"steady"``, a step after warm-up steps
    (chapter 08's worker resets it after its warm-up): the simulated second step stands for
    it, and what the first steps do once does not count, the first step's creation of the
    optimizer state and, with ``comm_buffers``, the buckets DDP replaces in its one rebuild
    (:mod:`fp8lab.memory.timeline` says when those are released); ``stack_batch``: a bare stack
    of layers (no vocabulary) trained as chapter 08's workers train it: the caller holds the
    input batch (activation dtype) and an FP32 target of the output's shape, and the loss is
    ``mse_loss(out.float(), target)``; ``whole_batch``: with ``stack_batch`` under sequence
    parallelism, each rank makes the group's whole batch and target and trains on views of its
    share of the sequence (``x.chunk(tp, 0)[rank]``, as chapter 08's tensor-parallel task
    does), so it holds all of them (``False``: each rank makes only its share, as
    ``tools/layout_peaks_worker.py`` does).

    ``parameter_layout``, ``compute`` and ``autocast`` are what the options resolve to.
    """

    cfg: TransformerConfig
    batch: int
    seq: int
    precision: str = "bf16"
    weights: str | None = None
    optimizer: str = "adamw"
    momentum: float = 0.0
    adamw_impl: str = "foreach"
    recompute: str = "none"
    layout: Layout | None = None
    accumulation: int = 1
    bf16_autocast: bool | None = None
    fp32_grads: bool = False
    hidden_dropout: float = 0.1
    flash_attention: bool = True
    hopper: bool = True
    amax_history_len: int = 1024
    include_optimizer: bool = True
    offload_layers: int = 0
    persistent_grads: bool = False
    fsdp_buffers: bool = True
    comm_buffers: bool = False
    ddp_bucket_view: bool = False
    window: str = "first-steps"
    stack_batch: bool = False
    whole_batch: bool = False
    parameter_layout: Weights = field(init=False)
    compute: str = field(init=False)
    autocast: bool = field(init=False)

    def __post_init__(self):
        require_config(self.cfg)
        checks.integer("batch", self.batch)
        require_seq(self.cfg, self.seq)
        parameter_layout, compute = resolve_precision(self.precision, self.weights)
        object.__setattr__(self, "parameter_layout", parameter_layout)
        object.__setattr__(self, "compute", compute)
        checks.choice("optimizer", self.optimizer, OPTIMIZERS)
        checks.number("momentum", self.momentum, non_negative=True)
        if self.momentum and self.optimizer != "sgd":
            raise ValueError(
                f"momentum={self.momentum}: only optimizer='sgd' takes a momentum, "
                f"not optimizer={self.optimizer!r}"
            )
        checks.choice("adamw_impl", self.adamw_impl, ADAMW_IMPLS)
        checks.choice("recompute", self.recompute, RECOMPUTE)
        layout = Layout() if self.layout is None else self.layout
        if not isinstance(layout, Layout):
            raise TypeError(f"layout must be a memory.Layout, not {type(layout).__name__}")
        object.__setattr__(self, "layout", layout)
        checks.integer("accumulation", self.accumulation)
        self._check_autocast()
        checks.flag("fp32_grads", self.fp32_grads)
        checks.probability("hidden_dropout", self.hidden_dropout)
        checks.flag("flash_attention", self.flash_attention)
        checks.flag("hopper", self.hopper)
        checks.integer("amax_history_len", self.amax_history_len)
        checks.flag("include_optimizer", self.include_optimizer)
        checks.flag("persistent_grads", self.persistent_grads)
        checks.flag("fsdp_buffers", self.fsdp_buffers)
        for name in ("comm_buffers", "ddp_bucket_view", "stack_batch", "whole_batch"):
            checks.flag(name, getattr(self, name))
        checks.choice("window", self.window, WINDOWS)
        if self.stack_batch and self.cfg.vocab_size is not None:
            raise ValueError(
                "stack_batch=True: only a bare stack of layers (vocab_size=None) takes its "
                "batch and target from the caller"
            )
        if self.whole_batch and not self.stack_batch:
            raise ValueError("whole_batch=True: only with stack_batch=True (the caller's batch)")
        self._check_parallelism()
        self._check_offload()

    def _check_offload(self) -> None:
        """TE's own rules (cpu_offload.py, get_cpu_offload_context): without manual
        synchronization at most L - 1 layers; recompute with offload is not modelled."""
        layers = self.cfg.num_layers
        checks.integer("offload_layers", self.offload_layers, minimum=0)
        if self.offload_layers > layers - 1:
            raise ValueError(
                f"offload_layers={self.offload_layers}: TE offloads at most num_layers - 1 = "
                f"{layers - 1} layers (the last layer's activations stay)"
            )
        if self.offload_layers and self.recompute != "none":
            raise ValueError(
                f"offload_layers={self.offload_layers} with recompute={self.recompute!r}: "
                "not modelled (use one or the other)"
            )

    def _check_autocast(self) -> None:
        """Resolve ``bf16_autocast`` (``None``: on unless the compute is FP32) against the
        parameter layout, which fixes it for FP32 parameters and FP32 compute."""
        autocast = self.compute != "fp32" if self.bf16_autocast is None else self.bf16_autocast
        checks.flag("bf16_autocast", autocast)
        needed = self.parameter_layout.autocast
        if autocast != needed and (needed or self.compute == "fp32"):
            raise ValueError(
                f"bf16_autocast={self.bf16_autocast}: weights={self.parameter_layout.name!r} with "
                f"precision={self.precision!r} runs {'with' if needed else 'without'} "
                "torch.autocast"
            )
        object.__setattr__(self, "autocast", autocast)

    def _check_parallelism(self) -> None:
        cfg, tp = self.cfg, self.layout.tp
        if cfg.hidden_size % tp or cfg.ffn_hidden_size % tp or cfg.groups % tp:
            raise ValueError(f"tp={tp} must divide hidden_size, ffn_hidden_size and num_gqa_groups")
        if self.layout.sequence_parallel and self.seq % tp:
            raise ValueError(f"sequence parallelism needs tp={tp} to divide seq={self.seq}")

    @property
    def fsdp(self) -> bool:
        """Are FSDP2's all-gather buffers modelled (ZeRO-3 over more than one rank)?"""
        return self.fsdp_buffers and self.layout.zero_stage == 3 and self.layout.dp > 1

    @property
    def ddp(self) -> bool:
        """Is DDP's reducer modelled (``comm_buffers``, dp > 1, gradients not sharded)?"""
        return self.comm_buffers and self.layout.dp > 1 and self.layout.zero_stage <= 1

    @property
    def ddp_replaced_buckets(self) -> bool:
        """Are the buckets DDP replaces in its one rebuild counted (DDP's reducer modelled, and
        the peak spans the first steps, in which they are still held)?"""
        return self.ddp and self.window == "first-steps"

    @property
    def sp_buffers(self) -> bool:
        """Are sequence parallelism's all-gathered tensors modelled?"""
        return self.comm_buffers and self.layout.sequence_parallel

    @property
    def fsdp_comm(self) -> bool:
        """Are FSDP2's reduce-scatter and module-by-module FP8 copies modelled?"""
        return self.comm_buffers and self.fsdp

    @property
    def momentum_buffer(self) -> bool:
        """Does the optimizer keep a momentum buffer (torch.optim.SGD with momentum > 0)?"""
        return self.optimizer_used == "sgd" and self.momentum > 0

    @property
    def fp8(self) -> bool:
        """Do the layers' GEMMs run in FP8?"""
        return self.compute.startswith("fp8")

    @property
    def element(self) -> int:
        """Bytes of one activation element: 4 in FP32 compute, else 2 (BF16)."""
        return 4 if self.compute == "fp32" else 2

    @property
    def optimizer_used(self) -> str:
        """The optimizer whose state exists: ``"none"`` when the estimate leaves it out."""
        return self.optimizer if self.include_optimizer else "none"

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch (B * S)."""
        return self.batch * self.seq

    @property
    def rep(self) -> int:
        """What divides the tensors tensor parallelism replicates (tp under SP, else 1)."""
        return self.layout.tp if self.layout.sequence_parallel else 1

    @property
    def copies_part(self) -> str:
        """The part the layers' weight copies count under: FP8 copies, or autocast's BF16 ones."""
        return Part.FP8_WEIGHT_COPIES if self.fp8 else Part.AUTOCAST_COPIES


# The options of an estimate: StepSpec's fields after (cfg, batch, seq), in order.
OPTIONS: tuple[str, ...] = tuple(f.name for f in fields(StepSpec) if f.init)[3:]


def step_spec(cfg: TransformerConfig, batch: int, seq: int, options: dict) -> StepSpec:
    """A :class:`StepSpec` from ``options`` (names of :data:`OPTIONS`); an unknown name is a
    ``TypeError`` that names it and lists the options."""
    if not isinstance(options, dict):
        raise TypeError(f"options={checks.show(options)}: must be a dict of option names")
    unknown = [name for name in options if name not in OPTIONS]
    if unknown:
        raise TypeError(
            f"{unknown[0]}={checks.show(options[unknown[0]])}: no such option of a memory "
            f"estimate (options: {', '.join(OPTIONS)})"
        )
    return StepSpec(cfg, batch, seq, **options)
