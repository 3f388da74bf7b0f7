"""``Linear``, ``LayerNorm``, ``RMSNorm``, ``LayerNormLinear`` and ``LayerNormMLP`` of TE 2.20 (CPU
reference).

Mirrors ``transformer_engine/pytorch/module/{linear,layernorm,rmsnorm,layernorm_linear,
layernorm_mlp}.py``: the same constructor arguments, defaults and parameter names
(``weight``, ``bias``, ``layer_norm_weight``, ``fc1_weight`` ...), so a TE module's
``state_dict`` loads into its reference twin. Outside ``autocast`` every GEMM runs in the
parameter dtype; inside, :func:`fp8_gemm` quantizes inputs and weights (forward format) and
the output gradient (backward format), accumulates in FP32 and returns the activation dtype.
With a ``tp_group`` of several ranks, ``parallel_mode="column"``/``"row"`` (and
``set_parallel_mode`` of ``LayerNormMLP``) split the weights and add the collectives of
:mod:`fp8lab.reference.parallel`, as TE does.

Arguments the reference does not model raise ``NotImplementedError`` naming them.
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from fp8lab.reference import parallel
from fp8lab.reference import quantization as q
from fp8lab.reference import recipe as recipes

DEFAULT_INIT_STD = 0.023


def _refuse(module: str, **arguments) -> None:
    """Raise for arguments given values the reference does not model."""
    for name, (value, allowed) in arguments.items():
        if value not in allowed:
            raise NotImplementedError(
                f"{module}({name}={value!r}) is not modelled by the CPU reference "
                f"(supported: {', '.join(map(repr, allowed))}); use Transformer Engine"
            )


def _refuse_unknown(module: str, extra: dict) -> None:
    if extra:
        raise NotImplementedError(
            f"{module}: argument(s) {', '.join(sorted(extra))} not modelled by the CPU "
            "reference; use Transformer Engine on a GPU"
        )


def check_parallel(
    module: str,
    tp_group=None,
    tp_size: int = 1,
    sequence_parallel: bool = False,
    parallel_mode=None,
    set_parallel_mode: bool = False,
) -> int:
    """The tensor-parallel size of a module, read from its arguments as TE reads them.

    ``tp_group`` (a ``torch.distributed`` group) sets it; ``tp_size`` > 1 without a group is
    refused (TE would wait for ``set_tensor_parallel_group``). With one rank every parallel
    argument is a no-op, as in TE.
    """
    if parallel_mode not in parallel.MODES:
        raise ValueError(
            f"{module}: parallel_mode={parallel_mode!r} must be None, 'row' or 'column'"
        )
    del sequence_parallel, set_parallel_mode  # read by each module
    return parallel.tp_world_size(module, tp_group, tp_size)


def _device(device) -> torch.device:
    device = torch.device("cpu" if device is None else device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "device='cuda' but this machine has no CUDA GPU; the CPU reference runs on 'cpu'"
        )
    return device


def _init_weight(shape, dtype, device, init_method) -> nn.Parameter:
    weight = torch.empty(shape, dtype=dtype, device=device)
    if init_method is None:
        nn.init.normal_(weight, std=DEFAULT_INIT_STD)
    else:
        init_method(weight)
    return nn.Parameter(weight)


def _quantize_weight_at_init(module: nn.Module, names: tuple[str, ...]) -> None:
    """Under ``quantized_model_init``: replace weights by their FP8 values, decoded.

    As in TE, the cast uses the weight quantizer of the recipe: delayed scaling casts with the
    quantizer's fresh scale, 1.0 (TE's ``DelayedScalingRecipeState`` starts from ones), the other
    recipes with the weight's own amax. Each weight remembers its module, so that an optimizer with
    master weights can write FP8 values back (:func:`requantize_fp8_weight`).
    """
    recipe = q.STATE.model_init_recipe
    if recipe is None:
        return
    for name in names:
        weight = getattr(module, name)
        if q.STATE.model_init_preserve:
            q.attach_high_precision_init_val(weight)
        with torch.no_grad():
            weight.copy_(_quantize_weight(weight.detach(), recipe, 1.0).to(weight.dtype))
        weight._fp8lab_quantized = True
        weight._fp8lab_recipe, weight._fp8lab_slot = recipe, name
        weight._fp8lab_module = weakref.ref(module)


def _quantize_weight(values: torch.Tensor, recipe: recipes.Recipe, scale) -> torch.Tensor:
    """Decoded FP8 values of a weight: per-tensor ``scale`` under delayed scaling, else the
    recipe's own scales."""
    w2d = values.reshape(values.shape[0], -1)
    if recipe.delayed():
        dtype = q.fp8_dtype(recipe.fp8_format, backward=False)
        decoded = q.quantize_per_tensor(w2d, torch.as_tensor(scale, dtype=torch.float32), dtype)
        return decoded.dequantize().reshape(values.shape)
    return q.quantize_operand(w2d, "weight", recipe, None).reshape(values.shape)


