"""Memory of training a transformer, as a tree of named parts, and its predicted peak.

What it models, for one GPU of a data/tensor-parallel job:

* **training state** -- parameters, gradients, FP32 master weights and optimizer states:
  the classic 16 bytes/parameter of BF16 mixed precision with AdamW (18 with FP32
  gradients), sharded by ZeRO stages 1-3 / FSDP as in Rajbhandari et al. 2020
  (sec. 5: ``(2 + 2 + K) Psi``, K = 12);
* **activations** -- the tensors each layer saves for its backward, listed one by one for
  Transformer Engine's ``TransformerLayer`` (pre-norm; fused attention, so no S x S term),
  which reproduces Korthikanti et al. 2022's ``34 s b h`` per layer in BF16; the
  ``5 a s^2 b`` term of unfused attention with ``flash_attention=False``; tensor
  parallelism (``sbh(10 + 24/t)``) and sequence parallelism (``34 sbh / t``); none /
  selective / full recompute;
* **TE's FP8 state** -- FP8 copies of the GEMM weights made by ``te.autocast`` (data and,
  on Hopper, the transpose: 2 bytes/parameter, saved for the backward), FP8 weights in
  place of BF16 ones with ``te.quantized_model_init``, FP8 copies of saved GEMM inputs
  (1 byte/element), scales and amax histories, TE's cuBLAS workspace;
* **the peak** -- the backward pass is walked module by module (gradients appear while
  saved activations are freed), and the largest live total is the predicted peak of
  ``torch.cuda.max_memory_allocated``.

Every constant below says where it comes from. Known limits: allocator fragmentation and
the CUDA context (outside ``max_memory_allocated``) are reported beside the peak, not in
it; kernels' internal scratch beyond the cuBLAS workspace is one measured constant;
pipeline parallelism is not modelled. Checked against measured peaks on an H200 by
``tools/memory_check.py`` (results in ``tests/gpu_results``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fp8lab import checks
from fp8lab.config import TransformerConfig, require_config
from fp8lab.flops import RECOMPUTE, layer_parameters, parameter_count

__all__ = [
    "CUDA_CONTEXT",
    "Layout",
    "MemoryEstimate",
    "MemoryNode",
    "OPTIMIZERS",
    "PRECISIONS",
    "Part",
    "Saved",
    "backward_transients",
    "bytes_per_parameter",
    "estimate",
    "korthikanti_activations",
    "largest_micro_batch",
    "zero_training_state",
]

PRECISIONS = ("fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-weights")
OPTIMIZERS = ("adamw", "sgd", "none")
ZERO_STAGES = (0, 1, 2, 3)
MiB = 2**20
GiB = 2**30

# TE 2.20, transformer_engine/pytorch/cpp_extensions/gemm.py, get_cublas_workspace_size_bytes():
# 32 MiB plus 1 KiB of alignment and scales on Hopper and newer, 4 MiB on older GPUs.
CUBLAS_WORKSPACE_HOPPER = 32 * MiB + 1024
CUBLAS_WORKSPACE_OLDER = 4 * MiB
# The CUDA context and kernels' code: about 0.5 GiB on an H200 with torch 2.11 (nvidia-smi's used
# memory minus max_memory_allocated after a warm-up); outside max_memory_allocated, so never in the
# peak.
CUDA_CONTEXT = 512 * MiB
# Scratch that the backward of TE modules holds beyond the tensors modelled here (autograd's sums
# of branch gradients, norm and GEMM helper buffers): measured on an H200 with TE 2.20.2, where the
# peaks of the calibration matrix's small configurations sat 20-28 MiB above the modelled tensors.
BACKWARD_SCRATCH = 24 * MiB
# Bytes per parameter of the optimizer's state: AdamW keeps two FP32 moments, SGD one momentum.
OPTIMIZER_STATE_BYTES = {"adamw": 8, "sgd": 4, "none": 0}
# Delayed-scaling bookkeeping per FP8 GEMM of a TE module: five FP32 slots (scale, scale_inv and
# amax
# of input, weight and output-gradient metas; TE 2.20 quantization.py) each with an amax history.
FP8_META_SLOTS_PER_GEMM = 5
FP8_GEMMS_PER_LAYER = 4  # QKV, attention output, FC1, FC2


class Part:
    """Names of the tree's top-level parts and of the training state (a misspelt constant
    raises)."""

    TRAINING_STATE = "training state"
    PARAMETERS = "parameters"
    GRADIENTS = "gradients"
    MASTER_WEIGHTS = "master weights"
    OPTIMIZER_STATES = "optimizer states"
    FP8_EXTRAS = "TE FP8 extras"
    SCALING_STATE = "scales and amax histories"
    FP8_WEIGHT_COPIES = "FP8 weight copies (saved for backward)"
    ACTIVATIONS = "activations"
    CHECKPOINTS = "layer inputs (checkpoints)"
    RECOMPUTED_LAYER = "one layer, recomputed"
    OUTPUT_AND_GRADIENT = "output and its gradient"
    CUBLAS_WORKSPACE = "TE cuBLAS workspace"
    CUDA_CONTEXT = "CUDA context (outside max_memory_allocated)"


class Saved:
    """Names of the tensors one TE ``TransformerLayer`` saves for its backward."""

    ATTN_NORM_INPUT = "attention norm input"
    QKV_INPUT = "qkv input (norm output)"
    QKV_INPUT_FP8_ROWWISE = "qkv input (FP8 row-wise copy)"
    QKV = "q, k, v"
    ATTN_OUTPUT = "attention output"
    ATTN_DROPOUT_MASK = "attention-output dropout mask"
    PROJ_INPUT_FP8 = "proj input (FP8 copy)"
    SCORES = "softmax, dropout mask and output (S x S)"
    MLP_NORM_INPUT = "mlp norm input"
    FC1_INPUT = "fc1 input (norm output)"
    FC1_OUTPUT = "fc1 output (pre-activation)"
    FC2_INPUT = "fc2 input (activation output)"
    MLP_DROPOUT_MASK = "mlp dropout mask"


# Saved tensors each TE module frees when its backward ends (TE frees a module's saved tensors
# together),
# in the order the backward reaches the modules.
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
# Weight gradients each module writes while its largest transient is alive, and those written after
# it
# (keys of fp8lab.flops.layer_parameters).
MODULE_PARAMS = {
    "mlp": ("mlp norm", "fc2"),
    "proj": ("attention output",),
    "attention": (),
    "qkv": ("attention norm", "qkv"),
}
MODULE_PARAMS_AFTER = {"mlp": ("fc1",), "proj": (), "attention": (), "qkv": ()}


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


# --- training state ----------------------------------------------------------------------------


def bytes_per_parameter(
    precision: str, optimizer: str = "adamw", fp32_grads: bool = False, hopper: bool = True
) -> dict[str, float]:
    """Bytes per parameter of the training state, by part (before any sharding)."""
    checks.choice("precision", precision, PRECISIONS)
    checks.choice("optimizer", optimizer, OPTIMIZERS)
    checks.flag("fp32_grads", fp32_grads)
    checks.flag("hopper", hopper)
    states = OPTIMIZER_STATE_BYTES[optimizer]
    if precision == "fp32":
        return {
            Part.PARAMETERS: 4,
            Part.GRADIENTS: 4,
            Part.MASTER_WEIGHTS: 0,
            Part.OPTIMIZER_STATES: states,
        }
    weights = (
        (2 if hopper else 1) if precision == "fp8-weights" else 2
    )  # FP8 data (+ transpose on Hopper)
    return {
        Part.PARAMETERS: weights,
        Part.GRADIENTS: 4 if fp32_grads else 2,
        Part.MASTER_WEIGHTS: 4 if optimizer != "none" else 0,
        Part.OPTIMIZER_STATES: states,
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
    of
    optimizer state (K = 12 for mixed-precision Adam) under ZeRO stage 0-3 over ``dp`` ranks."""
    n_params = checks.number("n_params", n_params, positive=True)
    checks.integer("dp", dp)
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"stage={stage!r}: must be one of {ZERO_STAGES}")
    k = checks.number("k", k, non_negative=True)
    weight_bytes = checks.number("weight_bytes", weight_bytes, positive=True)
    grad_bytes = checks.number("grad_bytes", grad_bytes, positive=True)
    p, g, o = weight_bytes * n_params, grad_bytes * n_params, k * n_params
    return {0: p + g + o, 1: p + g + o / dp, 2: p + (g + o) / dp, 3: (p + g + o) / dp}[stage]


