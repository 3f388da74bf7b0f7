"""``make lab``: JupyterLab from the same .venv, with the project's kernel.

The README tells a reader to open the chapters with ``make lab``; these check the two things it
relies on: JupyterLab comes with the test extra, and the kernel ``make kernel`` registers runs
the .venv's own python (so the notebooks import this checkout's fp8lab, not another one).
"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_jupyterlab_comes_with_the_environment():
    result = subprocess.run(
        [sys.executable, "-m", "jupyterlab", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.strip().split(".")[0]) >= 4


def test_the_registered_kernel_runs_this_python(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "ipykernel", "install", "--prefix", str(tmp_path), "--name",
         "fp8lab", "--display-name", "Python (fp8lab)"],
        check=True, capture_output=True,
    )
    spec = json.loads((tmp_path / "share/jupyter/kernels/fp8lab/kernel.json").read_text())
    assert spec["argv"][0] == sys.executable
    assert spec["display_name"] == "Python (fp8lab)"


def test_make_lab_registers_the_kernel_and_opens_the_notebooks():
    plan = subprocess.run(
        ["make", "-n", "lab"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "ipykernel install --sys-prefix --name fp8lab" in plan
    assert "jupyter lab --notebook-dir=lab" in plan
    assert "cp -rn notebooks/. lab/" in plan  # participants work on copies, never overwritten
    ignored = (ROOT / ".gitignore").read_text().split()
    assert "lab/" in ignored and "wheelhouse/" in ignored
