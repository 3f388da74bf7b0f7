"""Parameter layouts and parallel layouts: what each parameter costs, and how the job is split.

:data:`WEIGHTS` names the parameter layouts the book trains with (pure BF16, FP32 under
``torch.autocast``, BF16 with FP32 master weights, FP8 weights with FP32 master weights);
:class:`Layout` is tensor, sequence and data parallelism with a ZeRO stage. The training state
per parameter follows Rajbhandari et al. 2020 (ZeRO, sec. 3.1 and 5: the 16 bytes per parameter
of mixed-precision Adam, 18 with FP32 gradients, and their sharding).
"""

from __future__ import annotations

from dataclasses import dataclass

from fp8lab import checks
from fp8lab.memory.constants import OPTIMIZERS, PRECISIONS, ZERO_STAGES
from fp8lab.parts import Part

__all__ = [
    "WEIGHTS",
    "Layout",
    "Weights",
    "bytes_per_parameter",
    "resolve_precision",
    "zero_training_state",
]


@dataclass(frozen=True)
class Weights:
    """A parameter layout: what each parameter costs and which optimizer keeps its state.

    Bytes are per parameter; ``state_bytes`` is per optimizer moment (AdamW keeps two; SGD one
    with momentum, none without).
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


def _moments(optimizer: str, momentum: float) -> int:
    """Optimizer tensors kept per parameter: AdamW's two moments; SGD's momentum buffer only
    with momentum > 0 (torch.optim.SGD's default, momentum=0, keeps none)."""
    return {"adamw": 2, "sgd": 1 if momentum > 0 else 0, "none": 0}[optimizer]


def bytes_per_parameter(
    precision: str,
    optimizer: str = "adamw",
    fp32_grads: bool = False,
    hopper: bool = True,
    *,
    weights: str | None = None,
    momentum: float = 0.0,
) -> dict[str, float]:
    """Bytes per parameter of the training state, by part (before any sharding).

    For the GEMM weights of the layers (FP8 ones under ``weights="fp8-master"``: 1 byte, plus
    its transpose on Hopper). ``bytes_per_parameter("bf16")`` sums to the classic 16;
    ``optimizer="sgd"`` keeps a momentum buffer only with ``momentum > 0``, as torch's SGD.
    """
    layout, _ = resolve_precision(precision, weights)
    checks.choice("optimizer", optimizer, OPTIMIZERS)
    checks.flag("fp32_grads", fp32_grads)
    checks.flag("hopper", hopper)
    momentum = checks.number("momentum", momentum, non_negative=True)
    if momentum and optimizer != "sgd":
        raise ValueError(f"momentum={momentum}: only optimizer='sgd' takes a momentum")
    stored = (2 if hopper else 1) if layout.fp8_params else layout.param_bytes
    return {
        Part.PARAMETERS: stored,
        Part.GRADIENTS: 4 if fp32_grads else layout.grad_bytes,
        Part.MASTER_WEIGHTS: layout.master_bytes if optimizer != "none" else 0,
        Part.OPTIMIZER_STATES: _moments(optimizer, momentum) * layout.state_bytes,
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
