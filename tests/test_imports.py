"""The arithmetic modules stand alone: importing them loads no timing, GPU probe, TE or reference
code."""

import subprocess
import sys

import pytest

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
