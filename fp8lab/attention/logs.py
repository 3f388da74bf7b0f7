"""TE's backend-selection log, from a fresh process, for a list of cases.

TE's selection log (``NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2``) is configured from the environment
once, when TE is imported (``AttentionLogging._log_level``); setting the variables later in a
running process changes nothing. :func:`te_selection_logs` therefore runs its cases in a fresh
Python process started with those variables, exactly as a reader would on the command line
(``python -m fp8lab.attention``, which runs :func:`child_main`), and returns what TE printed.
This is plumbing (a child process and the parsing of its stderr); the switches and the cache
it exercises are taught in chapter 05's own cells.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from fp8lab import checks, recipes
from fp8lab.attention.functional import AttentionShape
from fp8lab.devices import default_device

__all__ = ["SelectionLog", "te_selection_logs"]

# The recipes (fp8lab.recipes names) whose fp8_dpa a selection log can be asked about.
FP8_ATTENTION_RECIPES = ("delayed", "current")
TE_MISSING = "needs Transformer Engine on a CUDA GPU"
_CHILD_MARK = "@@fp8lab-case"
_TE_LINE = re.compile(r"\[(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*\|")
_PY_WARNING = re.compile(r"\.py:\d+: |^\s+warnings\.warn|^\s{2,}")
_WHY = re.compile(
    r"Disabling|not installed|NoBackend|not used because|"
    r"does not support|not supported|requires",
    re.I,
)


def _selected(lines: Sequence[str]) -> str | None:
    """The backend TE says it selected, from its log lines."""
    for line in lines:
        found = re.search(r"Selected backend = (.+?)\.?$", line)
        if found:
            return found.group(1)
    return None


def _reasons(lines: Sequence[str]) -> list[str]:
    """The lines of a log that say why something was switched off or refused."""
    found = []
    for line in lines:
        text = re.sub(r"^\[\w+\s*\|\s*[\w.]+\s*\]:\s*", "", line).strip()
        text = re.sub(r"\s*\(Triggered internally at [^)]*\)\.?", "", text).strip()
        if text.endswith("because:"):  # PyTorch's header line; its reason comes separately
            continue
        if text.startswith(("Running with config", "Selected backend")):
            continue  # the inputs ("... 'not installed' ...") and the outcome, not a reason
        if _WHY.search(text) and text not in found:
            found.append(text.splitlines()[0])
    return found


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


@dataclass(frozen=True)
class SelectionLog:
    """What TE printed (``NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2``) for one case, and how it ended."""

    title: str
    lines: tuple[str, ...] = ()
    error: str | None = None

    def __post_init__(self):
        if not isinstance(self.title, str):
            raise TypeError(f"title={self.title!r}: must be a string")
        if not isinstance(self.lines, tuple) or not all(isinstance(x, str) for x in self.lines):
            raise TypeError(f"lines={self.lines!r}: must be a tuple of strings")
        if self.error is not None and not isinstance(self.error, str):
            raise TypeError(f"error={self.error!r}: must be None or a string")

    @property
    def selected(self) -> str | None:
        return _selected(self.lines)

    def first_reason(self, about: str = "") -> str:
        """TE's first line that says why something was switched off or refused (the first that
        mentions ``about``, a backend name, if given), without TE's prefix; "" if none."""
        if not isinstance(about, str):
            raise TypeError(f"about={about!r}: must be a string (a backend name)")
        return next((line for line in _reasons(self.lines) if about in line), "")

    @property
    def available(self) -> str:
        """TE's "Available backends = {...}" line, without TE's prefix; "" if none."""
        for line in self.lines:
            found = re.search(r"Available backends = \{.*?\}", line, re.S)
            if found:
                return " ".join(found.group(0).split())
        return ""

    def summary(self, config: bool = False) -> list[str]:
        """The lines that decide the selection (the long ``Running with config`` line only
        with ``config=True``), then the error if the call failed."""
        keep = [line for line in self.lines if config or "Running with config" not in line]
        return keep + ([f"-> {self.error}"] if self.error else [])


def not_install_hint(record) -> bool:
    """A logging filter that drops TE's advice to install the flash-attn package, which says
    nothing about the selection (TE logs it where cuDNN is switched off)."""
    return "may provide important feature support" not in record.getMessage()


