"""Every size a training step holds, computed once: :func:`step_sizes`.

The breakdown tree (:mod:`fp8lab.memory.tree`) and the simulated timeline
(:mod:`fp8lab.memory.timeline`) both read a :class:`StepSizes`; neither sizes anything itself,
so the parts the tree shows are the ones the timeline moves. All sizes are bytes on one GPU.

Sources: FP8 weight copies and master weights from TE 2.20 (``module/linear.py``: a BF16 weight
is quantized row- and column-wise, 2 bytes/parameter on Hopper, and saved for the backward;
``module/base.py``: ``quantized_model_init``; ``optimizers/fused_adam.py``: master weights and
moments created lazily in the first ``step``, FP32 copies of the gradients of FP8 weights
outside delayed scaling). PyTorch: ``torch/optim/adam.py`` (foreach AdamW allocates one
moment-sized temporary), autograd's cross-entropy (log-softmax output saved; two dense logit
gradients in the backward), autocast's weight cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fp8lab.flops import layer_parameters
from fp8lab.memory.activations import (
    MODULE_PARAMS,
    MODULE_PARAMS_AFTER,
    MODULE_SAVED,
    backward_transients,
    saved_per_layer,
)
from fp8lab.memory.constants import (
    FP8_GATHERED_BYTES_PER_ELEMENT,
    FP8_GEMMS_PER_LAYER,
    FP8_META_SLOTS_PER_GEMM,
    FSDP2_UNSHARDED_LAYERS,
    MASTER_INIT_BYTES_PER_PARAMETER,
    NORM_STATS_BYTES,
    OFFLOAD_MIN_ELEMENTS,
)
from fp8lab.memory.layouts import bytes_per_parameter
from fp8lab.memory.spec import StepSpec
from fp8lab.parts import Part

__all__ = ["StepSizes", "step_sizes"]


@dataclass(frozen=True)
class OuterSizes:
    """Bytes of the model around the layers, for one micro-batch (see :func:`_outer_sizes`)."""

    head_inputs: float  # saved by the final norm and the LM head
    held_logits: float  # the logits, held by the training loop until backward returns
    log_probs: float  # saved by cross-entropy
    loss_forward: float  # lm_loss's FP32 copies of the logits, a moment
    loss_backward: float  # cross-entropy's two logit gradients, a moment
    head_backward: float  # the logits' gradient on its way through the head, a moment
    head_copy: float  # autocast's cached BF16 copy of the head's weight
    embedding_forward: float  # embedding output (and the sum with positions), a moment
    incoming: float  # the gradient flowing into the last layer


@dataclass(frozen=True)
class ModuleSizes:
    """One TE module of a layer, as its backward sees it (modules in the backward's order)."""

    name: str  # "mlp", "proj", "attention" or "qkv"
    transient: float  # what its backward allocates for a moment
    grads: float  # weight gradients written while the transient is alive
    grads_after: float  # weight gradients written after it
    wgrad_cast: float  # BF16 weight gradients before their cast to FP32 parameters
    weight_copies: float  # its weight copies, freed with its saved tensors
    saved: float  # the saved tensors it frees when its backward ends


@dataclass(frozen=True)
class StepSizes:
    """Every size the tree and the timeline need, in bytes on one GPU (see :func:`step_sizes`)."""

    spec: StepSpec
    per_parameter: dict  # bytes per parameter of the training state, by part (before sharding)
    layer_params: dict  # one layer's parameters on this GPU, by part
    outer_params: dict  # embeddings, positions, final norm, head on this GPU (head: untied only)
    parameters: float  # stored weights
    master: float
    states: float
    grad_per_param: float
    gradients: float  # every gradient at once
    head_gradients: float  # untied head and final norm
    tied_head_gradient: float  # the head's gradient: the embedding's if tied, else the head's
    embedding_gradients: float  # embedding table and positions
    scaling_state: float
    copy_per_param: float  # FP8 or BF16 weight copies saved for the backward, per GEMM parameter
    copies_kept: bool  # False under ZeRO-3/FSDP2: TE re-casts each layer's copy in its backward
    gemm_per_layer: float  # one layer's GEMM parameters on this GPU
    layer_weight_copies: float  # one layer's weight copies
    saved: dict  # one layer's saved tensors, by Saved name
    saved_per_layer: float  # their sum
    layer_input: float  # one layer's input (a checkpoint under full recompute)
    modules: tuple  # ModuleSizes, in the order the backward reaches them
    outer: OuterSizes
    optimizer_temporary: float
    state_init_transient: float
    offloaded_per_layer: float = 0.0  # saved bytes an offloaded layer moves to host memory
    fsdp_held: float = 0.0  # FSDP2: root and two unsharded layers, through a micro-batch
    fsdp_root: float = 0.0  # FSDP2: the root module's full parameters (not resharded)
    fsdp_layer: float = 0.0  # FSDP2: one layer's full parameters (all-gathered)
    ddp_buckets: float = 0.0  # DDP's gradient buckets (comm_buffers)
    sp_gathered: dict = field(default_factory=dict)  # SP: all-gathered bytes per module backward
    fsdp_module_copies: dict = field(default_factory=dict)  # FSDP2: FP8 copies per module
    input_batch: float = 0.0  # a bare stack's input batch and FP32 target (stack_batch)

    @property
    def kept_layers(self) -> int:
        """Layers whose weight copies are alive at once (one under full recompute or ZeRO-3)."""
        layers = self.spec.cfg.num_layers
        return layers if self.copies_kept and self.spec.recompute != "full" else 1

    @property
    def weight_copies(self) -> float:
        """The weight copies alive at once at their largest."""
        return self.copy_per_param * (self.kept_layers * self.gemm_per_layer)


def step_sizes(spec: StepSpec) -> StepSizes:
    """Every size of one training step of ``spec``, computed once."""
    if not isinstance(spec, StepSpec):
        raise TypeError(f"spec must be a memory.StepSpec, not {type(spec).__name__}")
    cfg, tp = spec.cfg, spec.layout.tp
    layer_params = {k: v / tp for k, v in layer_parameters(cfg).items()}
    gemm_per_layer = sum(v for k, v in layer_params.items() if "norm" not in k)
    outer_params = _outer_parameters(spec)
    n_local = cfg.num_layers * sum(layer_params.values()) + sum(outer_params.values())
    fp8_gemm = cfg.num_layers * gemm_per_layer if spec.parameter_layout.fp8_params else 0.0
    state = _training_state(spec, n_local, fp8_gemm)
    saved = saved_per_layer(spec)
    largest = max([*layer_params.values(), *outer_params.values()])
    update_temp, init_temp = _optimizer_temporaries(spec, n_local, largest, fp8_gemm)
    copy_per_param = _copy_per_parameter(spec)
    grad = state["grad_per_param"]
    layer_input = spec.element * spec.batch * spec.seq * cfg.hidden_size / spec.rep
    modules = _module_sizes(spec, layer_params, saved, copy_per_param, grad)
    return StepSizes(
        spec=spec,
        layer_params=layer_params,
        outer_params=outer_params,
        **state,
        **_outer_gradients(spec, outer_params, grad),
        gradients=grad * sum([cfg.num_layers * sum(layer_params.values()), *outer_params.values()]),
        scaling_state=_scaling_state(spec),
        copy_per_param=copy_per_param,
        copies_kept=spec.layout.zero_stage < 3,
        gemm_per_layer=gemm_per_layer,
        layer_weight_copies=copy_per_param * sum(_module_gemm(layer_params).values()),
        saved=saved,
        saved_per_layer=sum(saved.values()),
        layer_input=layer_input,
        modules=modules,
        outer=_outer_sizes(spec, layer_input),
        optimizer_temporary=update_temp,
        state_init_transient=init_temp,
        offloaded_per_layer=_offloaded_per_layer(spec, saved),
        **_fsdp_buffers(spec, layer_params, outer_params, state["per_parameter"]),
        **_comm_buffers(spec, layer_params, n_local, copy_per_param),
        input_batch=_input_batch(spec),
    )


def _offloaded_per_layer(spec: StepSpec, saved: dict) -> float:
    """Bytes of one layer's saved tensors that ``te.get_cpu_offload_context`` moves to host
    memory: every saved activation of at least :data:`OFFLOAD_MIN_ELEMENTS` elements (the
    norms' and softmax's per-row statistics stay; they are small); 0 when nothing is offloaded.
    """
    if not spec.offload_layers:
        return 0.0
    if spec.tokens * spec.cfg.hidden_size / spec.rep < OFFLOAD_MIN_ELEMENTS:
        return 0.0
    stats = 2 * NORM_STATS_BYTES[spec.cfg.normalization] * spec.tokens / spec.rep
    stats += 4 * spec.tokens * spec.cfg.num_attention_heads / spec.layout.tp
    return max(0.0, sum(saved.values()) - stats)


def _fsdp_buffers(spec: StepSpec, layer_params: dict, outer_params: dict, per_param: dict):
    """FSDP2's full-size weights on one GPU (see :data:`FSDP2_UNSHARDED_LAYERS`): the root's
    parameters and the unsharded layers held through a micro-batch (0 unless ZeRO-3 over
    dp > 1). The unsharded gradient of the running layer is the timeline's: it grows module by
    module until the layer's reduce-scatter."""
    if not spec.fsdp:
        return {}
    weights = spec.parameter_layout
    stored = per_param[Part.PARAMETERS] if weights.fp8_params else weights.param_bytes
    gemm = sum(v for k, v in layer_params.items() if "norm" not in k)
    layer = stored * gemm + weights.param_bytes * (sum(layer_params.values()) - gemm)
    unsharded = min(FSDP2_UNSHARDED_LAYERS, spec.cfg.num_layers)
    root = weights.param_bytes * sum(outer_params.values())
    return {"fsdp_held": root + unsharded * layer, "fsdp_root": root, "fsdp_layer": layer}


def _comm_buffers(spec: StepSpec, layer_params: dict, n_local: float, copy_per_param: float):
    """What the parallel layouts hold beside the model's tensors (``comm_buffers``), in bytes.

    * DDP (``torch/csrc/distributed/c10d/reducer.cpp``, ``Reducer::initialize_buckets``): the
      reducer allocates each bucket's flat ``gradients`` tensor, in the parameters' dtype, when
      DDP is built, and keeps it: one gradient's bytes for every parameter. With
      ``gradient_as_bucket_view`` the parameters' gradients are views of it
      (``mark_variable_ready_dense`` copies each fresh gradient in and points ``.grad`` at the
      view); without, they are separate tensors beside it.
    * Sequence parallelism (TE 2.20): a row-parallel GEMM all-gathers its output gradient to the
      group's full ``[tokens, hidden]`` for its data and weight gradients
      (``module/base.py``, ``grad_output_preprocess``: FC2 in ``LayerNormMLP``, the attention
      projection in ``Linear``), and a column-parallel one all-gathers its saved norm output for
      its weight gradient (``layernorm_mlp.py`` and ``layernorm_linear.py`` backward,
      ``ln_out_total``: FC1 and QKV); each lives through its module's backward. In BF16 one
      element is 2 bytes; in FP8 it is the gathered row-wise data and its transpose
      (:data:`FP8_GATHERED_BYTES_PER_ELEMENT`).
    * FSDP2 under FP8 (TE 2.20, ``is_fsdp2``): the forward casts each weight row-wise only and
      does not save it; each module's backward casts its weights again, row- and column-wise,
      and drops the column-wise copy after its data-gradient GEMM (``clear_columnwise_cache``):
      in ``LayerNormMLP``'s backward, FC2's row-wise copy is still there when FC1's full copy
      is made. One module's copies at a time, instead of the whole layer's.
    """
    if not spec.comm_buffers:
        return {}
    found = {}
    if spec.ddp:
        found["ddp_buckets"] = spec.parameter_layout.param_bytes * n_local
    if spec.sp_buffers:
        per_element = FP8_GATHERED_BYTES_PER_ELEMENT if spec.fp8 else spec.element
        gathered = per_element * spec.tokens * spec.cfg.hidden_size
        found["sp_gathered"] = {"mlp": 2 * gathered, "proj": gathered, "attention": 0.0,
                                "qkv": gathered}
    if spec.fsdp and spec.fp8 and copy_per_param:
        rowwise = 1.0  # FP8 data, one byte per element
        found["fsdp_module_copies"] = {
            "mlp": copy_per_param * layer_params["fc1"] + rowwise * layer_params["fc2"],
            "proj": copy_per_param * layer_params["attention output"],
            "attention": 0.0,
            "qkv": copy_per_param * layer_params["qkv"],
        }
    return found


def _input_batch(spec: StepSpec) -> float:
    """A bare stack's batch as chapter 08's workers hold it (``stack_batch``): the input
    ``[S, B, H]`` in the activation dtype and an FP32 target of the output's shape, both
    allocated before the first step and held through every step (0 otherwise). Under sequence
    parallelism a rank's share of the tokens, or, with ``whole_batch``, the group's whole
    batch: ``torch.chunk`` returns views, which keep the whole tensor's storage alive."""
    if not spec.stack_batch:
        return 0.0
    share = 1 if spec.whole_batch else spec.rep
    return (spec.element + 4) * spec.tokens * spec.cfg.hidden_size / share


def _outer_parameters(spec: StepSpec) -> dict[str, float]:
    """Parameters of embeddings, positions, final norm and (untied) head on this GPU."""
    cfg, tp = spec.cfg, spec.layout.tp
    h, vocab = cfg.hidden_size, cfg.vocab_size or 0
    return {
        "embedding": vocab * h / tp,
        "positions": cfg.max_seq_len * h if vocab and cfg.position_embedding == "learned" else 0,
        "norm": (2 * h if cfg.normalization == "LayerNorm" else h) if vocab else 0,
        "head": 0 if cfg.tied_embeddings or not vocab else vocab * h / tp,
    }


def _training_state(spec: StepSpec, n_local: float, fp8_gemm: float) -> dict[str, object]:
    """Parameters, master weights, optimizer states and gradient bytes per parameter, sharded
    by the ZeRO stage (Rajbhandari et al. 2020, sec. 5)."""
    weights, dp, stage = spec.parameter_layout, spec.layout.dp, spec.layout.zero_stage
    per_param = bytes_per_parameter(
        spec.compute,
        spec.optimizer_used,
        spec.fp32_grads,
        spec.hopper,
        weights=weights.name,
        momentum=spec.momentum if spec.optimizer_used == "sgd" else 0.0,
    )
    shard = {
        Part.PARAMETERS: dp if stage >= 3 else 1,
        Part.GRADIENTS: dp if stage >= 2 else 1,
        Part.MASTER_WEIGHTS: dp if stage >= 1 else 1,
        Part.OPTIMIZER_STATES: dp if stage >= 1 else 1,
    }
    stored = fp8_gemm * per_param[Part.PARAMETERS] + (n_local - fp8_gemm) * weights.param_bytes
    return {
        "per_parameter": per_param,
        "parameters": stored / shard[Part.PARAMETERS],
        "master": per_param[Part.MASTER_WEIGHTS] * n_local / shard[Part.MASTER_WEIGHTS],
        "states": per_param[Part.OPTIMIZER_STATES] * n_local / shard[Part.OPTIMIZER_STATES],
        "grad_per_param": per_param[Part.GRADIENTS] / shard[Part.GRADIENTS],
    }


def _outer_gradients(spec: StepSpec, outer_params: dict, grad: float) -> dict[str, float]:
    """Gradients of the head and final norm, of the head's weight, and of the embeddings."""
    tied = spec.cfg.tied_embeddings
    return {
        "head_gradients": grad * (outer_params["head"] + outer_params["norm"]),
        "tied_head_gradient": grad * (outer_params["embedding"] if tied else outer_params["head"]),
        "embedding_gradients": grad * (outer_params["embedding"] + outer_params["positions"]),
    }


def _scaling_state(spec: StepSpec) -> float:
    """FP8 scales and amax histories of every GEMM (delayed scaling keeps a history)."""
    if not spec.fp8:
        return 0.0
    history = spec.amax_history_len + 2 if spec.compute == "fp8-delayed" else 3
    return spec.cfg.num_layers * FP8_GEMMS_PER_LAYER * FP8_META_SLOTS_PER_GEMM * 4 * history


def _copy_per_parameter(spec: StepSpec) -> float:
    """Bytes of weight copies per GEMM parameter saved for the backward."""
    if spec.fp8 and not spec.parameter_layout.fp8_params:  # TE quantizes each weight per forward
        return 2 if spec.hopper else 1
    if spec.parameter_layout.autocast and not spec.fp8:  # TE casts FP32 weights to BF16
        return 2
    return 0


def _module_gemm(layer_params: dict) -> dict[str, float]:
    """GEMM parameters each module's backward frees the copies of (its own and those after)."""
    return {
        name: sum(layer_params[p] for p in params + MODULE_PARAMS_AFTER[name] if "norm" not in p)
        for name, params in MODULE_PARAMS.items()
    }


def _module_sizes(
    spec: StepSpec, layer_params: dict, saved: dict, copy_per_param: float, grad: float
) -> tuple[ModuleSizes, ...]:
    """Each module of a layer as its backward sees it, in the backward's order."""
    cfg, tp = spec.cfg, spec.layout.tp
    transients = backward_transients(cfg, max(1, round(spec.tokens)), spec.element, spec.fp8, tp)
    if spec.recompute == "selective":  # the attention output and statistics come back
        transients["attention"] += spec.element * spec.tokens * cfg.q_size / tp
    weights = spec.parameter_layout
    wgrad_cast = 2.0 if weights.param_bytes == 4 and spec.compute != "fp32" else 0.0
    gemm = _module_gemm(layer_params)
    return tuple(
        ModuleSizes(
            name=module,
            transient=transients[module],
            grads=grad * sum(layer_params[p] for p in MODULE_PARAMS[module]),
            grads_after=grad * sum(layer_params[p] for p in MODULE_PARAMS_AFTER[module]),
            wgrad_cast=wgrad_cast * gemm[module],
            weight_copies=copy_per_param * gemm[module],
            saved=sum(saved[name] for name in MODULE_SAVED[module]),
        )
        for module in ("mlp", "proj", "attention", "qkv")
    )


def _outer_sizes(spec: StepSpec, layer_input: float) -> OuterSizes:
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
    cfg, weights = spec.cfg, spec.parameter_layout
    h, element, tp = cfg.hidden_size, spec.element, spec.layout.tp
    tokens = spec.tokens / spec.rep  # sequence parallelism splits the [S, B, H] tensors
    if cfg.vocab_size is None:  # a bare stack of layers: its output, and the gradient handed in
        stack = layer_input
        if spec.stack_batch:  # mse_loss(out.float(), target): PyTorch's MSE on an FP32 copy
            fp32 = 4 * tokens * h
            # the FP32 copy, saved by mse_loss until its backward; the squared differences
            # before the mean, a moment; the FP32 input gradient of mse_loss's backward
            return OuterSizes(0.0, stack, fp32, fp32, fp32, 0.0, 0.0, 0.0, stack)
        return OuterSizes(0.0, stack, 0.0, 0.0, stack, 0.0, 0.0, 0.0, stack)
    logits = spec.tokens * cfg.vocab_size / tp  # vocabulary-parallel under tensor parallelism
    logit_bytes = 4 if spec.compute == "fp32" else 2
    upcast = 4  # lm_loss computes cross-entropy in FP32
    fp32_copy = 0 if logit_bytes == upcast else upcast  # .float() of FP32 logits copies nothing
    if cfg.normalization == "LayerNorm":  # on CUDA autocast's FP32 list: an FP32 copy is saved
        norm_input = 4 if spec.autocast else element
    else:  # rms_norm is on no autocast list: the fused kernel saves the input as it comes, the
        # composite path (FP32 weights, BF16 input) an FP32 upcast and the BF16 normalized input
        norm_input = 4 + 2 if spec.autocast and weights.param_bytes == 4 else element
    head_input = 2 if spec.autocast else element
    cast_head = spec.autocast and weights.param_bytes == 4  # FP32 weights: a BF16 copy
    stats = NORM_STATS_BYTES[cfg.normalization]
    head_weight = cfg.vocab_size * h / tp
    positions = 2 if cfg.position_embedding == "learned" else 1
    return OuterSizes(
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


def _optimizer_temporaries(
    spec: StepSpec, n_local: float, largest: float, fp8_gemm_params: float
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
    weights, optimizer = spec.parameter_layout, spec.optimizer_used
    if optimizer == "none":
        return 0.0, 0.0
    if weights.optimizer == "te-fused":
        fp8_cast = weights.fp8_params and spec.compute != "fp8-delayed"
        cast = 4 * fp8_gemm_params if fp8_cast else 0.0
        return (cast if optimizer == "adamw" else 0.0), MASTER_INIT_BYTES_PER_PARAMETER * largest
    if optimizer == "sgd":
        return 0.0, 0.0
    per_moment = weights.state_bytes
    temporary = {
        "foreach": per_moment * n_local,
        "fused": 0.0,
        "for-loop": 3 * per_moment * largest,
    }
    return temporary[spec.adamw_impl], 0.0