def requantize_fp8_weight(weight: nn.Parameter, values: torch.Tensor) -> None:
    """Write ``values`` (FP32 master weights) into a weight built under ``quantized_model_init``,
    as TE's optimizers do: delayed scaling casts with the module's current weight scale (TE's
    fused FP8 Adam kernel), the other recipes quantize the values with their own amax
    (``QuantizedTensor.quantize_``)."""
    recipe = weight._fp8lab_recipe
    scale = 1.0
    module = weight._fp8lab_module()
    if recipe.delayed() and module is not None:
        # TransformerLayer's LayerNormMLP keeps one meta per GEMM; the others use the module's own
        meta = module.fp8_meta.get(weight._fp8lab_slot, module.fp8_meta)
        if isinstance(meta.get("recipe"), recipes.DelayedScaling):
            scale = meta["scaling_fwd"].scale[1].clone()
    with torch.no_grad():
        weight.copy_(_quantize_weight(values.float(), recipe, scale).to(weight.dtype))


def make_fp8_meta(recipe: recipes.Recipe | None) -> dict:
    history = recipe.amax_history_len if isinstance(recipe, recipes.DelayedScaling) else 1
    return {
        "scaling_fwd": q.ScalingMeta.create(history, 3),
        "scaling_bwd": q.ScalingMeta.create(history, 2),
        "recipe": recipe,
    }


class _FP8Gemm(torch.autograd.Function):
    """``y = x @ w.T + b`` with TE's FP8 semantics (x: [tokens, in], w: [out, in])."""

    @staticmethod
    def forward(
        ctx,
        x,
        weight,
        bias,
        recipe,
        meta,
        cached_weight,
        fuse_wgrad,
        reduce_bwd,
        bwd_metas,
        out_dtype,
        x_amax,
    ):
        q.assert_dim_for_fp8_exec(x, weight)
        xq = q.quantize_operand(x, "input", recipe, meta, amax=x_amax)
        wq = (
            cached_weight
            if cached_weight is not None
            else q.quantize_operand(weight, "weight", recipe, meta)
        )
        out = xq @ wq.t()
        if bias is not None:
            out = out + bias.float()
        block = isinstance(recipe, (recipes.Float8BlockScaling, recipes.MXFP8BlockScaling))
        xq_t = q.quantize_operand(x, "input", recipe, meta, columnwise=True) if block else xq
        ctx.save_for_backward(xq_t, wq, weight)
        ctx.recipe, ctx.meta, ctx.has_bias, ctx.x_dtype = recipe, meta, bias is not None, out_dtype
        ctx.fuse_wgrad, ctx.reduce_bwd, ctx.bwd_metas = fuse_wgrad, reduce_bwd, bwd_metas
        return out.to(out_dtype), wq

    @staticmethod
    def backward(ctx, grad_out, _grad_wq):
        xq_t, wq, weight = ctx.saved_tensors
        grad2d = grad_out.reshape(-1, grad_out.shape[-1])
        gq = q.quantize_operand(grad2d, "grad_output", ctx.recipe, ctx.meta)
        block = isinstance(ctx.recipe, (recipes.Float8BlockScaling, recipes.MXFP8BlockScaling))
        gq_t = (
            q.quantize_operand(grad2d, "grad_output", ctx.recipe, ctx.meta, columnwise=True)
            if block
            else gq
        )
        grad_x = (gq @ wq).to(ctx.x_dtype)
        wgrad = gq_t.t() @ xq_t
        grad_bias = grad2d.float().sum(0).to(weight.dtype) if ctx.has_bias else None
        if ctx.fuse_wgrad:  # TE: the first micro-batch's wgrad GEMM overwrites main_grad
            (weight.main_grad.copy_ if ctx.fuse_wgrad == "overwrite" else weight.main_grad.add_)(
                wgrad
            )
            grad_weight = None
        else:
            grad_weight = wgrad.to(weight.dtype)
        if ctx.reduce_bwd:
            q.update_backward_metas(ctx.bwd_metas)
        return grad_x, grad_weight, grad_bias, None, None, None, None, None, None, None, None


