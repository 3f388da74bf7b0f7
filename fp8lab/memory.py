"""Memory of training a transformer: a tree of named parts, and the peak of a whole step.

**The step modelled** is the book's, :func:`fp8lab.training.train_step` (``fp8lab.models.GPT``
with ``te.TransformerLayer`` layers, ``fp8lab.training.lm_loss``), as people write it::

    for step in range(steps):
        zero the gradients (set them to None)
        for tokens, targets in micro_batches:         # gradients add up over micro-batches
            with torch.autocast(dtype=torch.bfloat16), te.autocast(recipe=...):
                logits = model(tokens)                # kept until the next logits replace it
            (lm_loss(logits, targets) / len(micro_batches)).backward()  # FP32 cross-entropy
        optimizer.step()                              # states are created on the first step

It is simulated event by event (:attr:`MemoryEstimate.timeline`): embeddings, each layer's
saved tensors and weight copies, final norm, LM head, logits and loss, then the backward
module by module (gradients appear while saved tensors are freed), the optimizer step with
its temporaries, for two steps. The largest live total predicts
``torch.cuda.max_memory_allocated`` over building the model and the steps (above what was
allocated before); :attr:`MemoryEstimate.peak_event` names where it happens.

**Parameter layouts** (:data:`WEIGHTS`): pure BF16 (BF16 AdamW moments, no master);
FP32 parameters under ``torch.autocast`` (which casts BF16 weight copies for the forward and
keeps them for the backward); BF16 parameters with FP32 master weights and moments
(Megatron-style, TE's ``FusedAdam(master_weights=True)``); FP8 weights from
``te.quantized_model_init`` with FP32 master weights. Each runs in BF16 or under TE's FP8
autocast (delayed, current or block scaling).

**Sources.** Training state: Rajbhandari et al. 2020 (ZeRO, sec. 3.1 and 5: the 16 bytes per
parameter of mixed-precision Adam, 18 with FP32 gradients, and their sharding). Activations:
the tensors TE 2.20's ``LayerNormLinear``, ``DotProductAttention`` (cuDNN fused attention: no
S x S term), ``Linear`` and ``LayerNormMLP`` save, which reproduce Korthikanti et al. 2022's
``34 s b h`` per layer in BF16 (``5 a s^2 b`` more with unfused attention); tensor and
sequence parallelism as in that paper. FP8: ``module/linear.py`` (a BF16 weight is quantized
row- and column-wise, 2 bytes/parameter on Hopper, and saved for the backward; a saved FP8
input keeps only its column-wise copy), ``module/base.py`` (``quantized_model_init``),
``optimizers/fused_adam.py`` (master weights and moments created lazily in the first
``step``; FP32 copies of the gradients of FP8 weights outside delayed scaling). PyTorch:
``torch/optim/adam.py`` (foreach AdamW allocates one moment-sized temporary), autograd's
cross-entropy (log-softmax output saved; two dense logit gradients in the backward),
autocast's weight cache. Each constant below names its source.

**Known limits.** Allocator fragmentation and the CUDA context (outside
``max_memory_allocated``) are beside the peak, not in it (:attr:`MemoryEstimate.runtime`);
kernels' scratch beyond the cuBLAS workspace is one measured constant; ZeRO-3/FSDP all-gather
buffers and pipeline parallelism are not modelled. Checked against measured peaks of complete
training steps on an H200 by ``tools/memory_check.py`` (results in ``tests/gpu_results``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fp8lab import checks
from fp8lab.config import TransformerConfig, require_config
from fp8lab.flops import RECOMPUTE, layer_parameters
from fp8lab.parts import Part, Saved

__all__ = [
    "ADAMW_IMPLS",
    "COMPUTE",
    "CUDA_CONTEXT",
    "Layout",
    "MemoryEstimate",
    "MemoryNode",
    "OPTIMIZERS",
    "PRECISIONS",
    "WEIGHTS",
    "Weights",
    "backward_transients",
    "bytes_per_parameter",
    "estimate",
    "fitting_gpus",
    "korthikanti_activations",
    "largest_micro_batch",
    "resolve_precision",
    "zero_training_state",
]

MiB = 2**20
GiB = 2**30

# Compute precision: what the GEMMs of the transformer layers run in.
COMPUTE = ("fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-block")
# ``precision`` also takes the short names of earlier versions: "fp8-weights" is FP8 weights
# (quantized_model_init, FP32 master) with delayed scaling; alone, "bf16" and the FP8 recipes
# mean BF16 parameters with FP32 master weights (see resolve_precision).
PRECISIONS = (*COMPUTE, "fp8-weights")
OPTIMIZERS = ("adamw", "sgd", "none")
# torch.optim.AdamW's three implementations (torch/optim/adam.py); on CUDA torch picks foreach.
ADAMW_IMPLS = ("foreach", "fused", "for-loop")
ZERO_STAGES = (0, 1, 2, 3)

# --- constants, each with its source ------------------------------------------------------------

# TE 2.20, cpp_extensions/gemm.py, get_cublas_workspace_size_bytes(): 32 MiB plus 1 KiB of
# alignment and scales on Hopper and newer, 4 MiB on older GPUs. Allocated once per process by
# the first te.Linear's reset_parameters (module/linear.py, _prealloc_cublas_workspace): this is
# why a first FP8 te.Linear(4096, 4096) under quantized_model_init shows 4 bytes/parameter right
# after init (2 of FP8 data and transpose, 2 = 32 MiB / 4096^2 of workspace).
CUBLAS_WORKSPACE_HOPPER = 32 * MiB + 1024
CUBLAS_WORKSPACE_OLDER = 4 * MiB
# The CUDA context and kernels' code: about 0.5 GiB on an H200 with torch 2.11 (nvidia-smi's used
# memory minus max_memory_allocated after a warm-up); outside max_memory_allocated.
CUDA_CONTEXT = 512 * MiB
# Scratch that the backward of TE modules holds beyond the tensors modelled here (autograd's sums
# of branch gradients, norm and GEMM helper buffers): measured on an H200 with TE 2.20.2, where
# the peaks of stacks of te.TransformerLayer sat 20-28 MiB above the modelled tensors.
BACKWARD_SCRATCH = 24 * MiB
# Delayed-scaling bookkeeping per FP8 GEMM of a TE module: five FP32 slots (scale, scale_inv and
# amax of input, weight and output-gradient metas; TE 2.20 quantization.py) with an amax history.
FP8_META_SLOTS_PER_GEMM = 5
FP8_GEMMS_PER_LAYER = 4  # QKV, attention output, FC1, FC2
# Float8BlockScaling (TE 2.20 tensor/float8_blockwise_tensor.py): activations and gradients are
# scaled per 1 x 128 block with one FP32 scale, 4/128 bytes per element on top of the FP8 byte.
BLOCK_SCALE_BYTES_PER_ELEMENT = 4 / 128
# What complete steps under Float8BlockScaling hold beyond the modelled FP8 copies and scales, per
# element of a saved GEMM input: fitted on the tune matrix only (tools/memory_check.py; 0.611 and
# 0.605 B for its two block-scaling configurations, peaks measured on an H200 with TE 2.20.2).
# Which tensor it is was not isolated; the held-out matrix checks the fit.
BLOCK_SCALING_UNEXPLAINED_BYTES_PER_ELEMENT = 0.61
# FP32 mean and rstd per token of a LayerNorm (rstd alone for RMSNorm): PyTorch's and TE's norms.
NORM_STATS_BYTES = {"LayerNorm": 8, "RMSNorm": 4}
# FusedAdam.initialize_state (TE 2.20 optimizers/fused_adam.py) builds each master weight from a
# dequantized (2 bytes) or cloned parameter, then an FP32 copy (4): 6 bytes/parameter of one
# parameter at a time, while the previous parameters' states already exist.
MASTER_INIT_BYTES_PER_PARAMETER = 6


# Saved tensors each TE module frees when its backward ends, in the order the backward reaches
# the modules (TE frees a module's saved tensors together).
MODULE_SAVED = {
    "mlp": (
        Saved.MLP_NORM_INPUT,
        Saved.FC1_INPUT,
        Saved.FC1_OUTPUT,
        Saved.FC2_INPUT,
        Saved.MLP_DROPOUT_MASK,
    ),
    "proj": (Saved.PROJ_INPUT_FP8, Saved.ATTN_DROPOUT_MASK),
    "attention": (Saved.QKV, Saved.ATTN_OUTPUT, Saved.SCORES),
    "qkv": (Saved.ATTN_NORM_INPUT, Saved.QKV_INPUT, Saved.QKV_INPUT_FP8_ROWWISE),
}
# Weight gradients each module writes while its largest transient is alive, and those written
# after it (keys of fp8lab.flops.layer_parameters).
MODULE_PARAMS = {
    "mlp": ("mlp norm", "fc2"),
    "proj": ("attention output",),
    "attention": (),
    "qkv": ("attention norm", "qkv"),
}
MODULE_PARAMS_AFTER = {"mlp": ("fc1",), "proj": (), "attention": (), "qkv": ()}


@dataclass(frozen=True)
class Weights:
    """A parameter layout: what each parameter costs and which optimizer keeps its state.

    Bytes are per parameter; ``state_bytes`` is per optimizer moment (AdamW keeps two, SGD one).
    ``fp8_params``: the layers' GEMM weights are FP8 (data, and on Hopper its transpose), the
    other parameters stay in ``param_bytes``. ``autocast``: FP32 parameters computed in BF16
    under ``torch.autocast(dtype=torch.bfloat16)``, which (with TE) casts BF16 copies of the
    weights for the forward and keeps them for the backward.
    ``optimizer``: ``"torch"`` (``torch.optim.AdamW``/``SGD``) or ``"te-fused"``
    (``transformer_engine.pytorch.optimizers.FusedAdam(master_weights=True)``).
    """

    name: str
    param_bytes: float
    grad_bytes: float
    master_bytes: float
    state_bytes: float
    optimizer: str
    autocast: bool = False
    fp8_params: bool = False
    description: str = ""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"name={self.name!r}: must be a non-empty string")
        for name in ("param_bytes", "grad_bytes", "state_bytes"):
            checks.number(name, getattr(self, name), positive=True)
        checks.number("master_bytes", self.master_bytes, non_negative=True)
        checks.choice("optimizer", self.optimizer, ("torch", "te-fused"))
        checks.flag("autocast", self.autocast)
        checks.flag("fp8_params", self.fp8_params)
        if not isinstance(self.description, str):
            raise TypeError(f"description={self.description!r}: must be a string")


WEIGHTS: dict[str, Weights] = {
    # torch.optim.AdamW creates its moments with zeros_like(param): BF16 here (adam.py _init_group)
    "bf16": Weights(
        "bf16",
        2,
        2,
        0,
        2,
        "torch",
        description="pure BF16: BF16 parameters, gradients and "
        "AdamW moments, no master weights (torch.optim.AdamW)",
    ),
    "fp32-autocast": Weights(
        "fp32-autocast",
        4,
        4,
        0,
        4,
        "torch",
        autocast=True,
        description="FP32 parameters, "
        "gradients and AdamW moments; the forward under torch.autocast(bfloat16)",
    ),
    # FusedAdam(master_weights=True): FP32 master, exp_avg and exp_avg_sq (fused_adam.py defaults)
    "bf16-master": Weights(
        "bf16-master",
        2,
        2,
        4,
        4,
        "te-fused",
        description="BF16 parameters and gradients, FP32 "
        "master weights and moments (Megatron-style; TE FusedAdam(master_weights=True))",
    ),
    "fp8-master": Weights(
        "fp8-master",
        2,
        2,
        4,
        4,
        "te-fused",
        fp8_params=True,
        description="FP8 GEMM weights "
        "(te.quantized_model_init), BF16 gradients, FP32 master weights and moments (FusedAdam)",
    ),
    "fp32": Weights(
        "fp32", 4, 4, 0, 4, "torch", description="FP32 parameters and compute, no autocast"
    ),
}
# What the short ``precision`` names mean when no ``weights`` layout is given.
_DEFAULT_WEIGHTS = {
    "fp32": "fp32",
    "bf16": "bf16-master",
    "fp8-delayed": "bf16-master",
    "fp8-current": "bf16-master",
    "fp8-block": "bf16-master",
    "fp8-weights": "fp8-master",
}


def resolve_precision(precision: str, weights: str | None = None) -> tuple[Weights, str]:
    """The parameter layout and the compute precision that ``precision`` (and ``weights``) name.

    ``resolve_precision("fp8-weights")`` is ``(WEIGHTS["fp8-master"], "fp8-delayed")``;
    ``resolve_precision("bf16", "bf16")`` is pure BF16 in BF16.
    """
    checks.choice("precision", precision, PRECISIONS)
    if weights is None:
        weights = _DEFAULT_WEIGHTS[precision]
    checks.choice("weights", weights, tuple(WEIGHTS))
    compute = "fp8-delayed" if precision == "fp8-weights" else precision
    if precision == "fp8-weights" and weights != "fp8-master":
        raise ValueError(f"precision='fp8-weights' means weights='fp8-master', not {weights!r}")
    if (compute == "fp32") != (weights == "fp32"):
        raise ValueError(
            f"precision={precision!r} with weights={weights!r}: FP32 compute goes with "
            "weights='fp32' only (use 'fp32-autocast' for FP32 parameters in BF16)"
        )
    if weights == "fp8-master" and not compute.startswith("fp8"):
        raise ValueError(
            f"weights='fp8-master' needs an FP8 precision, not precision={precision!r}"
        )
    return WEIGHTS[weights], compute


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


@dataclass(frozen=True)
class Layout:
    """How the job is split: tensor-parallel size, sequence parallel, data-parallel ranks and ZeRO
    stage."""

    tp: int = 1
    sequence_parallel: bool = False
    dp: int = 1
    zero_stage: int = 0

    def __post_init__(self):
        checks.integer("tp", self.tp)
        checks.integer("dp", self.dp)
        checks.flag("sequence_parallel", self.sequence_parallel)
        if isinstance(self.zero_stage, bool) or self.zero_stage not in ZERO_STAGES:
            raise ValueError(
                f"zero_stage={self.zero_stage!r}: must be one of {ZERO_STAGES} "
                "(FSDP full sharding = 3)"
            )
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel=True needs tp > 1")


# --- training state ------------------------------------------------------------------------------


def _moments(optimizer: str) -> int:
    return {"adamw": 2, "sgd": 1, "none": 0}[optimizer]


def bytes_per_parameter(
    precision: str,
    optimizer: str = "adamw",
    fp32_grads: bool = False,
    hopper: bool = True,
    *,
    weights: str | None = None,
) -> dict[str, float]:
    """Bytes per parameter of the training state, by part (before any sharding).

    For the GEMM weights of the layers (FP8 ones under ``weights="fp8-master"``: 1 byte, plus
    its transpose on Hopper). ``bytes_per_parameter("bf16")`` sums to the classic 16.
    """
    layout, _ = resolve_precision(precision, weights)
    checks.choice("optimizer", optimizer, OPTIMIZERS)
    checks.flag("fp32_grads", fp32_grads)
    checks.flag("hopper", hopper)
    stored = (2 if hopper else 1) if layout.fp8_params else layout.param_bytes
    return {
        Part.PARAMETERS: stored,
        Part.GRADIENTS: 4 if fp32_grads else layout.grad_bytes,
        Part.MASTER_WEIGHTS: layout.master_bytes if optimizer != "none" else 0,
        Part.OPTIMIZER_STATES: _moments(optimizer) * layout.state_bytes,
    }


def zero_training_state(
    n_params: float,
    dp: int,
    stage: int,
    k: float = 12,
    weight_bytes: float = 2,
    grad_bytes: float = 2,
) -> float:
    """Rajbhandari et al. 2020, sec. 5.1: bytes per GPU of parameters, gradients and K bytes/param
    of optimizer state (K = 12 for mixed-precision Adam) under ZeRO stage 0-3 over ``dp`` ranks."""
    n_params = checks.number("n_params", n_params, positive=True)
    checks.integer("dp", dp)
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"stage={stage!r}: must be one of {ZERO_STAGES}")
    k = checks.number("k", k, non_negative=True)
    weight_bytes = checks.number("weight_bytes", weight_bytes, positive=True)
    grad_bytes = checks.number("grad_bytes", grad_bytes, positive=True)
    p, g, o = weight_bytes * n_params, grad_bytes * n_params, k * n_params
    return {0: p + g + o, 1: p + g + o / dp, 2: p + (g + o) / dp, 3: (p + g + o) / dp}[stage]


# --- activations ---------------------------------------------------------------------------------


def korthikanti_activations(
    cfg: TransformerConfig,
    batch: int,
    seq: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> float:
    """Korthikanti et al. 2022, table 2: activation bytes of one layer (16-bit, unfused attention).

    none: ``sbh(10 + 24/t + 5as/(ht))``; sequence parallel: ``sbh/t (34 + 5as/h)``;
    selective: drops the ``5as/h`` term; full: ``2sbh`` (``2sbh/t`` with sequence parallel).
    """
    require_config(cfg)
    checks.integer("batch", batch)
    checks.integer("seq", seq)
    checks.integer("tp", tp)
    checks.flag("sequence_parallel", sequence_parallel)
    checks.choice("recompute", recompute, RECOMPUTE)
    s, b, h, a = seq, batch, cfg.hidden_size, cfg.num_attention_heads
    if recompute == "full":
        return 2 * s * b * h / (tp if sequence_parallel else 1)
    quadratic = 0 if recompute == "selective" else 5 * a * s / h
    if sequence_parallel:
        return s * b * h / tp * (34 + quadratic)
    return s * b * h * (10 + 24 / tp + quadratic / tp)


def _saved_per_layer(
    cfg: TransformerConfig,
    tokens: int,
    seq: int,
    compute: str,
    hidden_dropout: float,
    flash_attention: bool,
    recompute: str,
    tp: int,
    sp: bool,
) -> dict[str, float]:
    """Bytes each layer saves for its backward, for every name of :class:`Saved` (0 where absent).

    TE's modules save FP8 copies of their GEMM inputs under FP8 (only the column-wise copy the
    weight gradient needs, module/linear.py), the BF16 tensors otherwise. Under selective
    recompute (``checkpoint_core_attention``) the attention keeps its inputs and recomputes its
    output and softmax statistics; the output projection still saves its input.
    """
    h, f = cfg.hidden_size, cfg.ffn_hidden_size
    element = 4 if compute == "fp32" else 2
    fp8 = compute.startswith("fp8")
    block = BLOCK_SCALE_BYTES_PER_ELEMENT + BLOCK_SCALING_UNEXPLAINED_BYTES_PER_ELEMENT
    fp8_byte = 1 + (block if compute == "fp8-block" else 0)
    rep = tp if sp else 1  # replicated parts are split only by sequence parallelism
    gemm_input = fp8_byte if fp8 else element
    stats = NORM_STATS_BYTES[cfg.normalization] * tokens / rep
    mask = tokens * h / rep if hidden_dropout > 0 else 0.0  # one byte per element
    softmax_stats = 4 * tokens * cfg.num_attention_heads / tp  # FP32 log-sum-exp per row
    attention_output = element * tokens * cfg.q_size / tp
    if recompute == "selective":  # recomputed; the BF16 output projection saves it anyway
        attention_output = 0.0 if fp8 else attention_output
        softmax_stats = 0.0
    scores = 0.0 if flash_attention or recompute == "selective" else 5 * cfg.num_attention_heads
    return {
        Saved.ATTN_NORM_INPUT: element * tokens * h / rep + stats,
        Saved.QKV_INPUT: gemm_input * tokens * h / rep,
        Saved.QKV_INPUT_FP8_ROWWISE: tokens * h / rep if fp8 else 0.0,
        Saved.QKV: element * tokens * cfg.qkv_size / tp,
        Saved.ATTN_OUTPUT: attention_output + softmax_stats,
        Saved.ATTN_DROPOUT_MASK: mask,
        Saved.PROJ_INPUT_FP8: fp8_byte * tokens * cfg.q_size / tp if fp8 else 0.0,
        Saved.SCORES: scores * seq * tokens / tp,
        Saved.MLP_NORM_INPUT: element * tokens * h / rep + stats,
        Saved.FC1_INPUT: gemm_input * tokens * h / rep,
        Saved.FC1_OUTPUT: element * tokens * cfg.fc1_out / tp,
        Saved.FC2_INPUT: gemm_input * tokens * f / tp,
        Saved.MLP_DROPOUT_MASK: mask,
    }


def backward_transients(
    cfg: TransformerConfig, tokens: int, element: int, fp8: bool, tp: int
) -> dict[str, float]:
    """Bytes a layer's backward allocates for a moment, module by module (TE 2.20 on Hopper).

    The MLP's is the largest: the gradient of the activation output and, under FP8, row- and
    column-wise FP8 copies of the gradient entering FC1 (a gated activation also materialises
    that gradient in 16 bits first); FC2's weight gradient exists then, FC1's comes after
    (:data:`MODULE_PARAMS`). These terms follow TE's kernels; their sizes were checked against
    measured peaks of stacks of ``te.TransformerLayer`` on an H200.
    """
    require_config(cfg)
    checks.integer("tokens", tokens)
    checks.integer("element", element)
    checks.flag("fp8", fp8)
    checks.integer("tp", tp)
    h, f, fc1 = cfg.hidden_size, cfg.ffn_hidden_size / tp, cfg.fc1_out / tp
    qkv = cfg.qkv_size / tp
    gated = cfg.activation == "swiglu"
    if fp8:
        mlp = element * tokens * f + (element * tokens * fc1 if gated else 0) + 2 * tokens * fc1
    else:
        mlp = element * tokens * fc1 + element * tokens * h
    quant = 2 if fp8 else 0  # row- and column-wise FP8 copies of a gradient
    return {
        "mlp": mlp,
        "proj": element * tokens * h + quant * tokens * h,
        "attention": element * tokens * h + element * tokens * qkv,
        "qkv": element * tokens * qkv + quant * tokens * qkv + element * tokens * h,
    }


# --- the estimate --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryEstimate:
    """The parts (a tree, each part at its largest), the predicted peak, and where it happens.

    ``phases``: the peak of each phase (``"build"``, ``"forward"``, ``"backward"``,
    ``"optimizer step"``); ``peak_event``: the moment of the peak; ``at_peak``: what is live
    then, by part; ``timeline``: ``(event, live bytes)`` through the simulated steps;
    ``runtime``: one-off memory beside the peak (cuBLAS workspace, CUDA context).
    """

    tree: MemoryNode
    peak_bytes: float
    runtime: MemoryNode
    phases: dict = field(default_factory=dict)
    peak_event: str = ""
    at_peak: dict = field(default_factory=dict)
    timeline: tuple = ()

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


class _Timeline:
    """Live bytes by part through a simulated step; remembers the largest total and its moment."""

    def __init__(self):
        self.live: dict[str, float] = {}
        self.events: list[tuple[str, float]] = []
        self.phases: dict[str, float] = {}
        self.peak, self.peak_event, self.at_peak = 0.0, "", {}

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
        if total > self.peak:
            self.peak, self.peak_event = total, f"{phase}: {event}"
            self.at_peak = {k: v for k, v in self.live.items() if v > 0}
            if transient:
                self.at_peak[part] = self.at_peak.get(part, 0.0) + transient


@dataclass(frozen=True)
class _Plan:
    """Every size the simulated step needs, in bytes on one GPU (computed once by estimate)."""

    cfg: TransformerConfig
    weights: Weights
    compute: str
    autocast: bool  # torch.autocast(dtype=torch.bfloat16) around the forward
    optimizer: str
    recompute: str
    include_optimizer: bool
    accumulation: int
    tokens: int  # tokens of one micro-batch (B * S)
    element: int  # bytes of one activation element
    tp: int
    rep: int  # what divides the tensors tensor parallelism replicates (tp under SP, else 1)
    parameters: float  # stored weights
    master: float
    states: float
    grad_per_param: float
    layer_params: dict  # one layer's parameters on this GPU, by part
    outer_params: dict  # embeddings, positions, final norm, head on this GPU (head: untied only)
    scaling_state: float
    copy_per_param: float  # FP8 or BF16 weight copies saved for the backward, per GEMM parameter
    copies_kept: bool  # False under ZeRO-3/FSDP2: TE re-casts each layer's copy in its backward
    wgrad_cast_per_param: float  # BF16 weight gradient before its cast to FP32 parameters
    saved: dict  # one layer's saved tensors, by Saved name
    layer_input: float  # one layer's input (a checkpoint under full recompute)
    optimizer_temporary: float
    state_init_transient: float


@dataclass(frozen=True)
class _Outer:
    """Bytes of the model around the layers, for one micro-batch (see :func:`_outer`)."""

    head_inputs: float  # saved by the final norm and the LM head
    held_logits: float  # the logits, held by the training loop until backward returns
    log_probs: float  # saved by cross-entropy
    loss_forward: float  # lm_loss's FP32 copies of the logits, a moment
    loss_backward: float  # cross-entropy's two logit gradients, a moment
    head_backward: float  # the logits' gradient on its way through the head, a moment
    head_copy: float  # autocast's cached BF16 copy of the head's weight
    embedding_forward: float  # embedding output (and the sum with positions), a moment
    incoming: float  # the gradient flowing into the last layer


def _outer(plan: _Plan) -> _Outer:
    """Bytes of the model around the layers (``fp8lab.models.GPT``), from PyTorch's semantics.

    * embedding output and, with learned positions, the sum: the transient of the forward's start;
    * the final norm saves its input (an FP32 copy of it under autocast, which runs LayerNorm
      in FP32 on CUDA) and its statistics; the LM head saves its input (BF16 under autocast),
      and with FP32 parameters autocast's cached BF16 copy of its weight;
    * the logits [S, B, V] stay alive while the caller holds them; ``lm_loss`` upcasts them to
      FP32 (``.float()``) and flattens B and S of the transposed view, which copies once more;
      ``log_softmax`` saves its output (FP32); its backward holds two dense logit gradients
      (NLL's and log-softmax's) beside it; then the gradient goes back to the logits' dtype;
    * a tied head's weight is the embedding's: one gradient, accumulated.
    """
    cfg, weights = plan.cfg, plan.weights
    h, element, tp = cfg.hidden_size, plan.element, plan.tp
    tokens = plan.tokens / plan.rep  # sequence parallelism splits the [S, B, H] tensors
    if cfg.vocab_size is None:  # a bare stack of layers: its output, and the gradient handed in
        stack = plan.layer_input
        return _Outer(0.0, stack, 0.0, 0.0, stack, 0.0, 0.0, 0.0, stack)
    logits = plan.tokens * cfg.vocab_size / tp  # vocabulary-parallel under tensor parallelism
    logit_bytes = 4 if plan.compute == "fp32" else 2
    upcast = 4  # lm_loss computes cross-entropy in FP32
    fp32_copy = 0 if logit_bytes == upcast else upcast  # .float() of FP32 logits copies nothing
    if cfg.normalization == "LayerNorm":  # on CUDA autocast's FP32 list: an FP32 copy is saved
        norm_input = 4 if plan.autocast else element
    else:  # rms_norm is on no autocast list: the fused kernel saves the input as it comes, the
        # composite path (FP32 weights, BF16 input) an FP32 upcast and the BF16 normalized input
        norm_input = 4 + 2 if plan.autocast and weights.param_bytes == 4 else element
    head_input = 2 if plan.autocast else element
    cast_head = plan.autocast and weights.param_bytes == 4  # FP32 weights: a BF16 copy
    stats = NORM_STATS_BYTES[cfg.normalization]
    head_weight = cfg.vocab_size * h / tp
    positions = 2 if cfg.position_embedding == "learned" else 1
    return _Outer(
        head_inputs=tokens * ((norm_input + head_input) * h + stats),
        held_logits=logit_bytes * logits,
        log_probs=upcast * logits,
        loss_forward=(fp32_copy + upcast) * logits,  # the FP32 copy, then the flattened copy
        loss_backward=2 * upcast * logits,
        # after log-softmax's backward: the FP32 gradient beside its cast to the logits' dtype
        # (under autocast the head's BF16 weight gradient is cast to FP32 later: a moment)
        head_backward=(upcast + logit_bytes) * logits + (2 * head_weight if cast_head else 0.0),
        head_copy=2 * head_weight if cast_head else 0.0,
        embedding_forward=positions * weights.param_bytes * tokens * h,
        incoming=element * tokens * h,
    )


def _layer_walk(plan: _Plan, tl: _Timeline, phase: str, grads_full: bool) -> None:
    """The backward through the layers, last first, module by module."""
    cfg, layers, grad = plan.cfg, plan.cfg.num_layers, plan.grad_per_param
    transients = backward_transients(
        cfg, max(1, round(plan.tokens)), plan.element, plan.compute.startswith("fp8"), plan.tp
    )
    if plan.recompute == "selective":  # the attention output and statistics come back
        transients["attention"] += plan.element * plan.tokens * cfg.q_size / plan.tp
    saved_layer = sum(plan.saved.values())
    gemm = {
        name: sum(
            plan.layer_params[p] for p in params + MODULE_PARAMS_AFTER[name] if "norm" not in p
        )
        for name, params in MODULE_PARAMS.items()
    }
    copies_part = Part.FP8_WEIGHT_COPIES if plan.compute.startswith("fp8") else Part.AUTOCAST_COPIES
    full = plan.recompute == "full"
    for index in range(layers, 0, -1):
        if full:  # the recomputed forward brings this layer's saved tensors back
            tl.add(Part.ACTIVATIONS, saved_layer)
        if full or not plan.copies_kept:  # and its weight copies
            tl.add(copies_part, plan.copy_per_param * sum(gemm.values()))
        for module in ("mlp", "proj", "attention", "qkv"):
            new_grads = grad * sum(plan.layer_params[p] for p in MODULE_PARAMS[module])
            after = grad * sum(plan.layer_params[p] for p in MODULE_PARAMS_AFTER[module])
            cast = plan.wgrad_cast_per_param * gemm[module]
            if grads_full:  # accumulation: each new gradient is added into the existing one
                transient = transients[module] + new_grads + after + cast
            else:
                tl.add(Part.GRADIENTS, new_grads)
                transient = transients[module] + cast
            tl.point(phase, f"layer {index} {module} backward", transient + BACKWARD_SCRATCH)
            tl.add(Part.ACTIVATIONS, -sum(plan.saved[name] for name in MODULE_SAVED[module]))
            tl.add(copies_part, -plan.copy_per_param * gemm[module])
            if not grads_full:
                tl.add(Part.GRADIENTS, after)
        if full:
            tl.add(Part.ACTIVATIONS, -plan.layer_input)
    tl.point(phase, "input gradient of the first layer", plan.layer_input)


def _micro_step(plan: _Plan, tl: _Timeline, step: int, micro: int) -> None:
    """Forward, loss and backward of one micro-batch."""
    cfg, layers = plan.cfg, plan.cfg.num_layers
    outer = _outer(plan)
    grads_full = micro > 1  # gradients of earlier micro-batches persist
    name = f"step {step}" + (f", micro-batch {micro}" if plan.accumulation > 1 else "")
    fwd, bwd = f"{name}, forward", f"{name}, backward"
    gemm_per_layer = sum(v for k, v in plan.layer_params.items() if "norm" not in k)
    copies_part = Part.FP8_WEIGHT_COPIES if plan.compute.startswith("fp8") else Part.AUTOCAST_COPIES
    saved_layer = sum(plan.saved.values())
    tl.point(fwd, "embeddings", outer.embedding_forward)
    if plan.recompute == "full":  # te.checkpoint keeps each layer's input, runs it without saving
        tl.add(Part.ACTIVATIONS, plan.layer_input * layers)
        one_layer = saved_layer + plan.copy_per_param * gemm_per_layer
        tl.point(fwd, f"layer {layers} (not saved)", one_layer)
    else:
        tl.add(Part.ACTIVATIONS, saved_layer * layers)
        if plan.copies_kept:
            tl.add(copies_part, plan.copy_per_param * gemm_per_layer * layers)
    tl.add(Part.ACTIVATIONS, outer.head_inputs)
    tl.add(copies_part, outer.head_copy)
    previous = tl.live.get(Part.LOGITS, 0.0)  # the last micro-batch's, until replaced
    tl.add(Part.LOGITS, outer.held_logits)
    tl.point(fwd, "logits")
    tl.add(Part.LOGITS, -previous)
    tl.point(fwd, "loss (FP32 logits)", outer.loss_forward, Part.LOGITS)
    tl.add(Part.LOGITS, outer.log_probs)
    tl.point(fwd, "end")
    # backward: cross-entropy, the head, the final norm, then the layers
    tl.point(bwd, "cross-entropy (two logit gradients)", outer.loss_backward, Part.LOGITS)
    tl.add(Part.LOGITS, -outer.log_probs)
    outer_grads = plan.grad_per_param * (plan.outer_params["head"] + plan.outer_params["norm"])
    head_grad = plan.grad_per_param * (
        plan.outer_params["embedding"] if cfg.tied_embeddings else plan.outer_params["head"]
    )
    if cfg.vocab_size is not None:
        if not grads_full:
            tl.add(Part.GRADIENTS, outer_grads + (head_grad if cfg.tied_embeddings else 0))
        tl.point(bwd, "LM head", outer.head_backward, Part.LOGITS)
        tl.add(copies_part, -outer.head_copy)
        tl.add(Part.ACTIVATIONS, -outer.head_inputs)
    tl.add(Part.TEMPORARIES, outer.incoming)  # the gradient flowing into the layers
    _layer_walk(plan, tl, bwd, grads_full)
    embedding = plan.grad_per_param * (
        plan.outer_params["embedding"] + plan.outer_params["positions"]
    )
    if cfg.vocab_size is not None:  # a dense gradient of the whole table, then accumulated
        if not grads_full and not cfg.tied_embeddings:
            tl.add(Part.GRADIENTS, embedding)
            tl.point(bwd, "embeddings")
        else:
            if not grads_full:
                tl.add(Part.GRADIENTS, embedding - head_grad)
            tl.point(bwd, "embeddings (gradient accumulated)", embedding)
    tl.set(Part.TEMPORARIES, 0.0)
    tl.set(Part.LOGITS, outer.held_logits)  # the step's loop still holds them
    tl.set(Part.ACTIVATIONS, 0.0)
    tl.set(copies_part, 0.0)


def _optimizer_step(plan: _Plan, tl: _Timeline, step: int) -> None:
    phase = f"step {step}, optimizer step"
    if step == 1:  # states (and master weights) are created by the first step
        tl.set(Part.OPTIMIZER_STATES, plan.states)
        tl.set(Part.MASTER_WEIGHTS, plan.master)
        tl.point(phase, "states created", plan.state_init_transient)
    tl.point(phase, "update", plan.optimizer_temporary)


def _optimizer_temporaries(
    weights: Weights,
    compute: str,
    optimizer: str,
    impl: str,
    n_local: float,
    largest: float,
    fp8_gemm_params: float,
) -> tuple[float, float]:
    """(update temporary, state-creation temporary) in bytes.

    torch's AdamW (torch/optim/adam.py), measured with PyTorch's profiler on a CPU: the foreach
    implementation allocates ``exp_avg_sq_sqrt``, one moment-sized list, for every parameter at
    once; the for-loop one, two temporaries of a parameter while the previous parameter's
    denominator is still bound (at most three of the largest); the fused kernel, nothing. TE's
    FusedAdam updates in place, but casts the gradients of FP8 weights outside delayed scaling
    to FP32 first, all at once (fused_adam.py), and creates master weights one parameter at a
    time through a dequantized or cloned copy.
    """
    if optimizer == "none":
        return 0.0, 0.0
    if weights.optimizer == "te-fused":
        cast = 4 * fp8_gemm_params if weights.fp8_params and compute != "fp8-delayed" else 0.0
        return (cast if optimizer == "adamw" else 0.0), MASTER_INIT_BYTES_PER_PARAMETER * largest
    if optimizer == "sgd":
        return 0.0, 0.0
    per_moment = weights.state_bytes
    temporary = {
        "foreach": per_moment * n_local,
        "fused": 0.0,
        "for-loop": 3 * per_moment * largest,
    }
    return temporary[impl], 0.0


def estimate(
    cfg: TransformerConfig,
    batch: int,
    seq: int,
    *,
    precision: str = "bf16",
    weights: str | None = None,
    optimizer: str = "adamw",
    adamw_impl: str = "foreach",
    recompute: str = "none",
    layout: Layout | None = None,
    accumulation: int = 1,
    bf16_autocast: bool | None = None,
    fp32_grads: bool = False,
    hidden_dropout: float = 0.1,
    flash_attention: bool = True,
    hopper: bool = True,
    amax_history_len: int = 1024,
    include_optimizer: bool = True,
) -> MemoryEstimate:
    """The memory of training ``cfg`` at micro-batch ``batch`` and sequence ``seq``.

    ``precision``: the layers' compute (:data:`COMPUTE`, or ``"fp8-weights"``); ``weights``: the
    parameter layout (a key of :data:`WEIGHTS`; by default BF16 parameters with FP32 master
    weights, or FP8 ones for ``"fp8-weights"``, see :func:`resolve_precision`); ``optimizer``
    and, for ``torch.optim.AdamW``, ``adamw_impl``; ``recompute`` through ``te.checkpoint``
    (``"selective"``: ``checkpoint_core_attention``); ``accumulation`` micro-batches per step;
    ``bf16_autocast``: ``torch.autocast`` around the forward (``None``: as ``train_step`` on a
    GPU, on unless the compute is FP32).

    ``peak_bytes`` predicts the rise of ``torch.cuda.max_memory_allocated`` over building the
    model and two training steps (``include_optimizer=False``: one forward and backward, no
    optimizer state); ``runtime`` holds one-off memory beside it.
    """
    require_config(cfg)
    checks.integer("batch", batch)
    checks.integer("seq", seq)
    layout_weights, compute = resolve_precision(precision, weights)
    checks.choice("optimizer", optimizer, OPTIMIZERS)
    checks.choice("adamw_impl", adamw_impl, ADAMW_IMPLS)
    checks.choice("recompute", recompute, RECOMPUTE)
    layout = Layout() if layout is None else layout
    if not isinstance(layout, Layout):
        raise TypeError(f"layout must be a memory.Layout, not {type(layout).__name__}")
    checks.integer("accumulation", accumulation)
    autocast = compute != "fp32" if bf16_autocast is None else bf16_autocast
    checks.flag("bf16_autocast", autocast)
    if autocast != layout_weights.autocast and (layout_weights.autocast or compute == "fp32"):
        raise ValueError(
            f"bf16_autocast={bf16_autocast}: weights={layout_weights.name!r} with "
            f"precision={precision!r} runs {'with' if layout_weights.autocast else 'without'} "
            "torch.autocast"
        )
    checks.flag("fp32_grads", fp32_grads)
    checks.probability("hidden_dropout", hidden_dropout)
    checks.flag("flash_attention", flash_attention)
    checks.flag("hopper", hopper)
    checks.integer("amax_history_len", amax_history_len)
    checks.flag("include_optimizer", include_optimizer)
    if cfg.hidden_size % layout.tp or cfg.ffn_hidden_size % layout.tp or cfg.groups % layout.tp:
        raise ValueError(
            f"tp={layout.tp} must divide hidden_size, ffn_hidden_size and num_gqa_groups"
        )
    if layout.sequence_parallel and seq % layout.tp:
        raise ValueError(f"sequence parallelism needs tp={layout.tp} to divide seq={seq}")

    fp8 = compute.startswith("fp8")
    tp, dp, stage = layout.tp, layout.dp, layout.zero_stage
    sp = layout.sequence_parallel
    element = 4 if compute == "fp32" else 2
    optimizer_used = optimizer if include_optimizer else "none"
    per_param = bytes_per_parameter(
        compute, optimizer_used, fp32_grads, hopper, weights=layout_weights.name
    )
    layer_params = {k: v / tp for k, v in layer_parameters(cfg).items()}
    gemm_per_layer = sum(v for k, v in layer_params.items() if "norm" not in k)
    h = cfg.hidden_size
    vocab = cfg.vocab_size or 0
    outer_params = {
        "embedding": vocab * h / tp,
        "positions": cfg.max_seq_len * h if vocab and cfg.position_embedding == "learned" else 0,
        "norm": (2 * h if cfg.normalization == "LayerNorm" else h) if vocab else 0,
        "head": 0 if cfg.tied_embeddings or not vocab else vocab * h / tp,
    }
    n_local = cfg.num_layers * sum(layer_params.values()) + sum(outer_params.values())
    fp8_gemm = cfg.num_layers * gemm_per_layer if layout_weights.fp8_params else 0.0
    shard = {
        Part.PARAMETERS: dp if stage >= 3 else 1,
        Part.GRADIENTS: dp if stage >= 2 else 1,
        Part.MASTER_WEIGHTS: dp if stage >= 1 else 1,
        Part.OPTIMIZER_STATES: dp if stage >= 1 else 1,
    }
    stored = (
        fp8_gemm * per_param[Part.PARAMETERS] + (n_local - fp8_gemm) * layout_weights.param_bytes
    )
    parameters = stored / shard[Part.PARAMETERS]
    master = per_param[Part.MASTER_WEIGHTS] * n_local / shard[Part.MASTER_WEIGHTS]
    states = per_param[Part.OPTIMIZER_STATES] * n_local / shard[Part.OPTIMIZER_STATES]
    grad_per_param = per_param[Part.GRADIENTS] / shard[Part.GRADIENTS]

    scaling_state = 0.0
    if fp8:
        history = amax_history_len + 2 if compute == "fp8-delayed" else 3
        scaling_state = cfg.num_layers * FP8_GEMMS_PER_LAYER * FP8_META_SLOTS_PER_GEMM * 4 * history
    if fp8 and not layout_weights.fp8_params:  # TE quantizes each BF16/FP32 weight per forward
        copy_per_param = 2 if hopper else 1
    elif layout_weights.autocast and not fp8:  # TE casts FP32 weights to BF16 per forward
        copy_per_param = 2
    else:
        copy_per_param = 0
    saved = _saved_per_layer(
        cfg, batch * seq, seq, compute, hidden_dropout, flash_attention, recompute, tp, sp
    )
    layer_input = element * batch * seq * h / (tp if sp else 1)
    largest = max([*layer_params.values(), *outer_params.values()])
    update_temp, init_temp = _optimizer_temporaries(
        layout_weights, compute, optimizer_used, adamw_impl, n_local, largest, fp8_gemm
    )
    plan = _Plan(
        cfg=cfg,
        weights=layout_weights,
        compute=compute,
        autocast=autocast,
        optimizer=optimizer_used,
        recompute=recompute,
        include_optimizer=include_optimizer,
        accumulation=accumulation,
        tokens=batch * seq,
        element=element,
        tp=tp,
        rep=tp if sp else 1,
        parameters=parameters,
        master=master,
        states=states,
        grad_per_param=grad_per_param,
        layer_params=layer_params,
        outer_params=outer_params,
        scaling_state=scaling_state,
        copy_per_param=copy_per_param,
        copies_kept=stage < 3,
        wgrad_cast_per_param=2.0 if layout_weights.param_bytes == 4 and compute != "fp32" else 0.0,
        saved=saved,
        layer_input=layer_input,
        optimizer_temporary=update_temp,
        state_init_transient=init_temp,
    )
    tl = _simulate(plan)
    tree = _tree(plan, batch, seq, per_param, hopper)
    runtime = MemoryNode("runtime (once per process)")
    if compute != "fp32":
        runtime.add(
            Part.CUBLAS_WORKSPACE, CUBLAS_WORKSPACE_HOPPER if hopper else CUBLAS_WORKSPACE_OLDER
        )
    runtime.add(Part.CUDA_CONTEXT, CUDA_CONTEXT)
    return MemoryEstimate(
        tree=tree,
        peak_bytes=tl.peak,
        runtime=runtime,
        phases=dict(tl.phases),
        peak_event=tl.peak_event,
        at_peak=dict(tl.at_peak),
        timeline=tuple(tl.events),
    )


def _simulate(plan: _Plan) -> _Timeline:
    """Build the model, then two training steps (one forward and backward without optimizer)."""
    tl = _Timeline()
    tl.set(Part.PARAMETERS, plan.parameters)
    tl.set(Part.SCALING_STATE, plan.scaling_state)
    tl.point("build", "model built")
    steps = 2 if plan.include_optimizer else 1
    for step in range(1, steps + 1):
        for micro in range(1, plan.accumulation + 1):
            _micro_step(plan, tl, step, micro)
        if plan.include_optimizer and plan.optimizer != "none":
            _optimizer_step(plan, tl, step)
        tl.set(Part.GRADIENTS, 0.0)
        tl.set(Part.LOGITS, 0.0)  # train_step returns
    return tl


def _tree(plan: _Plan, batch: int, seq: int, per_param: dict, hopper: bool) -> MemoryNode:
    """Every part at its largest (the peak is less than their sum: not all live at once)."""
    cfg, layers = plan.cfg, plan.cfg.num_layers
    tree = MemoryNode(
        f"{cfg.name}: B={batch}, S={seq}, {plan.weights.name} weights, {plan.compute}, "
        f"recompute={plan.recompute}"
    )
    state = tree.add(Part.TRAINING_STATE)
    grads = plan.grad_per_param * sum(
        [layers * sum(plan.layer_params.values()), *plan.outer_params.values()]
    )
    for part, size in (
        (Part.PARAMETERS, plan.parameters),
        (Part.GRADIENTS, grads),
        (Part.MASTER_WEIGHTS, plan.master),
        (Part.OPTIMIZER_STATES, plan.states),
    ):
        if size:
            state.add(part, size, f"{per_param[part]:g} B/param")
    kept = layers if plan.copies_kept and plan.recompute != "full" else 1
    gemm = kept * sum(v for k, v in plan.layer_params.items() if "norm" not in k)
    copies_note = "" if kept == layers else ", one layer at a time"
    fp8 = plan.compute.startswith("fp8")
    if fp8:
        extras = tree.add(Part.FP8_EXTRAS)
        extras.add(Part.SCALING_STATE, plan.scaling_state)
        if plan.copy_per_param:
            extras.add(
                Part.FP8_WEIGHT_COPIES,
                plan.copy_per_param * gemm,
                ("data + transpose" if hopper else "data") + copies_note,
            )
    outer = _outer(plan)
    if plan.weights.autocast or outer.head_copy:
        copies = tree.add(Part.AUTOCAST_COPIES)
        if not fp8:
            copies.add(
                "layers' GEMM weights", plan.copy_per_param * gemm, "2 B/param" + copies_note
            )
        if outer.head_copy:
            copies.add("LM head", outer.head_copy, "cached by autocast")
    acts = tree.add(Part.ACTIVATIONS)
    if plan.recompute == "full":
        acts.add(Part.CHECKPOINTS, plan.layer_input * layers, "one per layer")
        one = acts.add(Part.RECOMPUTED_LAYER, note="during its backward only")
    else:
        one = acts.add(f"per layer x {layers}")
    for name, size in plan.saved.items():
        if size:
            one.add(name, size if plan.recompute == "full" else size * layers)
    if cfg.vocab_size is None:
        acts.add(Part.OUTPUT_AND_GRADIENT, 2 * plan.layer_input)
    else:
        acts.add(Part.HEAD_INPUTS, outer.head_inputs)
        logits = tree.add(Part.LOGITS)
        logits.add(Part.HELD_LOGITS, outer.held_logits)
        logits.add(Part.LOG_PROBS, outer.log_probs, "FP32")
        logits.add(Part.LOSS_COPIES, outer.loss_forward, "a moment")
        logits.add(Part.LOSS_GRADIENTS, outer.loss_backward, "FP32, a moment")
    temps = tree.add(Part.TEMPORARIES)
    if plan.optimizer_temporary:
        temps.add(Part.OPTIMIZER_TEMPORARIES, plan.optimizer_temporary)
    temps.add("backward scratch", BACKWARD_SCRATCH, "measured constant")
    return tree


def fitting_gpus(est: MemoryEstimate, headroom: float = 0.9) -> list[tuple[str, float, bool]]:
    """``(GPU, memory in GB, fits)`` for every GPU of :data:`fp8lab.datasheet.DATASHEET`: does the
    predicted peak plus the CUDA context fit in ``headroom`` of its memory?"""
    from fp8lab.datasheet import DATASHEET

    if not isinstance(est, MemoryEstimate):
        raise TypeError(f"est must be a memory.MemoryEstimate, not {type(est).__name__}")
    headroom = checks.number("headroom", headroom, positive=True, maximum=1.0)
    need = est.peak_bytes + CUDA_CONTEXT
    return [
        (spec.name, spec.memory_gb, need <= headroom * spec.memory_bytes)
        for spec in sorted(DATASHEET, key=lambda s: s.memory_gb)
    ]


def largest_micro_batch(
    cfg: TransformerConfig,
    seq: int,
    gpu: str = "H200",
    *,
    memory_bytes: float | None = None,
    headroom: float = 0.9,
    context_bytes: float = CUDA_CONTEXT,
    max_batch: int = 4096,
    **estimate_kwargs,
) -> int:
    """The largest micro-batch whose predicted peak fits ``headroom`` of the GPU's memory, less
    ``context_bytes`` (0 if none fits). ``memory_bytes`` overrides the datasheet's memory."""
    require_config(cfg)
    checks.integer("seq", seq)
    checks.integer("max_batch", max_batch)
    if memory_bytes is None:
        from fp8lab.datasheet import gpu_spec

        memory_bytes = gpu_spec(gpu).memory_bytes
    memory_bytes = checks.number("memory_bytes", memory_bytes, positive=True)
    headroom = checks.number("headroom", headroom, positive=True, maximum=1.0)
    context_bytes = checks.number("context_bytes", context_bytes, non_negative=True)
    budget = memory_bytes * headroom - context_bytes

    def fits(b: int) -> bool:
        return estimate(cfg, b, seq, **estimate_kwargs).peak_bytes <= budget

    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= max_batch and fits(high):
        low, high = high, high * 2
    high = min(high, max_batch + 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
