"""The named attention backends, and the context that makes one of them the one that runs.

TE's ``DotProductAttention`` reads its switches (``NVTE_FUSED_ATTN``, ``NVTE_FLASH_ATTN``,
``NVTE_UNFUSED_ATTN``) when it selects a backend, and it caches that selection in the
module-level dict ``_attention_backends`` until a call's ``AttentionParams`` differ from the
previous call's. The switches are not part of those parameters, so :func:`backend_context` sets
them *and* marks the cached selection stale, and restores both on the way out. For PyTorch's
SDPA it pins one kernel with ``torch.nn.attention.sdpa_kernel`` instead.

Here too: which kernel family each backend should run (:data:`EXPECTED_FAMILY`, the families of
:mod:`fp8lab.profiling`), whether real TE runs on this machine, and the check that ``te`` is the
module :func:`fp8lab.import_te` returns first, not the recipe module it returns second.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from types import ModuleType

from fp8lab import checks
from fp8lab.attention.functional import AttentionShape
from fp8lab.profiling import CUDNN, EFFICIENT, FLASH_PACKAGE, FLASH_TORCH, UNFUSED

__all__ = ["BACKENDS", "EXPECTED_FAMILY", "backend_context"]

BACKENDS = {
    "te_auto": "te.DotProductAttention, TE's own choice",
    "te_fused": "te.DotProductAttention, cuDNN fused attention only",
    "te_flash": "te.DotProductAttention, FlashAttention (flash-attn packages) only",
    "te_unfused": "te.DotProductAttention, unfused PyTorch path only",
    "sdpa_auto": "F.scaled_dot_product_attention, PyTorch's own choice",
    "sdpa_cudnn": "F.scaled_dot_product_attention pinned to CUDNN_ATTENTION",
    "sdpa_flash": "F.scaled_dot_product_attention pinned to FLASH_ATTENTION",
    "sdpa_efficient": "F.scaled_dot_product_attention pinned to EFFICIENT_ATTENTION",
    "sdpa_math": "F.scaled_dot_product_attention pinned to MATH",
    "explicit": "explicit matmul + softmax (standard attention)",
}
TE_SWITCHES = {
    "te_fused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "0"},
    "te_flash": {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"},
    "te_unfused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "1"},
}
SDPA_PINS = {
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_math": "MATH",
}
EXPECTED_FAMILY = {
    "te_fused": CUDNN,
    "te_flash": FLASH_PACKAGE,
    "te_unfused": UNFUSED,
    "sdpa_cudnn": CUDNN,
    "sdpa_flash": FLASH_TORCH,
    "sdpa_efficient": EFFICIENT,
    "sdpa_math": UNFUSED,
    "explicit": UNFUSED,
}
# The recipes (fp8lab.recipes names) whose fp8_dpa a selection log can be asked about.
FP8_ATTENTION_RECIPES = ("delayed", "current")
_TE_MODULE = "transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention"
_TE_MISSING = "needs Transformer Engine on a CUDA GPU"


def _uses_real_te() -> bool:
    from fp8lab.environment import detect

    return detect().uses_real_te


def _invalidate_te_selection() -> bool:
    """Mark TE's cached backend selection stale (only if TE is loaded); True if it was found."""
    module = sys.modules.get(_TE_MODULE)
    cache = getattr(module, "_attention_backends", None)
    if not isinstance(cache, dict):
        return False
    cache["attention_params"] = None
    cache["backend_selection_requires_update"] = True
    policy_cache = getattr(module, "_thd_policy_backend_cache", None)
    if isinstance(policy_cache, list):
        policy_cache.clear()
    return True


def _check_env(env) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and k for k, v in env.items()
    ):
        raise TypeError(f"env={env!r}: must be a mapping of variable names to string values")
    return dict(env)


@contextlib.contextmanager
def _te_environment(variables: Mapping[str, str]):
    """Set ``variables`` and mark TE's selection stale; restore both afterwards."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    _invalidate_te_selection()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _invalidate_te_selection()


@contextlib.contextmanager
def backend_context(backend: str, env: Mapping[str, str] | None = None):
    """Run the body under ``backend`` (a key of :data:`BACKENDS`): TE's switches set and its
    cached selection marked stale, or SDPA pinned with ``sdpa_kernel``. ``env`` sets other
    variables for the duration (``NVTE_FP8_DPA_BWD``, say). Everything is restored afterwards."""
    checks.choice("backend", backend, BACKENDS)
    variables = {**TE_SWITCHES.get(backend, {}), **_check_env(env)}
    with _te_environment(variables):
        if backend in SDPA_PINS:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(getattr(SDPBackend, SDPA_PINS[backend])):
                yield
        else:
            yield


def _is_recipe(value) -> bool:
    """A recipe object (TE's or the reference's ``Recipe``) or the module that holds them."""
    if isinstance(value, ModuleType):
        return hasattr(value, "Recipe") and hasattr(value, "DelayedScaling")
    kind = value if isinstance(value, type) else type(value)
    return any(cls.__name__ == "Recipe" for cls in kind.__mro__)


def _is_te(value) -> bool:
    return isinstance(value, ModuleType) and hasattr(value, "DotProductAttention")


def _check_te(te):
    """``te`` as :func:`fp8lab.import_te` returns it first; the recipe module (returned second)
    or a recipe in its place is named as such."""
    if _is_te(te):
        return te
    if _is_recipe(te):
        raise TypeError(
            f"te={checks.show(te)} is the recipe module or a recipe, not te: pass the first of "
            "te, recipe = fp8lab.import_te() (a recipe goes in context=lambda: "
            "te.autocast(recipe=...))"
        )
    raise TypeError(f"te={checks.show(te)}: must be the module from fp8lab.import_te()")


def _check_recipe_name(name: str, value):
    """A recipe named as ``te_selection_logs`` names it (``None``, ``"delayed"``,
    ``"current"``); the te module, the recipe module or a recipe in its place is named as
    such."""
    if _is_te(value) or _is_recipe(value):
        what = "the te module" if _is_te(value) else "the recipe module or a recipe"
        raise TypeError(
            f"{name}={checks.show(value)} is {what}: name the recipe instead, "
            f"one of {FP8_ATTENTION_RECIPES} (the logging process makes it)"
        )
    return None if value is None else checks.choice(name, value, FP8_ATTENTION_RECIPES)


def _te_attention(te, shape: AttentionShape):
    """A fresh ``te.DotProductAttention`` for ``shape``, in the ``bshd`` layout."""
    return te.DotProductAttention(
        shape.heads,
        shape.head_dim,
        num_gqa_groups=shape.kv_groups,
        attention_dropout=shape.dropout,
        qkv_format="bshd",
        attn_mask_type=shape.mask,
        window_size=shape.window_size,
    )
