"""What Transformer Engine does to a tensor before an FP8 GEMM, in plain PyTorch.

Mirrors ``transformer_engine/pytorch/quantization.py`` (autocast, quantized_model_init, the
delayed-scaling update) and the cast kernels of ``transformer_engine/common`` (``cast``,
``recipe/delayed_scaling.cu``, ``recipe/recipe_common.cuh``):

* casting multiplies by the scale in FP32, saturates to the format's largest finite value
  and rounds to nearest even (``torch`` casts do not saturate, so values are clamped first);
  the amax recorded is that of the unscaled input;
* per-tensor scales: ``fp8_max / amax`` (delayed: amax from the history, divided by
  ``2**margin``; zero or non-finite amax keeps the previous scale; an infinite scale becomes
  FP32's max); current scaling uses the tensor's own amax (a zero amax gives scale 1);
* delayed scaling: each module keeps ``amax_history`` of shape ``[amax_history_len, 3]``
  (input, weight, output) for the forward and ``[len, 2]`` (grad output, grad input) for the
  backward; a cast takes the max of its amax and row 0 (several casts between two updates
  keep the largest); the forward histories are updated when the
  outermost ``autocast`` exits, the backward ones after the backward of the first module
  that ran in it: amax = max over the history (or row 0), then the history rolls by one and
  row 0 is zeroed; before the update, the newest amaxes are all-reduced (MAX) over the
  autocast's ``amax_reduction_group`` -- or, as in TE, over the default (world) group when it is
  None and torch.distributed is initialized -- unless the recipe says ``reduce_amax=False``;
* block scaling (1x128 / 128x128, power-of-two FP32 scales), MXFP8 (1x32, E8M0 scales) and
  NVFP4 (1x16 E2M1 with E4M3 block scales and an FP32 tensor scale) are quantized block by
  block; the GEMM then runs in FP32 on the decoded values, which equals FP32 accumulation
  of the FP8 products.
"""

from __future__ import annotations

import contextlib
import types
import warnings
from collections import deque
from dataclasses import dataclass, field

import torch

from fp8lab.formats import FP32_MAX, divide, scale_from_amax
from fp8lab.reference import parallel
from fp8lab.reference import recipe as recipes

FP8_DTYPES = {448.0: torch.float8_e4m3fn, 57344.0: torch.float8_e5m2}
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


# --- casts -------------------------------------------------------------------------------------


def fp8_dtype(fmt: recipes.Format, backward: bool) -> torch.dtype:
    """The torch dtype of a recipe's format in the forward or backward pass."""
    return FP8_DTYPES[float(fmt.value.max_bwd if backward else fmt.value.max_fwd)]