class _MainGradAccumulate(torch.autograd.Function):
    """A high-precision GEMM whose weight gradient goes into ``weight.main_grad``
    (fuse_wgrad_accumulation)."""

    @staticmethod
    def forward(ctx, x, weight, bias, mode):
        ctx.save_for_backward(x, weight)
        ctx.has_bias, ctx.mode = bias is not None, mode
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        wgrad = grad_out.t().float() @ x.float()
        (weight.main_grad.copy_ if ctx.mode == "overwrite" else weight.main_grad.add_)(wgrad)
        return grad_out @ weight, None, grad_out.sum(0) if ctx.has_bias else None, None


class _GemmModule(nn.Module):
    """Shared machinery: FP8 meta, the weight cache for micro-batches, the GEMM call."""

    def _setup_gemm_state(self, fuse_wgrad_accumulation: bool):
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.fp8_meta = make_fp8_meta(None)
        self._weight_cache: dict[str, torch.Tensor] = {}

    def _make_norm_parameters(
        self, size: int, normalization: str, zero_centered_gamma: bool, dtype, device
    ) -> None:
        """The fused input norm's gamma (``layer_norm_weight``) and, for LayerNorm, beta."""
        self.layer_norm_weight = _norm_weight(size, zero_centered_gamma, dtype, device)
        self.layer_norm_bias = (
            nn.Parameter(torch.zeros(size, dtype=dtype, device=device))
            if normalization == "LayerNorm"
            else None
        )

    def _meta_for(self, name: str, recipe: recipes.Recipe) -> dict:
        """The FP8 meta of GEMM ``name``, made afresh when the recipe (or its history length)
        changed; one meta per GEMM so each weight keeps its own history, as in TE's multi-GEMM
        modules."""
        if (
            self.fp8_meta["recipe"] is None
            or type(self.fp8_meta["recipe"]) is not type(recipe)
            or (
                recipe.delayed()
                and self.fp8_meta["scaling_fwd"].amax_history.shape[0] != recipe.amax_history_len
            )
        ):
            self.fp8_meta = make_fp8_meta(recipe)
        if name == "weight":
            return self.fp8_meta
        return self.fp8_meta.setdefault(name, make_fp8_meta(recipe))

    def _gemm(
        self,
        x2d: torch.Tensor,
        weight: nn.Parameter,
        bias: torch.Tensor | None,
        name: str,
        is_first_microbatch: bool | None,
        out_dtype: torch.dtype | None = None,
        input_amax: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x2d @ weight.T + bias``; under autocast an FP8 GEMM whose output has ``out_dtype``
        (default: the input's; fused producers hand over FP32 values, as TE's fused casts do).
        ``input_amax``: the amax a producing kernel measured before rounding its output to 16
        bits."""
        if self.fuse_wgrad_accumulation and not hasattr(weight, "main_grad"):
            raise RuntimeError(
                f"fuse_wgrad_accumulation=True needs {name}.main_grad (an FP32 tensor of the "
                "weight's shape) to be set before the backward"
            )
        # with is_first_microbatch=True, TE's wgrad GEMM overwrites main_grad instead of adding
        fuse = self.fuse_wgrad_accumulation and (
            "overwrite" if is_first_microbatch else "accumulate"
        )
        if not q.STATE.enabled:
            if self.fuse_wgrad_accumulation:
                return _MainGradAccumulate.apply(x2d, weight, bias, fuse)
            return F.linear(x2d, weight, bias)
        recipe = q.STATE.recipe
        meta = self._meta_for(name, recipe)
        bwd_metas = q.register_module_metas(meta, recipe)
        cached = self._weight_cache.get(name) if is_first_microbatch is False else None
        out, wq = _FP8Gemm.apply(
            x2d,
            weight,
            bias,
            recipe,
            meta,
            cached,
            fuse,
            bwd_metas is not None,
            bwd_metas,
            out_dtype or x2d.dtype,
            input_amax,
        )
        if is_first_microbatch is not None and cached is None:
            self._weight_cache[name] = wq.detach()
        return out


def _norm_weight(size: int, zero_centered_gamma: bool, dtype, device) -> nn.Parameter:
    """A norm's gamma: ones, or zeros when TE stores it zero-centred (gamma = 1 + weight)."""
    return nn.Parameter(
        torch.full((size,), 0.0 if zero_centered_gamma else 1.0, dtype=dtype, device=device)
    )


class _Norm(nn.Module):
    """What ``te.LayerNorm`` and ``te.RMSNorm`` share: their arguments, gamma and (LayerNorm)
    beta."""

    kind = "LayerNorm"

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-5,
        sequence_parallel: bool = False,
        params_dtype: torch.dtype | None = None,
        zero_centered_gamma: bool = False,
        device=None,
        **extra,
    ):
        super().__init__()
        _refuse_unknown(self.kind, extra)
        check_parallel(self.kind, sequence_parallel=sequence_parallel)
        dtype = params_dtype or torch.get_default_dtype()
        device = _device(device)
        self.eps, self.zero_centered_gamma = eps, zero_centered_gamma
        self.weight = _norm_weight(hidden_size, zero_centered_gamma, dtype, device)
        self.bias = (
            nn.Parameter(torch.zeros(hidden_size, dtype=dtype, device=device))
            if self.kind == "LayerNorm"
            else None
        )
        parallel.mark_sequence_parallel(self.weight, self.bias, value=sequence_parallel)


