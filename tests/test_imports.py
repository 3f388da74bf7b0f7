"""Every module of fp8lab and tools imports on a bare CPU machine, and the arithmetic modules
stand alone: importing them loads no timing, GPU probe, TE or reference code."""

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

ARITHMETIC = (
    "fp8lab.config",
    "fp8lab.flops",
    "fp8lab.memory",
    "fp8lab.datasheet",
    "fp8lab.roofline",
)
FORBIDDEN = (
    "fp8lab.speedometer",
    "fp8lab.environment",
    "fp8lab.reference",
    "fp8lab.ceilings",
    "torch",
    "transformer_engine",
)


@pytest.mark.parametrize("module", ARITHMETIC)
def test_arithmetic_modules_import_nothing_heavy(module):
    code = f"import sys, {module}\nprint(' '.join(m for m in {FORBIDDEN!r} if m in sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert loaded == [], f"importing {module} loaded {loaded}"


def test_the_package_names_are_lazy():
    code = (
        "import sys, fp8lab\n"
        "before = 'fp8lab.environment' in sys.modules\n"
        "fp8lab.preset()\n"
        "print(before, 'fp8lab.environment' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["False", "True"]


def test_one_import_door_per_name():
    """A public name is defined in one module and re-exported by none, except that a chapter
    kit (a subpackage) shows the public names of its own modules."""
    import importlib
    import pkgutil

    import fp8lab

    homes: dict[str, str] = {}
    for info in pkgutil.iter_modules(fp8lab.__path__):
        if info.name == "reference":  # mirrors TE's own layout, which re-exports by design
            continue
        module = importlib.import_module(f"fp8lab.{info.name}")
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            home = getattr(value, "__module__", None)
            own = home == module.__name__ or (home or "").startswith(module.__name__ + ".")
            if callable(value) and home and home.startswith("fp8lab") and not own:
                pytest.fail(f"fp8lab.{info.name} re-exports {name} from {home}")
            assert name not in homes or not callable(value), (
                f"{name} in {homes.get(name)} and {module.__name__}"
            )
            homes[name] = module.__name__


def _modules(folder: Path, name: str) -> list[str]:
    """``name`` and every module under it, found by pkgutil without importing anything."""
    found = [name]
    for info in pkgutil.iter_modules([str(folder)]):
        child = f"{name}.{info.name}"
        found += _modules(folder / info.name, child) if info.ispkg else [child]
    return found


EVERY_MODULE = _modules(ROOT / "fp8lab", "fp8lab") + _modules(ROOT / "tools", "tools")
# Run in a fresh interpreter that cannot see Transformer Engine or a GPU, as on a bare CPU
# machine (even where this one has both): a module that needs either at import fails here.
IMPORT_ALL = """
import importlib, json, sys, traceback
sys.modules["transformer_engine"] = None  # `import transformer_engine` raises ImportError
failed = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except BaseException as error:
        failed[name] = traceback.format_exception_only(type(error), error)[-1].strip()
print(json.dumps(failed))
"""


def test_the_walk_finds_every_module():
    files = [*ROOT.joinpath("fp8lab").rglob("*.py"), *ROOT.joinpath("tools").rglob("*.py")]
    assert len(EVERY_MODULE) == len(files)
    assert {"fp8lab.reference.modules", "fp8lab.parallel.ranks", "tools.lane"} <= set(
        EVERY_MODULE
    )


def test_every_module_of_fp8lab_and_tools_imports_without_te_or_a_gpu():
    """Nothing needs Transformer Engine or a GPU to be imported (the CPU reference included);
    the packages' ``__main__`` modules run nothing when imported."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, json.dumps(EVERY_MODULE)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert failed == {}, "\n".join(f"{name}: {why}" for name, why in failed.items())
