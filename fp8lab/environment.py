"""What this machine offers for FP8 training, and which sizes the notebooks use.

Every chapter starts by calling :func:`banner`, so a reader (and the committed
outputs) always show where a result came from: the GPU and how many, torch,
Transformer Engine (TE) or the CPU reference, FP8 support and the size preset.

FP8 tensor cores arrived with compute capability 8.9 (Ada) and 9.0 (Hopper);
TE refuses FP8 below that, and so does :attr:`Environment.fp8_supported`.

**One cuDNN per process.** Transformer Engine loads cuDNN itself, looking first in
``CUDNN_HOME``, ``CUDNN_PATH``, ``CUDA_HOME``, ``CUDA_PATH``, ``/usr/local/cuda`` and the
system's library path, and only then in the Python packages (TE 2.20,
``transformer_engine/common/__init__.py``, ``_load_cuda_library``). On a machine with a system
cuDNN older than the one PyTorch ships, TE maps the system's beside PyTorch's and both end up
calling the older one: ``torch.backends.cudnn.version()`` then raises, and FP8 attention gives
wrong, nondeterministic answers. :attr:`Environment.cudnn` reports the cuDNN TE loaded, the one
torch was built with, and every ``libcudnn`` file mapped into the process; :func:`import_te`
refuses a mixed process and says how to fix it.

The preset picks problem sizes: ``smoke`` keeps a notebook under a minute on
two CPU cores, ``full`` is meant for one H200-class GPU. ``FP8LAB_PRESET``
overrides the default (``full`` with a CUDA GPU, ``smoke`` without).
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import warnings
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

PRESETS = ("smoke", "full")
PRESET_VARIABLE = "FP8LAB_PRESET"
FP8_MIN_CAPABILITY = (8, 9)

T = TypeVar("T")

__all__ = [
    "PRESETS",
    "PRESET_VARIABLE",
    "CudnnReport",
    "Environment",
    "banner",
    "by_preset",
    "detect",
    "import_te",
    "preset",
    "require_one_cudnn",
    "setup",
]


@dataclass(frozen=True)
class CudnnReport:
    """Which cuDNN this process uses: ``torch_built`` (the version torch was compiled against),
    ``torch_runtime`` (what torch finds at run time, or why it refuses), ``te_loaded`` (what TE's
    library calls), ``libraries`` (every distinct ``libcudnn.so`` file mapped, real paths)."""

    torch_built: str | None
    torch_runtime: str | None
    te_loaded: str | None
    libraries: tuple[str, ...] = ()

    @property
    def problem(self) -> str | None:
        """Why this process has more than one cuDNN (``None`` when it has one, or none)."""
        if len(self.libraries) > 1:
            return f"two cuDNN libraries are mapped: {', '.join(self.libraries)}"
        if self.torch_runtime is not None and not self.torch_runtime[:1].isdigit():
            return self.torch_runtime
        if self.te_loaded and self.torch_runtime and self.te_loaded != self.torch_runtime:
            return f"TE calls cuDNN {self.te_loaded}, torch {self.torch_runtime}"
        return None

    def describe(self) -> str:
        if self.te_loaded is None and self.torch_built is None:
            return "none"
        shown = self.te_loaded or self.torch_runtime or self.torch_built
        built = f" (torch built with {self.torch_built})" if self.torch_built != shown else ""
        return f"{shown}{built}" + (" MIXED" if self.problem else "")


@dataclass(frozen=True)
class Environment:
    """A snapshot of the hardware and software the notebooks run on."""

    torch_version: str
    cuda_available: bool
    gpu_name: str | None
    gpu_count: int
    compute_capability: tuple[int, int] | None
    te_version: str | None
    te_problem: str | None
    cuda_version: str | None = None
    cudnn: CudnnReport = CudnnReport(None, None, None)

    @property
    def fp8_supported(self) -> bool:
        """True where the GPU has FP8 tensor cores (sm_89 and newer)."""
        return self.compute_capability is not None and self.compute_capability >= FP8_MIN_CAPABILITY

    @property
    def uses_real_te(self) -> bool:
        """True where Transformer Engine itself runs (a CUDA GPU and an importable TE)."""
        return self.cuda_available and self.te_version is not None

    @property
    def device(self) -> torch.device:
        return torch.device("cuda" if self.cuda_available else "cpu")

    def describe_gpu(self) -> str:
        if not self.cuda_available:
            return "none (CPU only)"
        major, minor = self.compute_capability
        return f"{self.gpu_count} x {self.gpu_name} (sm_{major}{minor})"


def _import_te_version() -> tuple[str | None, str | None]:
    try:
        with warnings.catch_warnings():  # TE warns about a JAX install it will not use
            warnings.filterwarnings(
                "ignore", message="Detected a Jax installation", category=RuntimeWarning
            )
            import transformer_engine  # noqa: F401
            import transformer_engine.pytorch  # noqa: F401
    except Exception as error:  # TE raises many kinds of errors when its library is missing
        return None, f"{type(error).__name__}: {error}".splitlines()[0]
    return transformer_engine.__version__, None


def _version(parts) -> str:
    return ".".join(str(int(p)) for p in parts)


def _mapped_cudnn() -> tuple[str, ...]:
    """Real paths of the ``libcudnn.so*`` files mapped into this process (Linux)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if re.search(r"/libcudnn\.so", line)}
    except OSError:
        return ()
    return tuple(sorted({os.path.realpath(path) for path in paths}))