class LayerNorm(_Norm):
    """``te.LayerNorm(hidden_size, eps=1e-5, zero_centered_gamma=False)``, computed in FP32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps, self.zero_centered_gamma)


class RMSNorm(_Norm):
    """``te.RMSNorm(hidden_size, eps=1e-5, zero_centered_gamma=False)``, computed in FP32."""

    kind = "RMSNorm"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, self.zero_centered_gamma)


# Where TE 2.20 casts a kernel's FP32 result straight to FP8 instead of writing 16 bits first,
# per recipe kind (checked against TE on an H200; see tests/test_reference_parity.py).
FUSED_CASTS = {
    "LayerNorm": {"DelayedScaling", "MXFP8BlockScaling"},
    "RMSNorm": {"DelayedScaling", "MXFP8BlockScaling"},
    "activation": {"DelayedScaling", "MXFP8BlockScaling"},
    "gelu backward": {"DelayedScaling", "MXFP8BlockScaling"},
}


def fused_cast(kernel: str) -> bool:
    """True where TE casts this kernel's FP32 result straight to FP8 under the active recipe."""
    return q.STATE.enabled and type(q.STATE.recipe).__name__ in FUSED_CASTS[kernel]


class _RoundForward(torch.autograd.Function):
    """Round values to a 16-bit dtype but keep FP32 storage, and pass the FP32 gradient through:
    a kernel whose backward feeds an FP8 cast directly, without a 16-bit gradient in between."""

    @staticmethod
    def forward(ctx, x, dtype):
        return x.to(dtype).float()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def layer_norm(x, weight, bias, eps, zero_centered_gamma=False):
    gamma = weight.float() + 1 if zero_centered_gamma else weight.float()
    out = F.layer_norm(
        x.float(), x.shape[-1:], gamma, bias.float() if bias is not None else None, eps
    )
    return out.to(x.dtype)


def rms_norm(x, weight, eps, zero_centered_gamma=False):
    gamma = weight.float() + 1 if zero_centered_gamma else weight.float()
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * gamma
    return out.to(x.dtype)


def _norm(kind: str, x, weight, bias, eps, zero_centered_gamma):
    """The norm before a GEMM. Under delayed scaling TE fuses norm and cast, quantizing the FP32
    result; with other recipes (the scale needs the amax first) the norm writes the input dtype
    and that is quantized, as measured against TE 2.20 on an H200."""
    norm = layer_norm if kind == "LayerNorm" else (lambda t, w, b, e, z: rms_norm(t, w, e, z))
    if fused_cast(kind):
        return norm(x.float(), weight, bias, eps, zero_centered_gamma)
    return norm(x, weight, bias, eps, zero_centered_gamma)


