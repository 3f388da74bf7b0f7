"""Let a ``--system-site-packages`` venv see the machine's torch where that torch is in a venv.

    python3 tools/machine_packages.py .venv

``--system-site-packages`` exposes the *base* interpreter's packages only. On a machine image
whose CUDA torch lives in a venv of its own (``python3`` on the PATH is that venv's), the new
venv would not see it, and the offline install would look for torch in the wheelhouse. Run
with that ``python3``, this writes a ``.pth`` file into the new venv that adds the running
venv's site-packages after the new venv's own. Outside a venv it does nothing. Only the
standard library is used, so a bare machine's ``python3`` runs it.
"""

from __future__ import annotations

import argparse
import site
import sys
from pathlib import Path

PTH = "_machine_packages.pth"


def link(venv: Path) -> Path | None:
    """Write the ``.pth`` into ``venv`` and return its path; None when not run from a venv."""
    if sys.prefix == sys.base_prefix:
        return None
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    packages = venv / "lib" / version / "site-packages"
    if not packages.is_dir():
        raise ValueError(f"venv={str(venv)!r}: no {packages} (create it with this python3)")
    target = packages / PTH
    target.write_text("\n".join(site.getsitepackages()) + "\n")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("venv", type=Path, help="the venv to link, e.g. .venv")
    target = link(parser.parse_args(argv).venv)
    if target is None:
        print("not run from a venv: the base interpreter's packages are already visible")
    else:
        print(f"{target}: {', '.join(site.getsitepackages())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