def fp8_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def cast_to_fp8(x: torch.Tensor, scale: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
    """``saturate(x * scale)`` rounded to nearest even in ``dtype``; NaN stays NaN."""
    limit = fp8_max(dtype)
    return (x.float() * scale).clamp(-limit, limit).to(dtype)


def amax_of(x: torch.Tensor) -> torch.Tensor:
    return x.detach().abs().amax().float() if x.numel() else torch.zeros((), dtype=torch.float32)


@dataclass
class Quantized:
    """An FP8 tensor: the bytes, and the per-tensor (or per-block) inverse scale to decode them."""

    data: torch.Tensor
    scale_inv: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        return self.data.float() * self.scale_inv


def quantize_per_tensor(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> Quantized:
    return Quantized(cast_to_fp8(x, scale, dtype), (1.0 / scale).float())


def _blocks(x: torch.Tensor, block: int) -> tuple[torch.Tensor, int]:
    """View ``x`` (2-D) as ``[rows, n_blocks, block]``, padding the last dim with zeros."""
    rows, cols = x.shape
    pad = (-cols) % block
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(rows, -1, block), cols


def quantize_blocks_1d(
    x2d: torch.Tensor, dtype: torch.dtype, block: int, power_of_2: bool
) -> Quantized:
    """One scale per ``1 x block`` run of each row (Float8BlockScaling for activations and
    gradients)."""
    tiles, cols = _blocks(x2d.float(), block)
    scale = scale_from_amax(tiles.abs().amax(-1, keepdim=True), fp8_max(dtype), power_of_2)
    data = cast_to_fp8(tiles, scale, dtype).reshape(x2d.shape[0], -1)[:, :cols]
    inv = (1.0 / scale).expand_as(tiles).reshape(x2d.shape[0], -1)[:, :cols]
    return Quantized(data, inv)


def quantize_blocks_2d(
    w2d: torch.Tensor, dtype: torch.dtype, block: int, power_of_2: bool
) -> Quantized:
    """One scale per ``block x block`` tile (Float8BlockScaling for weights)."""
    rows, cols = w2d.shape
    padded = torch.nn.functional.pad(w2d.float(), (0, (-cols) % block, 0, (-rows) % block))
    r, c = padded.shape
    tiles = padded.reshape(r // block, block, c // block, block)
    scale = scale_from_amax(tiles.abs().amax(dim=(1, 3), keepdim=True), fp8_max(dtype), power_of_2)
    data = cast_to_fp8(tiles, scale, dtype).reshape(r, c)[:rows, :cols]
    inv = (1.0 / scale).expand_as(tiles).reshape(r, c)[:rows, :cols]
    return Quantized(data, inv)


def e8m0_scale(amax: torch.Tensor, max_value: float) -> torch.Tensor:
    """MXFP8 block scale: the power of two ``2**ceil(log2(amax / max))`` (E8M0), 1 for a zero
    block."""
    ratio = amax.float() / max_value
    exponent = torch.where(ratio > 0, torch.ceil(torch.log2(ratio)), torch.zeros_like(ratio))
    return torch.exp2(exponent.clamp(-127, 127))


def quantize_mxfp8(
    x2d: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn, block: int = 32
) -> Quantized:
    """MXFP8: 32 consecutive values share one E8M0 scale; values are ``x / scale`` in FP8."""
    tiles, cols = _blocks(x2d.float(), block)
    decode = e8m0_scale(tiles.abs().amax(-1, keepdim=True), fp8_max(dtype))
    data = cast_to_fp8(tiles, 1.0 / decode, dtype).reshape(x2d.shape[0], -1)[:, :cols]
    return Quantized(data, decode.expand_as(tiles).reshape(x2d.shape[0], -1)[:, :cols])


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest FP4 E2M1 value (ties to the even code), saturating at +-6."""
    magnitude = x.abs().clamp(max=6.0)
    grid = E2M1_VALUES.to(x.device)
    distance = (magnitude.unsqueeze(-1) - grid).abs()
    nearest = distance.min(-1, keepdim=True).values
    candidates = distance == nearest
    codes = torch.arange(len(grid), device=x.device)
    # among equally near grid points prefer the even code (its mantissa bit is 0)
    preference = torch.where(
        candidates, (codes % 2) * 2 + codes * 1e-3, torch.full_like(distance, 1e9)
    )
    return torch.sign(x) * grid[preference.argmin(-1)]


@dataclass
class NVFP4Quantized:
    """NVFP4: E2M1 values, an E4M3 scale per 16 values, and one FP32 scale for the tensor."""

    values: torch.Tensor  # E2M1 values held as float32 (torch has no unpacked FP4 dtype)
    block_scales: torch.Tensor  # E4M3, one per block
    tensor_scale: torch.Tensor  # FP32 encode scale: (448 * 6) / amax

    def dequantize(self) -> torch.Tensor:
        decode = self.block_scales.float() / self.tensor_scale
        rows = self.values.shape[0]
        tiles, cols = _blocks(self.values, 16)
        return (tiles * decode.unsqueeze(-1)).reshape(rows, -1)[:, :cols]


def quantize_nvfp4(x2d: torch.Tensor, block: int = 16) -> NVFP4Quantized:
    """NVFP4 with round-to-nearest-even and 1-D blocks (random Hadamard transform, stochastic
    rounding and 16x16 weight blocks, which the recipe also uses, are not modelled)."""
    x = x2d.float()
    tensor_scale = scale_from_amax(amax_of(x), 448.0 * 6.0)
    tiles, cols = _blocks(x, block)
    block_decode = tiles.abs().amax(-1) / 6.0
    block_scales = cast_to_fp8(block_decode * tensor_scale, 1.0, torch.float8_e4m3fn)
    decode = block_scales.float() / tensor_scale
    safe = torch.where(decode > 0, decode, torch.ones_like(decode))
    values = round_to_e2m1(tiles / safe.unsqueeze(-1)).reshape(x.shape[0], -1)[:, :cols]
    return NVFP4Quantized(values, block_scales, tensor_scale)


# --- state: autocast, quantized_model_init, delayed-scaling meta --------------------------------


@dataclass
class ScalingMeta:
    """Delayed-scaling state of one module in one direction (``scaling_fwd`` / ``scaling_bwd`` in
    TE)."""

    amax_history: torch.Tensor
    scale: torch.Tensor
    stash: deque = field(default_factory=deque)

    @classmethod
    def create(cls, history_len: int, slots: int) -> ScalingMeta:
        return cls(torch.zeros(history_len, slots), torch.ones(slots))

    def update(self, fp8_max_value: float, recipe: recipes.DelayedScaling) -> None:
        """Scale from the history, then roll it and zero row 0 (TE's ``_amax_and_scale_update``)."""
        if callable(recipe.amax_compute_algo):
            amax = recipe.amax_compute_algo(self.amax_history)
        elif recipe.amax_compute_algo == "max":
            amax = self.amax_history.max(dim=0).values
        else:
            amax = self.amax_history[0].clone()
        if self.amax_history.shape[0] > 1:
            self.amax_history.copy_(torch.roll(self.amax_history, -1, 0))
        self.amax_history[0].fill_(0.0)
        if recipe.scaling_factor_compute_algo is not None:
            self.scale.copy_(
                recipe.scaling_factor_compute_algo(amax, self.scale, fp8_max_value, recipe)
            )
            return
        new = divide(fp8_max_value * 2.0**-recipe.margin, amax)
        new = torch.where(amax > 0.0, new, self.scale)
        new = torch.where(torch.isfinite(amax), new, self.scale)
        new = torch.where(torch.isinf(new), torch.full_like(new, FP32_MAX), new)
        self.scale.copy_(new)


class _State:
    """Process-wide quantization state (TE's ``FP8GlobalStateManager``)."""

    def __init__(self):
        self.enabled = False
        self.recipe: recipes.Recipe | None = None
        self.depth = 0
        self.is_first_module = False
        self.forward_metas: list = []
        self.backward_metas: list = []
        self.model_init_recipe: recipes.Recipe | None = None
        self.model_init_preserve = False  # preserve_high_precision_init_val
        self.checkpoint_phase: str | None = None  # None, "forward" or "recompute"
        self.amax_group = None  # the amax_reduction_group of the innermost autocast
        self.checkpoint_first_metas: list | None = None
        self.recompute_first_metas: list | None = None


STATE = _State()


def get_default_recipe() -> recipes.Recipe:
    """TE's default on Hopper-class GPUs: delayed scaling."""
    return recipes.DelayedScaling()


def check_recipe_support(recipe: recipes.Recipe | None) -> None:
    if recipe is not None and not isinstance(recipe, recipes.Recipe):
        raise TypeError(f"recipe must be a transformer_engine recipe, got {type(recipe).__name__}")
    if isinstance(recipe, recipes.NVFP4BlockScaling):
        raise NotImplementedError(
            "NVFP4BlockScaling training is not modelled by the CPU reference (random "
            "Hadamard transform, stochastic rounding); use quantize_nvfp4() for its "
            "numerics, and Transformer Engine on a Blackwell GPU to train with it"
        )
    if recipe is not None and (
        getattr(recipe, "fp8_dpa", False) or getattr(recipe, "fp8_mha", False)
    ):
        raise NotImplementedError(
            "fp8_dpa / fp8_mha (FP8 attention) are not modelled by the CPU reference; "
            "use Transformer Engine on a GPU"
        )


def is_fp8_available(return_reason: bool = False):
    """FP8 GEMMs are emulated here, so always available (TE checks for sm_89+)."""
    return (True, "") if return_reason else True


class autocast:
    """``te.autocast``: quantize the GEMMs of TE modules run inside, following ``recipe``."""

    def __init__(
        self,
        enabled: bool = True,
        calibrating: bool = False,
        recipe: recipes.Recipe | None = None,
        amax_reduction_group=None,
        _graph: bool = False,
    ):
        if calibrating:
            raise NotImplementedError("calibrating=True is not modelled by the CPU reference")
        if _graph:
            raise NotImplementedError(
                "_graph=True (CUDA graphs) is not modelled by the CPU reference"
            )
        self._enabled, self._recipe, self._saved = enabled, recipe, None
        self._group = amax_reduction_group

    def __enter__(self):
        if self._saved is not None:
            raise RuntimeError(
                "autocast context manager cannot be entered more than once concurrently"
            )
        if self._enabled:
            check_recipe_support(self._recipe)
        self._saved = (STATE.enabled, STATE.recipe, STATE.is_first_module, STATE.amax_group)
        if STATE.depth == 0:
            STATE.is_first_module = True
            STATE.forward_metas, STATE.backward_metas = [], []
        STATE.depth += 1
        STATE.enabled = self._enabled
        STATE.recipe = (self._recipe or get_default_recipe()) if self._enabled else self._recipe
        STATE.amax_group = self._group
        return self

    def __exit__(self, *exc):
        STATE.enabled, STATE.recipe, _, STATE.amax_group = self._saved
        self._saved = None
        STATE.depth -= 1
        if self._enabled and STATE.depth == 0 and torch.is_grad_enabled():
            update_metas(STATE.forward_metas, backward=False)
            STATE.forward_metas = []


def update_metas(metas: list, backward: bool) -> None:
    """Delayed-scaling update of ``(meta, recipe, group)`` entries: the newest amaxes reduced
    over each entry's group (one buffer per group, in registration order), then every scale."""
    buckets: list[tuple[object, list[torch.Tensor]]] = []
    for meta, recipe, group in metas:
        if not recipe.reduce_amax:
            continue
        for known, amaxes in buckets:
            if known is group:
                amaxes.append(meta.amax_history[0])
                break
        else:
            buckets.append((group, [meta.amax_history[0]]))
    for group, amaxes in buckets:
        parallel.reduce_amax(amaxes, group)
    for meta, recipe, _ in metas:
        meta.update(fp8_max(fp8_dtype(recipe.fp8_format, backward=backward)), recipe)


def fp8_autocast(
    enabled: bool = True, calibrating: bool = False, fp8_recipe=None, fp8_group=None, _graph=False
):  # deprecated
    warnings.warn(
        "fp8_autocast is deprecated and will be removed in a future release. "
        "Use autocast(enabled=..., calibrating=..., recipe=..., group=..., _graph=...) instead.",
        category=DeprecationWarning,
        stacklevel=2,
    )
    return autocast(
        enabled=enabled,
        calibrating=calibrating,
        recipe=fp8_recipe,
        amax_reduction_group=fp8_group,
        _graph=_graph,
    )


@contextlib.contextmanager
def quantized_model_init(
    enabled: bool = True,
    recipe: recipes.Recipe | None = None,
    preserve_high_precision_init_val: bool = False,
):
    """``te.quantized_model_init``: modules built inside keep only FP8 weights.

    The reference stores each such weight as the decoded values of its FP8 copy (in the
    parameter dtype), marked ``weight._fp8lab_quantized``; TE stores the FP8 bytes themselves.
    In-place writes into such a weight (``copy_``, ``normal_``, ``load_state_dict``) store the
    values as given, where TE quantizes them; the next forward quantizes them as TE's stored
    copy was, so the GEMMs see the same FP8 values. With
    ``preserve_high_precision_init_val=True`` each weight keeps its values before the cast on
    the CPU, as TE does: ``weight.get_high_precision_init_val()``, then
    ``weight.clear_high_precision_init_val()`` once master weights are set from them.
    """
    previous = (STATE.model_init_recipe, STATE.model_init_preserve)
    if enabled:
        check_recipe_support(recipe)
    STATE.model_init_recipe = (recipe or get_default_recipe()) if enabled else None
    STATE.model_init_preserve = bool(enabled and preserve_high_precision_init_val)
    try:
        yield
    finally:
        STATE.model_init_recipe, STATE.model_init_preserve = previous


def _get_high_precision_init_val(parameter: torch.Tensor) -> torch.Tensor | None:
    return getattr(parameter, "_high_precision_init_val", None)


def _clear_high_precision_init_val(parameter: torch.Tensor) -> None:
    if hasattr(parameter, "_high_precision_init_val"):
        del parameter._high_precision_init_val


def attach_high_precision_init_val(parameter: torch.Tensor) -> None:
    """Keep a CPU copy of ``parameter`` before its FP8 cast, with TE's two accessor methods."""
    parameter._high_precision_init_val = parameter.detach().cpu().clone()
    parameter.get_high_precision_init_val = types.MethodType(
        _get_high_precision_init_val, parameter
    )
    parameter.clear_high_precision_init_val = types.MethodType(
        _clear_high_precision_init_val, parameter
    )


@contextlib.contextmanager
def fp8_model_init(
    enabled: bool = True, recipe=None, preserve_high_precision_init_val: bool = False
):  # deprecated
    warnings.warn(
        "fp8_model_init is deprecated and will be removed in a future release. "
        "Use quantized_model_init(enabled=..., recipe=..., "
        "preserve_high_precision_init_val=...) instead.",
        category=DeprecationWarning,
        stacklevel=3,
    )
    with quantized_model_init(enabled, recipe, preserve_high_precision_init_val):
        yield


# --- quantizing a GEMM operand ------------------------------------------------------------------


def assert_dim_for_fp8_exec(*tensors: torch.Tensor) -> None:
    """TE's shape rule for FP8 GEMMs, with TE's message."""
    import math

    for tensor in tensors:
        if math.prod(tensor.shape[:-1]) % 8 != 0 or tensor.shape[-1] % 16 != 0:
            raise ValueError(
                "FP8 execution requires the product of all dimensions except the last to be"
                " divisible by 8 and the last dimension to be divisible by 16, but got tensor"
                f" with dims={list(tensor.size())} (product of leading dims ="
                f" {math.prod(tensor.shape[:-1])}, last dim = {tensor.shape[-1]})"
            )


ROLES = {"input": (0, False), "weight": (1, False), "grad_output": (0, True)}


def quantize_operand(
    x2d: torch.Tensor,
    role: str,
    recipe: recipes.Recipe,
    meta: dict | None,
    columnwise: bool = False,
    amax: torch.Tensor | None = None,
) -> torch.Tensor:
    """Quantize a 2-D GEMM operand as TE would and return its decoded FP32 values.

    ``columnwise`` selects the copy TE makes for a transposed use (block recipes scale along
    the other dimension there); per-tensor copies are identical either way. ``amax`` replaces
    the operand's own (per-tensor recipes), for kernels that measure it before rounding to 16 bits.
    """
    slot, backward = ROLES[role]
    dtype = fp8_dtype(recipe.fp8_format, backward)
    if isinstance(recipe, recipes.DelayedScaling):
        scaling = meta["scaling_bwd" if backward else "scaling_fwd"]
        if STATE.checkpoint_phase == "recompute" and not backward:
            scale = scaling.stash.popleft()[slot]
        else:
            scale = scaling.scale[slot].clone()
            if STATE.checkpoint_phase == "forward" and not backward:
                scaling.stash.append(scaling.scale.clone())
            if STATE.checkpoint_phase != "recompute" and not columnwise:
                # TE's cast kernels take an atomic max into row 0, which only the update
                # zeroes: casts between two updates keep the largest amax of them all
                found = amax_of(x2d) if amax is None else amax
                row = scaling.amax_history[0]
                row[slot] = torch.maximum(row[slot], torch.as_tensor(found, dtype=row.dtype))
        return quantize_per_tensor(x2d, scale, dtype).dequantize()
    if isinstance(recipe, recipes.Float8CurrentScaling):
        scale = scale_from_amax(
            amax_of(x2d) if amax is None else amax, fp8_max(dtype), recipe.use_power_2_scales
        )
        return quantize_per_tensor(x2d, scale, dtype).dequantize()
    if isinstance(recipe, recipes.Float8BlockScaling):
        two_d = (
            recipe.w_block_scaling_dim
            if role == "weight"
            else recipe.grad_block_scaling_dim
            if role == "grad_output"
            else recipe.x_block_scaling_dim
        ) == 2
        if two_d:
            return quantize_blocks_2d(x2d, dtype, 128, not recipe.use_f32_scales).dequantize()
        source = x2d.t() if columnwise else x2d
        decoded = quantize_blocks_1d(source, dtype, 128, not recipe.use_f32_scales).dequantize()
        return decoded.t() if columnwise else decoded
    if isinstance(recipe, recipes.MXFP8BlockScaling):
        source = x2d.t() if columnwise else x2d
        decoded = quantize_mxfp8(source, dtype).dequantize()
        return decoded.t() if columnwise else decoded
    raise NotImplementedError(
        f"recipe {type(recipe).__name__} is not modelled by the CPU reference"
    )


def register_module_metas(meta: dict, recipe: recipes.Recipe) -> list | None:
    """Record a module's delayed-scaling state for the updates.

    Returns the backward metas to update after this GEMM's backward if it is the first GEMM of
    the autocast (its backward runs last), else None. Under ``checkpoint``, the first GEMM of
    the recompute takes that role, since the first pass's graph is discarded.
    """
    if STATE.checkpoint_phase == "recompute":
        metas, STATE.recompute_first_metas = STATE.recompute_first_metas, None
        return metas
    if isinstance(recipe, recipes.DelayedScaling):
        STATE.forward_metas.append((meta["scaling_fwd"], recipe, STATE.amax_group))
        STATE.backward_metas.append((meta["scaling_bwd"], recipe, STATE.amax_group))
    first = STATE.is_first_module
    STATE.is_first_module = False
    if first and STATE.checkpoint_phase == "forward":
        STATE.checkpoint_first_metas = STATE.backward_metas
    return STATE.backward_metas if first else None


def update_backward_metas(metas: list) -> None:
    update_metas(metas, backward=True)
