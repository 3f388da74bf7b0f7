"""A CPU stand-in for ``transformer_engine.pytorch.optimizers.FusedAdam`` (TE 2.20).

TE's ``FusedAdam`` runs one fused CUDA kernel over lists of parameters (``multi_tensor_adam``);
it does not run on a CPU. This stand-in follows the same semantics in plain PyTorch, so that the
chapters' training loops run unchanged through :func:`fp8lab.import_te` on a machine without a
GPU (``te.optimizers.FusedAdam`` on both lanes). Mirrored from
``transformer_engine/pytorch/optimizers/fused_adam.py`` and ``common/multi_tensor/adam.cu``:

* **Adam/AdamW arithmetic in FP32**: ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
  bias corrections ``1 - b^t`` (one step counter per parameter group), ``denom = sqrt(v_hat) +
  eps``; decoupled weight decay (``adam_w_mode=True``, the default) adds ``weight_decay * p`` to
  the update, L2 mode adds it to the gradient;
* **gradients** come from ``param.grad``, or from ``param.decoupled_grad`` with
  ``use_decoupled_grad=True`` (TE's way to hand the optimizer gradients of another dtype than the
  parameter, such as the FP32 ``main_grad`` of ``fuse_wgrad_accumulation``); a parameter whose
  gradient is ``None`` is skipped, but its state is created on the first step all the same;
* **master weights** (``master_weights=True``): 16-bit parameters get an FP32 copy
  (``state["master_param"]``) that the update is applied to, then rounded back into the
  parameter; FP32 parameters are updated in place;
* **FP8 parameters** (built under ``te.quantized_model_init``) need master weights. Without
  them TE 2.20 raises for every recipe but delayed scaling, whose weights it silently leaves
  alone (gathered for the fused FP8 kernel, which only the master-weight branch calls): the
  stand-in does the same. With master weights the FP32 master copy is updated and the weight
  is written back as FP8 -- with the module's current weight scale under delayed scaling (TE's
  fused FP8 Adam kernel), from the master's own amax under the other recipes (``quantize_``).
  The reference stores the decoded FP8 values, as everywhere else
  (:func:`fp8lab.reference.modules.requantize_fp8_weight`);
* ``initialize_state``, ``set_scaled_state``, ``get_unscaled_state`` and ``zero_grad`` behave as
  TE's (the first two are how master weights are seeded from
  ``weight.get_high_precision_init_val()``).

Not modelled (each raises ``NotImplementedError`` naming it): ``capturable`` (CUDA graphs),
master weights or moments stored in other dtypes than FP32 (``master_weight_dtype``,
``exp_avg_dtype``, ``exp_avg_sq_dtype``), ``grad_scaler``. ``store_param_remainders`` is accepted
and computed as FP32 master weights, which it reproduces bit for bit (it stores the 16 low bits
that BF16 drops); only its memory differs.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from fp8lab.reference.modules import requantize_fp8_weight

__all__ = ["FusedAdam"]

STATE_NAMES = ("exp_avg", "exp_avg_sq", "master_param")


def _is_fp8(param: torch.Tensor) -> bool:
    return bool(getattr(param, "_fp8lab_quantized", False))


class FusedAdam(torch.optim.Optimizer):
    """``te.optimizers.FusedAdam`` (CPU stand-in): Adam/AdamW with optional FP32 master weights."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter | dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        bias_correction=True,
        adam_w_mode=True,
        capturable=False,
        master_weights=False,
        master_weight_dtype=torch.float32,
        exp_avg_dtype=torch.float32,
        exp_avg_sq_dtype=torch.float32,
        use_decoupled_grad=False,
        store_param_remainders=False,
        set_grad_none: bool | None = None,  # deprecated in TE
    ):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        if master_weights and master_weight_dtype not in (torch.float32, torch.float16):
            raise RuntimeError("FusedAdam only supports fp32/fp16 master weights.")
        if capturable:
            raise NotImplementedError(
                "FusedAdam(capturable=True) (CUDA graphs) is not modelled by the CPU reference"
            )
        for name, dtype in (
            ("master_weight_dtype", master_weight_dtype),
            ("exp_avg_dtype", exp_avg_dtype),
            ("exp_avg_sq_dtype", exp_avg_sq_dtype),
        ):
            if dtype != torch.float32:
                raise NotImplementedError(
                    f"FusedAdam({name}={dtype}) is not modelled by the CPU reference "
                    "(only FP32 states); use Transformer Engine on a GPU"
                )
        defaults = {
            "lr": lr,
            "bias_correction": bias_correction,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
        }
        super().__init__(params, defaults)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.capturable = False
        self.master_weights = master_weights
        self.master_weight_dtype = master_weight_dtype
        self.use_decoupled_grad = use_decoupled_grad
        self.store_param_remainders = store_param_remainders and master_weights
        self.set_grad_none = set_grad_none

    # --- state, as in TE ---------------------------------------------------------------------

    def initialize_state(self, param: torch.nn.Parameter, store_param_remainders: bool = False):
        """Zero moments, and (with master weights) an FP32 copy of the parameter's values."""
        state = self.state[param]
        state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
        state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
        if self.master_weights:
            state["master_param"] = param.detach().clone().float()

    def get_unscaled_state(self, param: torch.nn.Parameter, state_name: str) -> torch.Tensor:
        """The FP32 state ``state_name`` of ``param`` (all states are FP32 here)."""
        if state_name not in STATE_NAMES:
            raise ValueError(f"state_name={state_name!r}: must be one of {STATE_NAMES}")
        return self.state[param][state_name]

    def set_scaled_state(
        self, param: torch.nn.Parameter, state_name: str, unscaled_state: torch.Tensor
    ) -> None:
        """Set a state from FP32 values (TE asserts FP32 input, as here)."""
        if state_name not in STATE_NAMES:
            raise ValueError(f"state_name={state_name!r}: must be one of {STATE_NAMES}")
        if unscaled_state.dtype != torch.float32:
            raise AssertionError("set_scaled_state needs an FP32 tensor, as in TE")
        state = self.state[param]
        if state_name not in state:
            state[state_name] = torch.zeros_like(param, dtype=torch.float32)
        state[state_name].copy_(unscaled_state)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Reset gradients (``.grad``, or ``.decoupled_grad`` with ``use_decoupled_grad``)."""
        if self.set_grad_none is not None:
            set_to_none = self.set_grad_none
        if set_to_none is None:
            set_to_none = True
        for group in self.param_groups:
            for p in group["params"]:
                if not self.use_decoupled_grad:
                    if set_to_none:
                        p.grad = None
                    elif p.grad is not None:
                        p.grad.zero_()
                elif set_to_none:
                    p.decoupled_grad = None
                elif getattr(p, "decoupled_grad", None) is not None:
                    p.decoupled_grad.zero_()

    # --- the step ------------------------------------------------------------------------------

    def _gather(self, group: dict):
        """The parameters of ``group`` that have a gradient, with their FP32 values (the master
        copy where there is one), FP32 gradients and both moments."""
        params, values, grads, firsts, seconds = [], [], [], [], []
        for p in group["params"]:
            state = self.state[p]
            if len(state) == 0:
                self.initialize_state(p, self.store_param_remainders)
            grad = getattr(p, "decoupled_grad", None) if self.use_decoupled_grad else p.grad
            if grad is None:
                continue
            if grad.is_sparse:
                raise RuntimeError("FusedAdam does not support sparse gradients.")
            fp8 = _is_fp8(p)
            if fp8 and not self.master_weights:
                if p._fp8lab_recipe.delayed():
                    continue  # TE 2.20 collects these for its FP8 kernel, then never runs it
                raise RuntimeError(
                    "FusedAdam without master_weights does not support FP8 parameters "
                    "(te.quantized_model_init). Use master_weights=True."
                )
            if p.dtype == torch.float32 and not fp8:
                value = p.detach()  # FP32 parameters are their own master copy
            elif self.master_weights:
                value = state["master_param"]
            else:
                value = p.detach().float()
            params.append(p)
            values.append(value)
            grads.append(grad.detach().float())
            firsts.append(state["exp_avg"])
            seconds.append(state["exp_avg_sq"])
        return params, values, grads, firsts, seconds

    def _update(self, group: dict, values, grads, firsts, seconds) -> None:
        """Adam (or AdamW) on the FP32 ``values``, in place, as TE's multi-tensor kernel."""
        beta1, beta2 = group["betas"]
        step = group["step"]
        correction1 = 1 - beta1**step if group["bias_correction"] else 1.0
        correction2 = 1 - beta2**step if group["bias_correction"] else 1.0
        lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
        if not self.adam_w_mode:  # L2 regularisation: the decay joins the gradient
            grads = torch._foreach_add(grads, values, alpha=decay)
        torch._foreach_mul_(firsts, beta1)
        torch._foreach_add_(firsts, grads, alpha=1 - beta1)
        torch._foreach_mul_(seconds, beta2)
        torch._foreach_addcmul_(seconds, grads, grads, value=1 - beta2)
        denominators = torch._foreach_div(seconds, correction2)
        torch._foreach_sqrt_(denominators)
        torch._foreach_add_(denominators, eps)
        updates = torch._foreach_div(firsts, correction1)
        torch._foreach_div_(updates, denominators)
        if self.adam_w_mode:
            torch._foreach_add_(updates, values, alpha=decay)
        torch._foreach_add_(values, updates, alpha=-lr)

    @torch.no_grad()
    def step(self, closure=None, grad_scaler=None):
        """One Adam step over every parameter with a gradient."""
        if grad_scaler is not None:
            raise NotImplementedError(
                "FusedAdam.step(grad_scaler=...) is not modelled by the CPU reference"
            )
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1
            params, values, grads, firsts, seconds = self._gather(group)
            if not params:
                continue
            self._update(group, values, grads, firsts, seconds)
            for p, value in zip(params, values, strict=True):
                if _is_fp8(p):
                    requantize_fp8_weight(p, value)
                elif value.data_ptr() != p.data_ptr():
                    p.copy_(value)  # round to the parameter's dtype (nearest even)
        return loss

    def __repr__(self) -> str:
        return f"FusedAdam (fp8lab CPU stand-in for TE's; master_weights={self.master_weights})"


def __getattr__(name: str):
    if name in ("FusedSGD", "MultiTensorApply", "multi_tensor_applier"):
        raise NotImplementedError(
            f"te.optimizers.{name} is not modelled by the CPU reference (only FusedAdam); "
            "use Transformer Engine on a GPU"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
