"""TE's backend-selection log: captured in-process for one call, or from a fresh process for a
list of cases.

TE's selection log (``NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2``) is configured from the environment
once, when TE is imported (``AttentionLogging._log_level``); setting the variables later in a
running process changes nothing. :func:`capture_te_log` therefore raises TE's level for one body
in the running process (TE re-reads the level at every selection) and collects the lines, and
:func:`te_selection_logs` runs its cases in a fresh Python process started with those variables,
exactly as a reader would on the command line (``python -m fp8lab.attention``, which runs
:func:`child_main`), and returns what TE printed.
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
from typing import Any

import torch

from fp8lab import checks, recipes
from fp8lab.attention import backends
from fp8lab.attention.functional import AttentionShape
from fp8lab.devices import default_device

__all__ = ["SelectionLog", "capture_te_log", "refusal_reason", "te_selection_logs"]

_TE_UTILS = "transformer_engine.pytorch.attention.dot_product_attention.utils"
_TE_LOGGERS = ("DotProductAttention", "FlashAttention", _TE_UTILS)
_TE_FORMAT = "[%(levelname)-8s | %(name)-19s]: %(message)s"  # TE's AttentionLogging format
_LOG_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING}
_CHILD_MARK = "@@fp8lab-case"
_TE_LINE = re.compile(r"\[(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*\|")
_PY_WARNING = re.compile(r"\.py:\d+: |^\s+warnings\.warn|^\s{2,}")
_WHY = re.compile(
    r"Disabling|not installed|NoBackend|not used because|"
    r"does not support|not supported|requires",
    re.I,
)


class _Collect(logging.Handler):
    def __init__(self, lines: list[str]):
        super().__init__()
        self.lines = lines
        self.setFormatter(logging.Formatter(_TE_FORMAT))

    def emit(self, record):
        self.lines.append(self.format(record))


@contextlib.contextmanager
def capture_te_log(level: str = "DEBUG"):
    """Collect TE's attention log lines (``level`` and above) into the yielded list, in-process.

    TE fixes its log level when it is imported; this raises it for the body (TE re-reads
    ``AttentionLogging._log_level`` at every selection) and sends the lines to the list instead
    of stderr, then restores everything. Without TE loaded the list stays empty.
    """
    checks.choice("level", level, _LOG_LEVELS)
    lines: list[str] = []
    utils = sys.modules.get(_TE_UTILS)
    logging_class = getattr(utils, "AttentionLogging", None)
    if logging_class is None:
        yield lines
        return
    numeric = _LOG_LEVELS[level]
    handler = _Collect(lines)
    loggers = [logging.getLogger(name) for name in _TE_LOGGERS]
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    saved_level = logging_class._log_level
    logging_class._log_level = numeric
    for lg in loggers:
        lg.handlers = [handler]
        lg.setLevel(numeric)
        lg.propagate = False
    try:
        yield lines
    finally:
        logging_class._log_level = saved_level
        for lg, handlers, lg_level, propagate in saved:
            lg.handlers, lg.propagate = handlers, propagate
            lg.setLevel(lg_level)


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


def refusal_reason(error: BaseException) -> str:
    """The error's type and the first sentence that says why, for a table of refusals.

    TE's refusals go on with advice and a dump of the inputs, and a recipe's validation error
    (pydantic) opens with a header line ("1 validation error for ..."): both are left out.
    """
    if not isinstance(error, BaseException):
        raise TypeError(f"error={error!r}: must be an exception")
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if len(lines) > 1 and re.match(r"\d+ validation errors? for ", lines[0]):
        lines = lines[1:]
    text = re.sub(r"\s*\[type=.*$", "", lines[0]) if lines else ""
    cut = re.search(r"[.!]\s", text)
    return f"{type(error).__name__}: {text[: cut.start() + 1] if cut else text}"


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


# --- the logging process ------------------------------------------------------------------------


def _run_case(te, recipe_module, case: Mapping[str, Any], device) -> None:
    """One forward and backward of a fresh ``te.DotProductAttention`` for ``case``."""
    window = case["shape"]["window_size"]
    shape = AttentionShape(**{**case["shape"], "window_size": tuple(window) if window else None})
    module = backends._te_attention(te, shape)
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


def child_main() -> int:  # pragma: no cover - runs on the GPU, in a fresh process
    """Run the cases read (as JSON) from stdin; mark on stderr where each case's lines begin
    and how it ended, so that the parent can tell TE's lines apart."""
    import transformer_engine.pytorch as te  # first: TE must load cuDNN before torch does
    from transformer_engine.common import recipe as te_recipe

    device = default_device()
    if device.type == "cuda":
        torch.cuda.init()
    for index, case in enumerate(json.loads(sys.stdin.read())):
        print(f"{_CHILD_MARK} {index}", file=sys.stderr, flush=True)
        try:
            with backends._te_environment(case["env"]):
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
    backends._check_recipe_name(f"cases[{index}]['recipe']", case.get("recipe"))
    checks.flag(f"cases[{index}]['fp8_mha']", case.get("fp8_mha", False))
    title = case.get("title", shape.label)
    if not isinstance(title, str):
        raise TypeError(f"cases[{index}]['title'] must be a string")
    return {
        "title": title,
        "shape": dataclasses.asdict(shape),
        "recipe": case.get("recipe"),
        "fp8_mha": case.get("fp8_mha", False),
        "env": backends._check_env(case.get("env")),
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
    if not backends._uses_real_te():
        return [SelectionLog(c["title"], error=backends._TE_MISSING) for c in prepared]
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