class Linear(_GemmModule):
    """``te.Linear(in_features, out_features, bias=True, ...)``: ``y = x W^T + b``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        sequence_parallel: bool = False,
        fuse_wgrad_accumulation: bool = False,
        tp_group=None,
        tp_size: int = 1,
        get_rng_state_tracker=None,
        rng_tracker_name=None,
        init_method=None,
        bias: bool = True,
        return_bias: bool = False,
        params_dtype: torch.dtype | None = None,
        parallel_mode=None,
        parameters_split=None,
        device=None,
        name: str | None = None,
        **extra,
    ):
        super().__init__()
        _refuse_unknown("Linear", extra)
        tp = check_parallel("Linear", tp_group, tp_size, sequence_parallel, parallel_mode)
        _refuse("Linear", parameters_split=(parameters_split, (None,)))
        dtype = params_dtype or torch.get_default_dtype()
        device = _device(device)
        self.tp_group, self.tp_size, self.parallel_mode = tp_group, tp, parallel_mode
        self.sequence_parallel = tp > 1 and sequence_parallel
        if parallel_mode == "column":
            out_features = parallel.divide(out_features, tp, "Linear: out_features")
        elif parallel_mode == "row":
            in_features = parallel.divide(in_features, tp, "Linear: in_features")
        self.in_features, self.out_features, self.return_bias = (
            in_features,
            out_features,
            return_bias,
        )
        self.weight = _init_weight((out_features, in_features), dtype, device, init_method)
        self.bias = (
            nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None
        )
        if parallel_mode == "row":
            parallel.mark_sequence_parallel(self.bias, value=self.sequence_parallel)
        self._setup_gemm_state(fuse_wgrad_accumulation)
        _quantize_weight_at_init(self, ("weight",))

    def forward(
        self,
        inp: torch.Tensor,
        is_first_microbatch: bool | None = None,
        fp8_output: bool = False,
        fp8_grad: bool = False,
    ):
        _refuse("Linear.forward", fp8_output=(fp8_output, (False,)), fp8_grad=(fp8_grad, (False,)))
        row = self.parallel_mode == "row"  # TE adds a row-parallel bias after the reduction
        if self.parallel_mode == "column":
            inp = parallel.column_input(inp, self.tp_group, self.tp_size, self.sequence_parallel)
        bias = None if (self.return_bias or row) else self.bias
        out = self._gemm(
            inp.reshape(-1, inp.shape[-1]), self.weight, bias, "weight", is_first_microbatch
        )
        out = out.reshape(*inp.shape[:-1], self.out_features)
        if row:
            out = parallel.row_output(out, self.tp_group, self.tp_size, self.sequence_parallel)
            if self.bias is not None and not self.return_bias:
                out = out + self.bias.to(out.dtype)
        return (out, self.bias) if self.return_bias else out


def _check_layernorm_linear_arguments(extra, parallel_arguments, normalization, parameters_split):
    """Refuse what ``LayerNormLinear`` does not model; returns the tensor-parallel size.
    ``parallel_arguments``: ``(tp_group, tp_size, sequence_parallel, parallel_mode)``."""
    tp_group, tp_size, sequence_parallel, parallel_mode = parallel_arguments
    extra = {
        k: v for k, v in extra.items() if not (k.startswith("ub_") and not v) and k != "fp8_output"
    }
    _refuse_unknown("LayerNormLinear", extra)
    tp = check_parallel("LayerNormLinear", tp_group, tp_size, sequence_parallel, parallel_mode)
    _refuse(
        "LayerNormLinear",
        normalization=(normalization, ("LayerNorm", "RMSNorm")),
        parallel_mode=(parallel_mode, (None, "column")),
    )
    if tp > 1 and parameters_split is not None:
        raise NotImplementedError(
            "LayerNormLinear: parameters_split with tensor parallelism is not modelled by "
            "the CPU reference (use fuse_qkv_params=True in TransformerLayer)"
        )
    return tp


class LayerNormLinear(_GemmModule):
    """``te.LayerNormLinear``: a norm (LayerNorm or RMSNorm) fused with the Linear that follows
    it."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        eps: float = 1e-5,
        sequence_parallel: bool = False,
        fuse_wgrad_accumulation: bool = False,
        tp_group=None,
        tp_size: int = 1,
        get_rng_state_tracker=None,
        init_method=None,
        bias: bool = True,
        normalization: str = "LayerNorm",
        return_bias: bool = False,
        params_dtype: torch.dtype | None = None,
        parallel_mode=None,
        return_layernorm_output: bool = False,
        return_layernorm_output_gathered: bool = False,
        parameters_split=None,
        zero_centered_gamma: bool = False,
        device=None,
        name: str | None = None,
        **extra,
    ):
        super().__init__()
        tp = _check_layernorm_linear_arguments(
            extra,
            (tp_group, tp_size, sequence_parallel, parallel_mode),
            normalization,
            parameters_split,
        )
        dtype = params_dtype or torch.get_default_dtype()
        device = _device(device)
        self.tp_group, self.tp_size, self.parallel_mode = tp_group, tp, parallel_mode
        self.sequence_parallel = tp > 1 and sequence_parallel
        if parallel_mode == "column":
            out_features = parallel.divide(out_features, tp, "LayerNormLinear: out_features")
        self.normalization, self.eps, self.zero_centered_gamma = (
            normalization,
            eps,
            zero_centered_gamma,
        )
        self.return_bias, self.return_layernorm_output = return_bias, return_layernorm_output
        self.in_features, self.out_features = in_features, out_features
        self._make_norm_parameters(in_features, normalization, zero_centered_gamma, dtype, device)
        parallel.mark_sequence_parallel(
            self.layer_norm_weight, self.layer_norm_bias, value=self.sequence_parallel
        )
        weights = self._make_weights(parameters_split, bias, dtype, device, init_method)
        self._setup_gemm_state(fuse_wgrad_accumulation)
        _quantize_weight_at_init(self, weights)

    def _make_weights(self, parameters_split, bias: bool, dtype, device, init_method):
        """The GEMM weight and bias, whole or split into named parts (``query_weight``, ...);
        returns the weights' attribute names."""
        in_features, out_features = self.in_features, self.out_features
        if parameters_split is None:
            self.split = None
            self.weight = _init_weight((out_features, in_features), dtype, device, init_method)
            self.bias = (
                nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device))
                if bias
                else None
            )
            return ("weight",)
        sizes = (
            dict(parameters_split)
            if isinstance(parameters_split, dict)
            else {n: out_features // len(parameters_split) for n in parameters_split}
        )
        if sum(sizes.values()) != out_features:
            raise ValueError(
                f"parameters_split sizes {sizes} must add up to out_features={out_features}"
            )
        self.split = sizes
        for part, size in sizes.items():
            setattr(
                self,
                f"{part.rstrip('_')}_weight",
                _init_weight((size, in_features), dtype, device, init_method),
            )
            setattr(
                self,
                f"{part.rstrip('_')}_bias",
                nn.Parameter(torch.zeros(size, dtype=dtype, device=device)) if bias else None,
            )
        return tuple(f"{p.rstrip('_')}_weight" for p in sizes)

    def _weight_and_bias(self):
        if self.split is None:
            return self.weight, self.bias
        parts = [p.rstrip("_") for p in self.split]
        weight = torch.cat([getattr(self, f"{p}_weight") for p in parts])
        biases = [getattr(self, f"{p}_bias") for p in parts]
        return weight, (torch.cat(biases) if biases[0] is not None else None)

    def forward(
        self, inp: torch.Tensor, is_first_microbatch: bool | None = None, fp8_output: bool = False
    ):
        _refuse("LayerNormLinear.forward", fp8_output=(fp8_output, (False,)))
        if self.split is not None and self.fuse_wgrad_accumulation:
            raise NotImplementedError(
                "fuse_wgrad_accumulation with parameters_split is not modelled by the CPU reference"
            )
        normed = _norm(
            self.normalization,
            inp,
            self.layer_norm_weight,
            self.layer_norm_bias,
            self.eps,
            self.zero_centered_gamma,
        )
        weight, bias = self._weight_and_bias()
        gathered = normed
        if self.parallel_mode == "column":
            gathered = parallel.column_input(
                normed, self.tp_group, self.tp_size, self.sequence_parallel
            )
        out = self._gemm(
            gathered.reshape(-1, inp.shape[-1]),
            weight,
            None if self.return_bias else bias,
            "weight",
            is_first_microbatch,
            inp.dtype,
        )
        out = out.reshape(*gathered.shape[:-1], self.out_features)
        result = (out, bias) if self.return_bias else (out,)
        if self.return_layernorm_output:
            result = result + (normed.to(inp.dtype),)
        return result if len(result) > 1 else result[0]


def apply_activation(x: torch.Tensor, kind: str) -> torch.Tensor:
    """TE's activations: GeLU (tanh approximation), ReLU, and the gated SwiGLU / GeGLU / ReGLU
    (gate on the first half, as TE and unlike PyTorch's GLU)."""
    if kind == "gelu":
        return F.gelu(x, approximate="tanh")
    if kind == "relu":
        return F.relu(x)
    if kind == "silu":
        return F.silu(x)
    gate, value = x.chunk(2, dim=-1)
    act = {"swiglu": F.silu, "geglu": lambda t: F.gelu(t, approximate="tanh"), "reglu": F.relu}[
        kind
    ]
    return act(gate) * value


ACTIVATIONS = ("gelu", "relu", "silu", "swiglu", "geglu", "reglu")


def _check_mlp_arguments(extra, parallel_arguments, normalization, activation, activation_params):
    """Refuse what ``LayerNormMLP`` does not model; returns the tensor-parallel size.
    ``parallel_arguments``: ``(tp_group, tp_size, sequence_parallel, set_parallel_mode)``."""
    tp_group, tp_size, sequence_parallel, set_parallel_mode = parallel_arguments
    extra = {k: v for k, v in extra.items() if not (k.startswith("ub_") and not v)}
    _refuse_unknown("LayerNormMLP", extra)
    tp = check_parallel(
        "LayerNormMLP",
        tp_group,
        tp_size,
        sequence_parallel,
        set_parallel_mode=set_parallel_mode,
    )
    _refuse(
        "LayerNormMLP",
        normalization=(normalization, ("LayerNorm", "RMSNorm")),
        activation=(activation, ACTIVATIONS),
        activation_params=(activation_params, (None,)),
    )
    return tp


class LayerNormMLP(_GemmModule):
    """``te.LayerNormMLP``: norm, FC1, activation, FC2 (one fused module in TE)."""

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        eps: float = 1e-5,
        sequence_parallel: bool = False,
        return_bias: bool = False,
        get_rng_state_tracker=None,
        tp_group=None,
        tp_size: int = 1,
        init_method=None,
        bias: bool = True,
        normalization: str = "LayerNorm",
        activation: str = "gelu",
        activation_params=None,
        output_layer_init_method=None,
        fuse_wgrad_accumulation: bool = False,
        params_dtype: torch.dtype | None = None,
        return_layernorm_output: bool = False,
        return_layernorm_output_gathered: bool = False,
        seq_length=None,
        micro_batch_size=None,
        set_parallel_mode: bool = False,
        zero_centered_gamma: bool = False,
        device=None,
        name: str | None = None,
        **extra,
    ):
        super().__init__()
        parallel_arguments = (tp_group, tp_size, sequence_parallel, set_parallel_mode)
        tp = _check_mlp_arguments(
            extra, parallel_arguments, normalization, activation, activation_params
        )
        dtype = params_dtype or torch.get_default_dtype()
        device = _device(device)
        gated = activation in ("swiglu", "geglu", "reglu")
        # FC1 column- and FC2 row-parallel; sizes split whenever tp > 1, collectives only with
        # set_parallel_mode (TE's LayerNormMLP)
        self.tp_group, self.tp_size, self.set_parallel_mode = tp_group, tp, set_parallel_mode
        self.sequence_parallel = tp > 1 and sequence_parallel
        ffn_hidden_size = parallel.divide(ffn_hidden_size, tp, "LayerNormMLP: ffn_hidden_size")
        self.normalization, self.activation, self.eps = normalization, activation, eps
        self.zero_centered_gamma, self.return_bias = zero_centered_gamma, return_bias
        self.return_layernorm_output = return_layernorm_output
        self._make_norm_parameters(hidden_size, normalization, zero_centered_gamma, dtype, device)
        fc1_out = 2 * ffn_hidden_size if gated else ffn_hidden_size
        self._make_fc_parameters(
            (hidden_size, ffn_hidden_size, fc1_out),
            bias,
            dtype,
            device,
            (init_method, output_layer_init_method or init_method),
        )
        parallel.mark_sequence_parallel(
            self.layer_norm_weight, self.layer_norm_bias, value=self.sequence_parallel
        )
        if set_parallel_mode:
            parallel.mark_sequence_parallel(self.fc2_bias, value=self.sequence_parallel)
        self._setup_gemm_state(fuse_wgrad_accumulation)
        _quantize_weight_at_init(self, ("fc1_weight", "fc2_weight"))

    def _make_fc_parameters(self, sizes, bias: bool, dtype, device, init_methods) -> None:
        """FC1 ``[fc1_out, H]`` and FC2 ``[H, F]`` weights (``sizes``: H, F, fc1_out), and their
        biases."""
        hidden_size, ffn_hidden_size, fc1_out = sizes
        fc1_init, fc2_init = init_methods
        self.fc1_weight = _init_weight((fc1_out, hidden_size), dtype, device, fc1_init)
        self.fc1_bias = (
            nn.Parameter(torch.zeros(fc1_out, dtype=dtype, device=device)) if bias else None
        )
        self.fc2_weight = _init_weight((hidden_size, ffn_hidden_size), dtype, device, fc2_init)
        self.fc2_bias = (
            nn.Parameter(torch.zeros(hidden_size, dtype=dtype, device=device)) if bias else None
        )

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None):
        normed = _norm(
            self.normalization,
            inp,
            self.layer_norm_weight,
            self.layer_norm_bias,
            self.eps,
            self.zero_centered_gamma,
        )
        dtype = inp.dtype
        gathered = normed
        if self.set_parallel_mode:
            gathered = parallel.column_input(
                normed, self.tp_group, self.tp_size, self.sequence_parallel
            )
        hidden = self._gemm(
            gathered.reshape(-1, inp.shape[-1]),
            self.fc1_weight,
            self.fc1_bias,
            "fc1_weight",
            is_first_microbatch,
            torch.float32 if q.STATE.enabled else dtype,
        )
        if q.STATE.enabled:
            # FC1 writes 16 bits; its gradient reaches FC1's FP8 cast in FP32 where TE fuses dGeLU
            # and cast
            fused_backward = self.activation == "gelu" and fused_cast("gelu backward")
            hidden = (
                _RoundForward.apply(hidden, dtype) if fused_backward else hidden.to(dtype).float()
            )
        # TE computes the activation in FP32; where it fuses activation and cast, that result is
        # quantized;
        # under current scaling it writes 16 bits but takes the amax of the FP32 values (one kernel)
        activated = apply_activation(hidden.float(), self.activation)
        amax = None
        if fused_cast("activation"):
            hidden = activated
        else:
            hidden = activated.to(dtype)
            if q.STATE.enabled and isinstance(q.STATE.recipe, recipes.Float8CurrentScaling):
                amax = q.amax_of(activated.detach())
        unfused_bias = self.set_parallel_mode  # TE adds FC2's bias after the reduction
        out = self._gemm(
            hidden,
            self.fc2_weight,
            None if (self.return_bias or unfused_bias) else self.fc2_bias,
            "fc2_weight",
            is_first_microbatch,
            dtype,
            input_amax=amax,
        )
        out = out.reshape(*gathered.shape[:-1], inp.shape[-1])
        if self.set_parallel_mode:
            out = parallel.row_output(out, self.tp_group, self.tp_size, self.sequence_parallel)
            if self.fc2_bias is not None and not self.return_bias:
                out = out + self.fc2_bias.to(out.dtype)
        result = (out, self.fc2_bias) if self.return_bias else (out,)
        if self.return_layernorm_output:
            result = result + (normed.to(inp.dtype),)
        return result if len(result) > 1 else result[0]


def init_method_normal(std: float):
    """TE's ``init_method_normal``: a normal initialiser with standard deviation ``std``."""
    return lambda tensor: nn.init.normal_(tensor, std=std)


def scaled_init_method_normal(std: float, num_layers: int):
    return init_method_normal(std / math.sqrt(2.0 * num_layers))