def _cudnn_report(te_version: str | None) -> CudnnReport:
    if not torch.cuda.is_available():
        return CudnnReport(None, None, None)
    try:
        built = _version(torch._C._cudnn.getCompileVersion())
    except (AttributeError, RuntimeError):
        built = None
    try:
        runtime = torch.backends.cudnn.version()
        runtime = (
            None
            if runtime is None
            else f"{runtime // 10000}.{runtime % 10000 // 100}.{runtime % 100}"
        )
    except RuntimeError as error:  # torch refuses a cuDNN older than the one it was built with
        runtime = str(error).splitlines()[0]
    te_loaded = None
    if te_version is not None:
        import transformer_engine.pytorch as te

        te_loaded = _version(te.get_cudnn_version())
    return CudnnReport(built, runtime, te_loaded, _mapped_cudnn())


@functools.lru_cache(maxsize=1)
def detect() -> Environment:
    """Look at the machine once; later calls return the same snapshot."""
    cuda = torch.cuda.is_available()
    te_version, te_problem = _import_te_version() if cuda else (None, "no CUDA GPU")
    return Environment(
        torch_version=torch.__version__,
        cuda_available=cuda,
        gpu_name=torch.cuda.get_device_name() if cuda else None,
        gpu_count=torch.cuda.device_count() if cuda else 0,
        compute_capability=torch.cuda.get_device_capability() if cuda else None,
        te_version=te_version,
        te_problem=te_problem,
        cuda_version=torch.version.cuda if cuda else None,
        cudnn=_cudnn_report(te_version),
    )


def require_one_cudnn(env: Environment | None = None) -> None:
    """Raise ``RuntimeError`` (with the fix) where this process has more than one cuDNN."""
    env = detect() if env is None else env
    problem = env.cudnn.problem
    if problem is None:
        return
    raise RuntimeError(
        f"Two cuDNN versions in one process ({problem}). Transformer Engine loads cuDNN from "
        "CUDNN_HOME, CUDNN_PATH, CUDA_HOME or the system's library path before PyTorch's own, "
        "and a mixed process gives wrong FP8 attention. Point TE at PyTorch's cuDNN before "
        "starting Python: export CUDNN_HOME=$(python -c 'import nvidia.cudnn; "
        "print(nvidia.cudnn.__path__[0])') (or remove the system cuDNN), then "
        "check with: python -m fp8lab.doctor"
    )


def preset() -> str:
    """The size preset: ``FP8LAB_PRESET`` if set, else ``full`` on a CUDA GPU and ``smoke``
    elsewhere."""
    chosen = os.environ.get(PRESET_VARIABLE, "").strip().lower()
    if not chosen:
        return "full" if detect().cuda_available else "smoke"
    if chosen not in PRESETS:
        raise ValueError(
            f"{PRESET_VARIABLE}={chosen!r}: the preset must be one of {', '.join(PRESETS)}"
        )
    return chosen


def by_preset(smoke: T, full: T) -> T:
    """Pick a size for the current preset: ``by_preset(smoke=256, full=8192)``."""
    return full if preset() == "full" else smoke


def banner() -> str:
    """One line that says where this notebook runs."""
    env = detect()
    from fp8lab import __version__

    if env.uses_real_te:
        te = f"Transformer Engine {env.te_version} | cuDNN {env.cudnn.describe()}"
        fp8 = "yes" if env.fp8_supported else "no (needs sm_89+)"
    else:
        te = "Transformer Engine: CPU reference"
        fp8 = "emulated on CPU" if not env.cuda_available else f"TE unavailable ({env.te_problem})"
    return (
        f"fp8lab {__version__} | GPU: {env.describe_gpu()} | torch {env.torch_version} | "
        f"{te} | FP8: {fp8} | preset: {preset()}"
    )


def import_te() -> tuple[Any, Any]:
    """Return ``(te, recipe)``: ``transformer_engine.pytorch`` and
    ``transformer_engine.common.recipe``.

    Real TE wherever it can run (a CUDA GPU with TE installed); fp8lab's CPU
    reference of the same API on a machine without a CUDA GPU. On a CUDA GPU
    without TE this raises, rather than quietly timing the reference on a GPU.
    """
    env = detect()
    if env.uses_real_te:
        require_one_cudnn(env)
        return (
            importlib.import_module("transformer_engine.pytorch"),
            importlib.import_module("transformer_engine.common.recipe"),
        )
    if env.cuda_available:
        raise RuntimeError(
            "This machine has a CUDA GPU but Transformer Engine does not import "
            f"({env.te_problem}). Install it: pip install 'transformer-engine[pytorch]', "
            "or use an NVIDIA PyTorch container."
        )
    from fp8lab import reference

    return reference, reference.recipe


def setup() -> tuple[Any, Any, Environment]:
    """What every chapter's first cell does: print the banner, set the book's plot style, and
    return ``(te, recipe, env)`` (real TE on a GPU box, the CPU reference elsewhere)."""
    from fp8lab.book import plot_style

    print(banner())
    plot_style()
    te, recipe = import_te()
    return te, recipe, detect()
