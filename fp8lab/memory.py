"""Memory of training a transformer, as a tree of named parts.

What it models, for one GPU of a data/tensor-parallel job:

* **training state** -- parameters, gradients, FP32 master weights and optimizer
  states: the classic 16 bytes/parameter of BF16 mixed precision with AdamW
  (18 with FP32 gradients), sharded by ZeRO stages 1-3 / FSDP as in
  Rajbhandari et al. 2020 (eq. in sec. 5: ``(2 + 2 + K) Psi``, K = 12);
* **activations** -- the tensors each layer saves for its backward, listed one by
  one for Transformer Engine's ``TransformerLayer`` (pre-norm; fused attention, so
  no S x S term), which reproduces Korthikanti et al. 2022's ``34 s b h`` per layer
  in BF16; the ``5 a s^2 b`` term of unfused attention with ``flash_attention=False``;
  tensor parallelism (``sbh(10 + 24/t)``) and sequence parallelism (``34 sbh / t``);
  none / selective / full recompute;
* **TE's FP8 state** -- FP8 copies of the GEMM weights made by ``te.autocast``
  (data and, on Hopper, the transpose: 2 bytes/parameter, saved for the backward),
  FP8 weights in place of BF16 ones with ``te.quantized_model_init``, FP8 copies of
  saved GEMM inputs (1 byte/element), scales and amax histories, the 32 MiB cuBLAS
  workspace of Hopper;
* **the peak** -- the backward pass is simulated step by step (gradients appear
  while saved activations are freed), and the largest sum is the predicted peak of
  ``torch.cuda.max_memory_allocated``.

Known limits: allocator fragmentation and the CUDA context (about 0.5 GiB, outside
``max_memory_allocated``) are reported but not in the peak; kernels' internal
scratch beyond the cuBLAS workspace is not modelled; pipeline parallelism is not
modelled. Validated against measured peaks on an H200 by ``fp8lab.memory_check``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fp8lab.config import TransformerConfig, require_positive_int
from fp8lab.flops import layer_parameters, parameter_count

PRECISIONS = ("fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-weights")
OPTIMIZERS = ("adamw", "sgd", "none")
RECOMPUTE = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)
MiB = 2**20
GiB = 2**30
CUBLAS_WORKSPACE_HOPPER = 32 * MiB + 1024
CUDA_CONTEXT = 512 * MiB
# Scratch that the backward of TE modules holds beyond the tensors modelled here (autograd's
# sums of branch gradients, norm and GEMM helper buffers): a constant measured on an H200 with
# TE 2.20 (peaks of small configurations sat 20-28 MiB above the modelled tensors).
BACKWARD_SCRATCH = 24 * MiB


@dataclass
class MemoryNode:
    """A named amount of memory and its parts; ``total`` sums the subtree."""

    name: str
    nbytes: float = 0.0
    note: str = ""
    children: list["MemoryNode"] = field(default_factory=list)

    def add(self, name: str, nbytes: float = 0.0, note: str = "") -> "MemoryNode":
        child = MemoryNode(name, nbytes, note)
        self.children.append(child)
        return child

    @property
    def total(self) -> float:
        return self.nbytes + sum(child.total for child in self.children)

    def __getitem__(self, name: str) -> "MemoryNode":
        for child in self.children:
            if child.name == name:
                return child
        raise KeyError(f"no part {name!r} under {self.name!r} (parts: {[c.name for c in self.children]})")

    def walk(self, depth: int = 0):
        yield depth, self
        for child in self.children:
            yield from child.walk(depth + 1)

    def table(self):
        """The tree as a pandas DataFrame: one row per node, indented names, MiB and share of the total."""
        import pandas as pd

        rows = [{"part": "  " * depth + node.name, "MiB": node.total / MiB,
                 "share": node.total / self.total if self.total else 0.0, "note": node.note}
                for depth, node in self.walk()]
        return pd.DataFrame(rows).set_index("part")

    def __str__(self) -> str:
        return "\n".join(f"{'  ' * d}{n.name}: {n.total / MiB:,.1f} MiB" + (f"  ({n.note})" if n.note else "")
                         for d, n in self.walk())


@dataclass(frozen=True)
class Layout:
    """How the job is split: tensor parallel size, sequence parallel, data-parallel ranks and ZeRO stage."""

    tp: int = 1
    sequence_parallel: bool = False
    dp: int = 1
    zero_stage: int = 0

    def __post_init__(self):
        require_positive_int("tp", self.tp)
        require_positive_int("dp", self.dp)
        if self.zero_stage not in ZERO_STAGES:
            raise ValueError(f"zero_stage={self.zero_stage}: must be one of {ZERO_STAGES} (FSDP full sharding = 3)")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel=True needs tp > 1")


# --- training state ----------------------------------------------------------------------------

def bytes_per_parameter(precision: str, optimizer: str = "adamw", fp32_grads: bool = False,
                        hopper: bool = True) -> dict[str, float]:
    """Bytes per parameter of the training state, by part (before any sharding)."""
    _check_choice("precision", precision, PRECISIONS)
    _check_choice("optimizer", optimizer, OPTIMIZERS)
    states = {"adamw": 8, "sgd": 4, "none": 0}[optimizer]
    if precision == "fp32":
        return {"parameters": 4, "gradients": 4, "master weights": 0, "optimizer states": states}
    weights = (2 if hopper else 1) if precision == "fp8-weights" else 2
    return {"parameters": weights, "gradients": 4 if fp32_grads else 2,
            "master weights": 4 if optimizer != "none" else 0, "optimizer states": states}


def zero_training_state(n_params: float, dp: int, stage: int, k: float = 12, weight_bytes: float = 2,
                        grad_bytes: float = 2) -> float:
    """Rajbhandari et al. 2020, sec. 5.1: bytes per GPU of parameters, gradients and K bytes/param of
    optimizer state (K = 12 for mixed-precision Adam) under ZeRO stage 0-3 over ``dp`` ranks."""
    require_positive_int("dp", dp)
    if stage not in ZERO_STAGES:
        raise ValueError(f"stage={stage}: must be one of {ZERO_STAGES}")
    p, g, o = weight_bytes * n_params, grad_bytes * n_params, k * n_params
    return {0: p + g + o, 1: p + g + o / dp, 2: p + (g + o) / dp, 3: (p + g + o) / dp}[stage]


# --- activations -------------------------------------------------------------------------------

def korthikanti_activations(cfg: TransformerConfig, batch: int, seq: int, tp: int = 1,
                            sequence_parallel: bool = False, recompute: str = "none") -> float:
    """Korthikanti et al. 2022, table 2: activation bytes of one layer (16-bit, unfused attention).

    none: ``sbh(10 + 24/t + 5as/(ht))``; sequence parallel: ``sbh/t (34 + 5as/h)``;
    selective: drops the ``5as/h`` term; full: ``2sbh`` (``2sbh/t`` with sequence parallel).
    """
    _check_choice("recompute", recompute, RECOMPUTE)
    s, b, h, a, t = seq, batch, cfg.hidden_size, cfg.num_attention_heads, tp
    if recompute == "full":
        return 2 * s * b * h / (t if sequence_parallel else 1)
    quadratic = 0 if recompute == "selective" else 5 * a * s / h
    if sequence_parallel:
        return s * b * h / t * (34 + quadratic)
    return s * b * h * (10 + 24 / t + quadratic / t)


def _saved_per_layer(cfg: TransformerConfig, batch: int, seq: int, fp8: bool, hidden_dropout: float,
                     flash_attention: bool, element: int, tp: int, sp: bool) -> dict[str, float]:
    """Bytes each layer saves for its backward, tensor by tensor (TE TransformerLayer, pre-norm)."""
    tokens, h, f = batch * seq, cfg.hidden_size, cfg.ffn_hidden_size
    rep = tp if sp else 1                 # replicated parts are split only by sequence parallelism
    gemm_input = 1 if fp8 else element    # TE saves FP8 copies of GEMM inputs for the weight gradient
    stats = (8 if cfg.normalization == "LayerNorm" else 4) * tokens / rep
    mask = tokens * h / rep if hidden_dropout > 0 else 0
    saved = {
        "attention norm input": element * tokens * h / rep + stats,
        "qkv input (norm output)": gemm_input * tokens * h / rep,
        "q, k, v": element * tokens * (h + 2 * cfg.kv_size) / tp,
        "attention output": element * tokens * h / tp + 4 * batch * cfg.num_attention_heads * seq / tp,
        "attention-output dropout mask": mask,
        "mlp norm input": element * tokens * h / rep + stats,
        "fc1 input (norm output)": gemm_input * tokens * h / rep,
        "fc1 output (pre-activation)": element * tokens * cfg.fc1_out / tp,
        "fc2 input (activation output)": gemm_input * tokens * f / tp,
        "mlp dropout mask": mask,
    }
    if fp8:
        saved["proj input (FP8 copy)"] = tokens * h / tp
        saved["qkv input (FP8 row-wise copy)"] = tokens * h / rep
    if not flash_attention:
        a = cfg.num_attention_heads
        saved["softmax, dropout mask and output (S x S)"] = 5 * a * seq * seq * batch / tp
    return saved


# --- the estimate ------------------------------------------------------------------------------

def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r}: must be one of {', '.join(map(str, choices))}")


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


def estimate(cfg: TransformerConfig, batch: int, seq: int, *, precision: str = "bf16", optimizer: str = "adamw",
             recompute: str = "none", layout: Layout = Layout(), fp32_grads: bool = False,
             hidden_dropout: float = 0.1, flash_attention: bool = True, hopper: bool = True,
             amax_history_len: int = 1024, include_optimizer: bool = True) -> MemoryEstimate:
    """The memory of one training step of ``cfg`` at micro-batch ``batch`` and sequence ``seq``.

    ``peak_bytes`` predicts the rise of ``torch.cuda.max_memory_allocated`` over building the
    model (and the optimizer's persistent state when ``include_optimizer``) and one forward and
    backward; ``runtime`` holds one-off memory beside it (cuBLAS workspace, CUDA context).
    """
    require_positive_int("batch", batch)
    require_positive_int("seq", seq)
    _check_choice("precision", precision, PRECISIONS)
    _check_choice("optimizer", optimizer, OPTIMIZERS)
    _check_choice("recompute", recompute, RECOMPUTE)
    if not 0 <= hidden_dropout < 1:
        raise ValueError(f"hidden_dropout={hidden_dropout}: must be in [0, 1)")
    if cfg.hidden_size % layout.tp or cfg.ffn_hidden_size % layout.tp or cfg.groups % layout.tp:
        raise ValueError(f"tp={layout.tp} must divide hidden_size, ffn_hidden_size and num_gqa_groups")
    if layout.sequence_parallel and seq % layout.tp:
        raise ValueError(f"sequence parallelism needs tp={layout.tp} to divide seq={seq}")

    fp8 = precision.startswith("fp8")
    element = 4 if precision == "fp32" else 2
    tp, dp, stage = layout.tp, layout.dp, layout.zero_stage
    per_param = bytes_per_parameter(precision, optimizer if include_optimizer else "none", fp32_grads, hopper)
    layer_params = layer_parameters(cfg)
    gemm_params = sum(v for k, v in layer_params.items() if "norm" not in k)
    n_local = parameter_count(cfg) / tp  # norms are replicated in practice; a small overestimate

    tree = MemoryNode(f"{cfg.name}: B={batch}, S={seq}, {precision}, recompute={recompute}")
    state = tree.add("training state")
    shard = {"parameters": stage >= 3, "gradients": stage >= 2, "master weights": stage >= 1,
             "optimizer states": stage >= 1}
    for part, size in per_param.items():
        if size:
            state.add(part, size * n_local / (dp if shard[part] else 1),
                      f"{size:g} B/param" + (f", ZeRO-{stage} over {dp}" if shard[part] and dp > 1 else ""))

    fp8_state = tree.add("TE FP8 extras")
    if fp8:
        gemms_per_layer = 4
        fp8_state.add("scales and amax histories",
                      cfg.num_layers * gemms_per_layer * 5 * 4 * (amax_history_len + 2 if precision == "fp8-delayed" else 3))
        if precision != "fp8-weights":
            fp8_state.add("FP8 weight copies (saved for backward)",
                          (2 if hopper else 1) * gemm_params * cfg.num_layers / tp,
                          "data + transpose" if hopper else "data")

    saved = _saved_per_layer(cfg, batch, seq, fp8, hidden_dropout, flash_attention, element, tp,
                             layout.sequence_parallel)
    if recompute == "selective" and not flash_attention:
        saved.pop("softmax, dropout mask and output (S x S)")
    acts = tree.add("activations")
    layer_input = element * batch * seq * cfg.hidden_size / (tp if layout.sequence_parallel else 1)
    if recompute == "full":
        acts.add("layer inputs (checkpoints)", layer_input * cfg.num_layers, "one per layer")
        one = acts.add("one layer, recomputed", note="during its backward only")
    else:
        one = acts.add(f"per layer x {cfg.num_layers}")
    for name, size in saved.items():
        one.add(name, size if recompute == "full" else size * cfg.num_layers)
    acts.add("output and its gradient", 2 * layer_input)

    peak = _simulate_peak(cfg, batch, seq, precision, recompute, layout, per_param, saved,
                          element, gemm_params, layer_input, fp8_state.total, hopper, n_local)
    runtime = MemoryNode("runtime (once per process)")
    if fp8 or precision == "bf16":
        runtime.add("TE cuBLAS workspace", CUBLAS_WORKSPACE_HOPPER if hopper else 4 * MiB)
    runtime.add("CUDA context (outside max_memory_allocated)", CUDA_CONTEXT)
    return MemoryEstimate(tree, peak, runtime)


# Saved tensors each TE module frees when its backward ends (TE frees a module's saved tensors together).
MODULE_SAVED = {
    "mlp": ("mlp norm input", "fc1 input (norm output)", "fc1 output (pre-activation)",
            "fc2 input (activation output)", "mlp dropout mask"),
    "proj": ("proj input (FP8 copy)", "attention-output dropout mask"),
    "attention": ("q, k, v", "attention output", "softmax, dropout mask and output (S x S)"),
    "qkv": ("attention norm input", "qkv input (norm output)", "qkv input (FP8 row-wise copy)"),
}
# Weight gradients each module writes while its largest transient is alive, and those written after it.
MODULE_PARAMS = {"mlp": ("mlp norm", "fc2"), "proj": ("attention output",), "attention": (),
                 "qkv": ("attention norm", "qkv")}
MODULE_PARAMS_AFTER = {"mlp": ("fc1",), "proj": (), "attention": (), "qkv": ()}


def backward_transients(cfg: TransformerConfig, tokens: int, element: int, fp8: bool, tp: int) -> dict[str, float]:
    """Bytes a layer's backward allocates for a moment, module by module (TE 2.20 on Hopper).

    The MLP's is the largest: the gradient of the activation output and, under FP8, row- and
    column-wise FP8 copies of the gradient entering FC1 (a gated activation also materialises
    that gradient in 16 bits first); FC2's weight gradient exists then, FC1's comes after
    (:data:`MODULE_PARAMS`, added by the caller). These terms follow TE's kernels; their sizes
    were checked against measured peaks on an H200.
    """
    h, f, fc1 = cfg.hidden_size, cfg.ffn_hidden_size / tp, cfg.fc1_out / tp
    qkv = (h + 2 * cfg.kv_size) / tp
    gated = cfg.activation == "swiglu"
    if fp8:
        mlp = element * tokens * f + (element * tokens * fc1 if gated else 0) + 2 * tokens * fc1
    else:
        mlp = element * tokens * fc1 + element * tokens * h
    quant = 2 if fp8 else 0
    return {
        "mlp": mlp,
        "proj": element * tokens * h + quant * tokens * h,
        "attention": element * tokens * h + element * tokens * qkv,
        "qkv": element * tokens * qkv + quant * tokens * qkv + element * tokens * h,
    }


def _simulate_peak(cfg, batch, seq, precision, recompute, layout, per_param, saved, element, gemm_params,
                   layer_input, fp8_extras, hopper, n_local) -> float:
    """Walk the backward module by module, last layer first; return the largest live total."""
    fp8 = precision.startswith("fp8")
    tp = layout.tp
    tokens = batch * seq
    persistent_state = sum(v for k, v in per_param.items() if k != "gradients") * n_local
    grad_bytes = per_param["gradients"]
    layer_params = {k: v / tp for k, v in layer_parameters(cfg).items()}
    fp8_copy = (2 if hopper else 1) if precision in ("fp8-delayed", "fp8-current") else 0
    scaling_state = fp8_extras - fp8_copy * gemm_params * cfg.num_layers / tp
    saved_layer = sum(saved.values())
    transients = backward_transients(cfg, tokens, element, fp8, tp)
    copy_of = {name: fp8_copy * sum(layer_params[p] for p in params + MODULE_PARAMS_AFTER[name] if "norm" not in p)
               for name, params in MODULE_PARAMS.items()}

    full = recompute == "full"
    live_saved = 0.0 if full else saved_layer * cfg.num_layers
    copies = 0.0 if full else sum(copy_of.values()) * cfg.num_layers
    checkpoints = layer_input * cfg.num_layers if full else 0.0
    # Embeddings, final norm and LM head run backward first: their gradients exist throughout.
    grads = grad_bytes * (n_local - cfg.num_layers * sum(layer_params.values()))
    if cfg.vocab_size is None:  # a stack of layers: its output and the gradient handed to it
        incoming = 2 * layer_input
    else:  # logits, their FP32 copy for the loss, and the logits' gradient
        incoming = (2 * element + 4) * tokens * cfg.vocab_size / tp
    incoming += BACKWARD_SCRATCH
    peak = 0.0
    for _ in range(cfg.num_layers):
        if full:  # the recomputed forward of this layer brings its saved tensors and weight copies back
            live_saved += saved_layer
            copies += sum(copy_of.values())
        for module in ("mlp", "proj", "attention", "qkv"):
            grads += grad_bytes * sum(layer_params[p] for p in MODULE_PARAMS[module])
            peak = max(peak, persistent_state + scaling_state + checkpoints + incoming + live_saved + copies
                       + grads + transients[module])
            live_saved -= sum(saved.get(name, 0.0) for name in MODULE_SAVED[module])
            copies -= copy_of[module]
            grads += grad_bytes * sum(layer_params[p] for p in MODULE_PARAMS_AFTER[module])
        if full:
            checkpoints -= layer_input
    # the end: every gradient exists, and the input's gradient beside the incoming one
    return max(peak, persistent_state + scaling_state + grads + incoming + layer_input)


def largest_micro_batch(cfg: TransformerConfig, seq: int, gpu: str = "H200", *, memory_bytes: float | None = None,
                        headroom: float = 0.9, max_batch: int = 4096, **estimate_kwargs) -> int:
    """The largest micro-batch whose predicted peak fits ``headroom`` of the GPU's memory (0 if none)."""
    if memory_bytes is None:
        from fp8lab.hardware import gpu_spec

        memory_bytes = gpu_spec(gpu).memory_gb * 1e9
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom={headroom}: must be in (0, 1]")
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