# --- activations -------------------------------------------------------------------------------


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
    batch: int,
    seq: int,
    fp8: bool,
    hidden_dropout: float,
    flash_attention: bool,
    element: int,
    tp: int,
    sp: bool,
) -> dict[str, float]:
    """Bytes each layer saves for its backward, for every name of :class:`Saved` (0 where
    absent)."""
    tokens, h, f = batch * seq, cfg.hidden_size, cfg.ffn_hidden_size
    rep = tp if sp else 1  # replicated parts are split only by sequence parallelism
    gemm_input = 1 if fp8 else element  # TE saves FP8 copies of GEMM inputs for the weight gradient
    stats = (
        (8 if cfg.normalization == "LayerNorm" else 4) * tokens / rep
    )  # FP32 mean and rstd (or rstd)
    mask = tokens * h / rep if hidden_dropout > 0 else 0.0  # one byte per element
    softmax_stats = 4 * batch * cfg.num_attention_heads * seq / tp  # FP32 log-sum-exp per row
    return {
        Saved.ATTN_NORM_INPUT: element * tokens * h / rep + stats,
        Saved.QKV_INPUT: gemm_input * tokens * h / rep,
        Saved.QKV_INPUT_FP8_ROWWISE: tokens * h / rep if fp8 else 0.0,
        Saved.QKV: element * tokens * cfg.qkv_size / tp,
        Saved.ATTN_OUTPUT: element * tokens * cfg.q_size / tp + softmax_stats,
        Saved.ATTN_DROPOUT_MASK: mask,
        Saved.PROJ_INPUT_FP8: tokens * cfg.q_size / tp if fp8 else 0.0,
        Saved.SCORES: 0.0
        if flash_attention
        else 5 * cfg.num_attention_heads * seq * seq * batch / tp,
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
    (:data:`MODULE_PARAMS`, added by the caller). These terms follow TE's kernels; their sizes
    were checked against measured peaks on an H200.
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


# --- the estimate ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryEstimate:
    """The parts (a tree), the predicted peak, and the one-off runtime memory beside them."""

    tree: MemoryNode
    peak_bytes: float
    runtime: MemoryNode

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / MiB

    def __str__(self) -> str:
        return f"{self.tree}\npredicted peak: {self.peak_mib:,.1f} MiB\n{self.runtime}"


@dataclass(frozen=True)
class _BackwardWalk:
    """What the walk over the backward pass needs, computed once by :func:`estimate`."""

    cfg: TransformerConfig
    tokens: int
    element: int
    fp8: bool
    tp: int
    full_recompute: bool
    persistent_state: float  # parameters, master weights, optimizer states (not gradients)
    grad_bytes_per_param: float
    n_local: float  # parameters on this GPU
    scaling_state: float  # TE's scales and amax histories
    fp8_copy_bytes_per_param: float  # autocast's FP8 weight copies (0 without them)
    saved: dict[str, float]  # one layer's saved tensors, by Saved name
    layer_input: float  # bytes of one layer's input (a checkpoint under full recompute)


def _simulate_peak(walk: _BackwardWalk) -> float:
    """Walk the backward module by module, last layer first; return the largest live total."""
    cfg, layers = walk.cfg, walk.cfg.num_layers
    layer_params = {k: v / walk.tp for k, v in layer_parameters(cfg).items()}
    saved_layer = sum(walk.saved.values())
    transients = backward_transients(cfg, walk.tokens, walk.element, walk.fp8, walk.tp)
    copy_of = {
        name: walk.fp8_copy_bytes_per_param
        * sum(layer_params[p] for p in params + MODULE_PARAMS_AFTER[name] if "norm" not in p)
        for name, params in MODULE_PARAMS.items()
    }

    live_saved = 0.0 if walk.full_recompute else saved_layer * layers
    copies = 0.0 if walk.full_recompute else sum(copy_of.values()) * layers
    checkpoints = walk.layer_input * layers if walk.full_recompute else 0.0
    # Embeddings, final norm and LM head run backward first: their gradients exist throughout.
    grads = walk.grad_bytes_per_param * (walk.n_local - layers * sum(layer_params.values()))
    if cfg.vocab_size is None:  # a stack of layers: its output and the gradient handed to it
        incoming = 2 * walk.layer_input
    else:  # logits, their FP32 copy for the loss, and the logits' gradient
        incoming = (2 * walk.element + 4) * walk.tokens * cfg.vocab_size / walk.tp
    incoming += BACKWARD_SCRATCH
    base = walk.persistent_state + walk.scaling_state
    peak = 0.0
    for _ in range(layers):
        if (
            walk.full_recompute
        ):  # the recomputed forward brings this layer's saved tensors and weight copies back
            live_saved += saved_layer
            copies += sum(copy_of.values())
        for module in ("mlp", "proj", "attention", "qkv"):
            grads += walk.grad_bytes_per_param * sum(layer_params[p] for p in MODULE_PARAMS[module])
            peak = max(
                peak,
                base + checkpoints + incoming + live_saved + copies + grads + transients[module],
            )
            live_saved -= sum(walk.saved[name] for name in MODULE_SAVED[module])
            copies -= copy_of[module]
            grads += walk.grad_bytes_per_param * sum(
                layer_params[p] for p in MODULE_PARAMS_AFTER[module]
            )
        if walk.full_recompute:
            checkpoints -= walk.layer_input
    # the end: every gradient exists, and the input's gradient beside the incoming one
    return max(peak, base + grads + incoming + walk.layer_input)


def estimate(
    cfg: TransformerConfig,
    batch: int,
    seq: int,
    *,
    precision: str = "bf16",
    optimizer: str = "adamw",
    recompute: str = "none",
    layout: Layout | None = None,
    fp32_grads: bool = False,
    hidden_dropout: float = 0.1,
    flash_attention: bool = True,
    hopper: bool = True,
    amax_history_len: int = 1024,
    include_optimizer: bool = True,
) -> MemoryEstimate:
    """The memory of one training step of ``cfg`` at micro-batch ``batch`` and sequence ``seq``.

    ``peak_bytes`` predicts the rise of ``torch.cuda.max_memory_allocated`` over building the
    model (and the optimizer's persistent state when ``include_optimizer``) and one forward and
    backward; ``runtime`` holds one-off memory beside it (cuBLAS workspace, CUDA context).
    """
    require_config(cfg)
    checks.integer("batch", batch)
    checks.integer("seq", seq)
    checks.choice("precision", precision, PRECISIONS)
    checks.choice("optimizer", optimizer, OPTIMIZERS)
    checks.choice("recompute", recompute, RECOMPUTE)
    layout = Layout() if layout is None else layout
    if not isinstance(layout, Layout):
        raise TypeError(f"layout must be a memory.Layout, not {type(layout).__name__}")
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

    fp8 = precision.startswith("fp8")
    element = 4 if precision == "fp32" else 2
    tp, dp, stage = layout.tp, layout.dp, layout.zero_stage
    per_param = bytes_per_parameter(
        precision, optimizer if include_optimizer else "none", fp32_grads, hopper
    )
    gemm_params = sum(v for k, v in layer_parameters(cfg).items() if "norm" not in k)
    n_local = parameter_count(cfg) / tp  # norms are replicated in practice; a small overestimate

    tree = MemoryNode(f"{cfg.name}: B={batch}, S={seq}, {precision}, recompute={recompute}")
    state = tree.add(Part.TRAINING_STATE)
    sharded = {
        Part.PARAMETERS: stage >= 3,
        Part.GRADIENTS: stage >= 2,
        Part.MASTER_WEIGHTS: stage >= 1,
        Part.OPTIMIZER_STATES: stage >= 1,
    }
    for part, size in per_param.items():
        if size:
            state.add(
                part,
                size * n_local / (dp if sharded[part] else 1),
                f"{size:g} B/param"
                + (f", ZeRO-{stage} over {dp}" if sharded[part] and dp > 1 else ""),
            )

    fp8_copy = (2 if hopper else 1) if precision in ("fp8-delayed", "fp8-current") else 0
    fp8_state = tree.add(Part.FP8_EXTRAS)
    scaling_state = 0.0
    if fp8:
        history = amax_history_len + 2 if precision == "fp8-delayed" else 3
        scaling_state = cfg.num_layers * FP8_GEMMS_PER_LAYER * FP8_META_SLOTS_PER_GEMM * 4 * history
        fp8_state.add(Part.SCALING_STATE, scaling_state)
        if fp8_copy:
            fp8_state.add(
                Part.FP8_WEIGHT_COPIES,
                fp8_copy * gemm_params * cfg.num_layers / tp,
                "data + transpose" if hopper else "data",
            )

    saved = _saved_per_layer(
        cfg, batch, seq, fp8, hidden_dropout, flash_attention, element, tp, layout.sequence_parallel
    )
    if recompute == "selective":  # the S x S scores are recomputed instead of saved
        saved[Saved.SCORES] = 0.0
    acts = tree.add(Part.ACTIVATIONS)
    layer_input = element * batch * seq * cfg.hidden_size / (tp if layout.sequence_parallel else 1)
    if recompute == "full":
        acts.add(Part.CHECKPOINTS, layer_input * cfg.num_layers, "one per layer")
        one = acts.add(Part.RECOMPUTED_LAYER, note="during its backward only")
    else:
        one = acts.add(f"per layer x {cfg.num_layers}")
    for name, size in saved.items():
        if size:
            one.add(name, size if recompute == "full" else size * cfg.num_layers)
    acts.add(Part.OUTPUT_AND_GRADIENT, 2 * layer_input)

    walk = _BackwardWalk(
        cfg=cfg,
        tokens=batch * seq,
        element=element,
        fp8=fp8,
        tp=tp,
        full_recompute=recompute == "full",
        persistent_state=sum(v for k, v in per_param.items() if k != Part.GRADIENTS) * n_local,
        grad_bytes_per_param=per_param[Part.GRADIENTS],
        n_local=n_local,
        scaling_state=scaling_state,
        fp8_copy_bytes_per_param=fp8_copy,
        saved=saved,
        layer_input=layer_input,
    )
    runtime = MemoryNode("runtime (once per process)")
    if fp8 or precision == "bf16":
        runtime.add(
            Part.CUBLAS_WORKSPACE, CUBLAS_WORKSPACE_HOPPER if hopper else CUBLAS_WORKSPACE_OLDER
        )
    runtime.add(Part.CUDA_CONTEXT, CUDA_CONTEXT)
    return MemoryEstimate(tree, _simulate_peak(walk), runtime)


def largest_micro_batch(
    cfg: TransformerConfig,
    seq: int,
    gpu: str = "H200",
    *,
    memory_bytes: float | None = None,
    headroom: float = 0.9,
    max_batch: int = 4096,
    **estimate_kwargs,
) -> int:
    """The largest micro-batch whose predicted peak fits ``headroom`` of the GPU's memory (0 if
    none)."""
    require_config(cfg)
    checks.integer("seq", seq)
    checks.integer("max_batch", max_batch)
    if memory_bytes is None:
        from fp8lab.datasheet import gpu_spec

        memory_bytes = gpu_spec(gpu).memory_bytes
    memory_bytes = checks.number("memory_bytes", memory_bytes, positive=True)
    headroom = checks.number("headroom", headroom, positive=True, maximum=1.0)
    budget = memory_bytes * headroom - CUDA_CONTEXT

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