# --- the logging process ------------------------------------------------------------------------


def _uses_real_te() -> bool:
    from fp8lab.environment import detect

    return detect().uses_real_te


def _check_env(env) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and k for k, v in env.items()
    ):
        raise TypeError(f"env={env!r}: must be a mapping of variable names to string values")
    return dict(env)


def _is_recipe(value) -> bool:
    """A recipe object (TE's or the reference's ``Recipe``) or the module that holds them."""
    if isinstance(value, ModuleType):
        return hasattr(value, "Recipe") and hasattr(value, "DelayedScaling")
    kind = value if isinstance(value, type) else type(value)
    return any(cls.__name__ == "Recipe" for cls in kind.__mro__)


def _check_recipe_name(name: str, value):
    """A recipe named as ``te_selection_logs`` names it (``None``, ``"delayed"``,
    ``"current"``); the te module, the recipe module or a recipe in its place is named as
    such."""
    is_te = isinstance(value, ModuleType) and hasattr(value, "DotProductAttention")
    if is_te or _is_recipe(value):
        what = "the te module" if is_te else "the recipe module or a recipe"
        raise TypeError(
            f"{name}={checks.show(value)} is {what}: name the recipe instead, "
            f"one of {FP8_ATTENTION_RECIPES} (the logging process makes it)"
        )
    return None if value is None else checks.choice(name, value, FP8_ATTENTION_RECIPES)


def _run_case(te, recipe_module, case: Mapping[str, Any], device) -> None:
    """One forward and backward of a fresh ``te.DotProductAttention`` for ``case``, in the
    ``bshd`` layout, under the case's environment (set for the case, then restored)."""
    window = case["shape"]["window_size"]
    shape = AttentionShape(**{**case["shape"], "window_size": tuple(window) if window else None})
    from transformer_engine.pytorch.attention.dot_product_attention import (
        _attention_backends,  # private: TE's cached selection
    )

    saved = {name: os.environ.get(name) for name in case["env"]}
    os.environ.update(case["env"])
    # the switches are not part of TE's cache key: make it select again for this case
    _attention_backends["backend_selection_requires_update"] = True
    try:
        module = te.DotProductAttention(
            shape.heads,
            shape.head_dim,
            num_gqa_groups=shape.kv_groups,
            attention_dropout=shape.dropout,
            qkv_format="bshd",
            attn_mask_type=shape.mask,
            window_size=shape.window_size,
        )
        q, k, v = shape.make_inputs(device=device)
        fp8 = case.get("recipe")
        autocast = (
            te.autocast(recipe=recipes.make(
                recipe_module, fp8, fp8_dpa=True, fp8_mha=case.get("fp8_mha", False)
            ))
            if fp8
            else contextlib.nullcontext()
        )
        with autocast:
            out = module(q, k, v)
        out.float().sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def child_main() -> int:  # pragma: no cover - runs on the GPU, in a fresh process
    """Run the cases read (as JSON) from stdin; mark on stderr where each case's lines begin
    and how it ended, so that the parent can tell TE's lines apart."""
    import transformer_engine.pytorch as te  # first: TE must load cuDNN before torch does
    from transformer_engine.common import recipe as te_recipe

    logging.getLogger("DotProductAttention").addFilter(not_install_hint)
    device = default_device()
    if device.type == "cuda":
        torch.cuda.init()
    for index, case in enumerate(json.loads(sys.stdin.read())):
        print(f"{_CHILD_MARK} {index}", file=sys.stderr, flush=True)
        try:
            _run_case(te, te_recipe, case, device)
        except Exception as error:  # the point is to show the error, whatever its kind
            print(f"{_CHILD_MARK} error {_first_line(error)}", file=sys.stderr, flush=True)
    print(f"{_CHILD_MARK} end", file=sys.stderr, flush=True)
    return 0


def _case(case: Any, index: int) -> dict[str, Any]:
    """A case of :func:`te_selection_logs`, checked, as the logging process reads it."""
    if not isinstance(case, Mapping):
        raise TypeError(f"cases[{index}] must be a dict with 'shape' (and 'recipe', 'env')")
    unknown = set(case) - {"title", "shape", "recipe", "env", "fp8_mha"}
    if unknown:
        raise ValueError(f"cases[{index}]: unknown keys {sorted(unknown)}")
    shape = case.get("shape")
    if not isinstance(shape, AttentionShape):
        raise TypeError(f"cases[{index}]['shape'] must be an AttentionShape")
    _check_recipe_name(f"cases[{index}]['recipe']", case.get("recipe"))
    checks.flag(f"cases[{index}]['fp8_mha']", case.get("fp8_mha", False))
    title = case.get("title", shape.label)
    if not isinstance(title, str):
        raise TypeError(f"cases[{index}]['title'] must be a string")
    return {
        "title": title,
        "shape": dataclasses.asdict(shape),
        "recipe": case.get("recipe"),
        "fp8_mha": case.get("fp8_mha", False),
        "env": _check_env(case.get("env")),
    }


def _run_child(payload: list[dict[str, Any]], timeout_s: float) -> tuple[str, str]:
    """The logging process's stderr, and how it stopped (with its last line)."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fp8lab.attention"],
            input=json.dumps(payload),
            env=dict(os.environ, NVTE_DEBUG="1", NVTE_DEBUG_LEVEL="2"),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        stderr, stopped = done.stderr, f"exit status {done.returncode}"
    except subprocess.TimeoutExpired as error:
        stderr = error.stderr.decode() if isinstance(error.stderr, bytes) else error.stderr or ""
        stopped = f"timed out after {timeout_s:.0f} s"
    last = [line for line in stderr.splitlines() if line.strip() and _CHILD_MARK not in line]
    return stderr, stopped + (f": {last[-1].strip()[:200]}" if last else "")


def _parse_child(stderr: str) -> tuple[dict[int, list[str]], dict[int, str]]:
    """TE's lines of each case (multi-line messages joined up, Python warnings left out), and
    the error of each case that failed."""
    blocks: dict[int, list[str]] = {}
    errors: dict[int, str] = {}
    current, in_te_line = None, False
    for line in stderr.splitlines():
        if line.startswith(_CHILD_MARK):
            word = line[len(_CHILD_MARK) :].strip()
            if word.startswith("error") and current is not None:
                errors[current] = word[len("error") :].strip()
            elif word.isdigit():
                current = int(word)
                blocks[current] = []
            else:
                current = None
            in_te_line = False
        elif current is not None and _TE_LINE.match(line):
            blocks[current].append(line)
            in_te_line = True
        elif current is not None and in_te_line and line.strip() and not _PY_WARNING.search(line):
            blocks[current][-1] += "\n" + line  # the next line of a multi-line TE message
        else:
            in_te_line = False
    return blocks, errors


def te_selection_logs(cases: Sequence[Mapping[str, Any]], timeout_s: float = 300.0):
    """TE's backend-selection log for each case, from one fresh Python process started with
    ``NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2`` (TE reads them when it is imported).

    A case is a dict: ``shape`` (an :class:`AttentionShape`), optional ``title``, ``recipe``
    (``None``, ``"delayed"`` or ``"current"``, with ``fp8_dpa=True``), ``fp8_mha`` and ``env``
    (switches such as ``NVTE_FUSED_ATTN``). Each case runs one forward and backward of a fresh
    ``te.DotProductAttention``. Returns one :class:`SelectionLog` per case; where TE cannot run
    (no CUDA GPU), each says so in ``error``.
    """
    if isinstance(cases, (str, bytes)) or not isinstance(cases, Sequence):
        raise TypeError(f"cases must be a list of dicts, not {type(cases).__name__}")
    prepared = [_case(case, index) for index, case in enumerate(cases)]
    timeout_s = checks.number("timeout_s", timeout_s, positive=True)
    if not _uses_real_te():
        return [SelectionLog(c["title"], error=TE_MISSING) for c in prepared]
    payload = [{k: c[k] for k in ("shape", "recipe", "fp8_mha", "env")} for c in prepared]
    stderr, stopped = _run_child(payload, timeout_s)
    blocks, errors = _parse_child(stderr)
    return [
        SelectionLog(
            c["title"],
            tuple(blocks.get(i, ())),
            errors.get(i)
            or (None if i in blocks else f"the logging process stopped first ({stopped})"),
        )
        for i, c in enumerate(prepared)
    ]
