"""Time the book's set-up on a bare GPU machine without network, as a workshop room has it.

    python3 tools/setup_bare.py --wheelhouse wheelhouse [--system-site] [--chapters 00,03]

From the project's root, with nothing installed but the machine's own Python (and, with
``--system-site``, the torch it already has), it times four steps, each in a fresh process:

1. a fresh virtual environment (``.venv-bare``, removed first);
2. the offline install from the wheelhouse (``make install-offline``, ``--no-index``: no
   network is used);
3. ``make doctor``: the pre-flight, its exit status kept;
4. the first chapter (``notebooks/00_your_gpu.ipynb``) executed headless on a copy, on the
   preset the machine gets (``full`` on a GPU); with ``--chapters``, each chapter named, in
   order (``--chapters 00,03`` is the taster agenda's pair), one step each.

It writes ``tests/gpu_results/setup_bare_<gpu>_<date>.json`` with each step's seconds, exit
status and last lines of output, whether it succeeded or not (a failed step stops the run and
is recorded as such). The set-up page shows the newest successful record. Only the standard
library is used, so the machine's bare ``python3`` runs it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "tests" / "gpu_results"
VENV = ".venv-bare"
FIRST = "00"
_TAIL = 1500

_EXECUTE = """\
import sys, time, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3",
               resources={"metadata": {"path": sys.argv[2]}}).execute()
nbformat.write(nb, sys.argv[1])
errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
print(f"executed {len(nb.cells)} cells, {len(errors)} error outputs")
sys.exit(1 if errors else 0)
"""


def _gpu() -> str:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "no GPU found, driver unknown"
    line = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout else ""
    return line or "no GPU found, driver unknown"


def _step(name: str, command: list[str], env: dict, record: list[dict]) -> bool:
    print(f"== {name}: {' '.join(command)}", flush=True)
    begin = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - begin
    output = (done.stdout + done.stderr).strip()
    print(output[-_TAIL:], flush=True)
    record.append({"step": name, "command": " ".join(command), "seconds": round(seconds, 1),
                   "exit": done.returncode, "output_tail": output[-_TAIL:]})  # fmt: skip
    print(f"== {name}: exit {done.returncode} after {seconds:.1f} s", flush=True)
    return done.returncode == 0


def _restore_core_library(wheelhouse: Path, python: str, env: dict, record: list[dict]) -> bool:
    """A wheelhouse trimmed to fit a transfer limit may carry TE's core library compressed
    beside its wheel (``libtransformer_engine.so.xz``); put it where the wheel expects it."""
    packed = wheelhouse / "libtransformer_engine.so.xz"
    if not packed.is_file():
        return True
    code = ("import importlib.util, pathlib; s = importlib.util.find_spec('transformer_engine');"
            "print(pathlib.Path(list(s.submodule_search_locations)[0]) / 'wheel_lib')")
    found = subprocess.run([python, "-c", code], cwd=ROOT, env=env, capture_output=True,
                           text=True)  # fmt: skip
    target = Path(found.stdout.strip()) / "libtransformer_engine.so"
    begin = time.perf_counter()
    ok = found.returncode == 0 and target.parent.is_dir()
    if ok and not target.exists():
        with lzma.open(packed) as source, open(target, "wb") as sink:
            shutil.copyfileobj(source, sink)
    record.append({"step": "TE core library unpacked from the wheelhouse",
                   "command": f"xz -d {packed.name} -> {target}",
                   "seconds": round(time.perf_counter() - begin, 1), "exit": 0 if ok else 1,
                   "output_tail": found.stderr[-_TAIL:]})  # fmt: skip
    return ok


def _make_or(target: list[str], direct: list[list[str]], name: str, env: dict,
             record: list[dict]) -> bool:  # fmt: skip
    """Run ``make`` where it exists; else the same commands directly (recorded as such)."""
    if shutil.which("make"):
        return _step(name, ["make", *target], env, record)
    return all(_step(f"{name} (no make: direct)", c, env, record) for c in direct)


def run(wheelhouse: Path, system_site: bool, chapters: tuple[str, ...] = (FIRST,)) -> int:
    """Time the steps and write the record; return 0 when all succeeded."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    python, record = f"{VENV}/bin/python", []
    shutil.rmtree(ROOT / VENV, ignore_errors=True)
    venv = [sys.executable, "-m", "venv", *(["--system-site-packages"] if system_site else [])]
    ok = _step("fresh virtual environment", [*venv, VENV], env, record)
    if not ok and system_site:  # no ensurepip (python3-venv missing): the system's pip serves
        shutil.rmtree(ROOT / VENV, ignore_errors=True)
        ok = _step("fresh virtual environment (without pip)", [*venv, "--without-pip", VENV],
                   env, record)  # fmt: skip
    if ok and system_site and sys.prefix != sys.base_prefix:  # the machine's torch in a venv
        ok = _step("machine packages linked", [sys.executable, "tools/machine_packages.py",
                                               VENV], env, record)  # fmt: skip
    flags = [f"VENV={VENV}", f"WHEELHOUSE={wheelhouse}", "LAB_UI=0", f"PYTHON={sys.executable}"]
    flags += ["SYSTEM_SITE=1"] if system_site else []
    pip = [python, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheelhouse)]
    te = [f"transformer-engine{s}==2.20.2" for s in ("", "-cu13", "-torch")]
    direct = [[*pip, "--no-deps", *te],
              [*pip, "--no-build-isolation", "pydantic", "nvdlfw-inspect", "packaging", "-r",
               "workshop/requirements-lab.txt", "-e", "."]]  # fmt: skip
    ok = ok and _make_or(["install-offline", *flags], direct, "offline install", env, record)
    ok = ok and _restore_core_library(wheelhouse, python, env, record)
    run_env = dict(env)  # TE pointed at PyTorch's cuDNN, as make doctor and make lab do
    cudnn = subprocess.run([python, "-c", "import nvidia.cudnn as c; print(list(c.__path__)[0])"],
                           cwd=ROOT, env=env, capture_output=True, text=True)  # fmt: skip
    if cudnn.returncode == 0 and cudnn.stdout.strip():
        path = cudnn.stdout.strip()
        library = ":".join(p for p in (f"{path}/lib", env.get("LD_LIBRARY_PATH", "")) if p)
        run_env.update(CUDNN_PATH=path, CUDNN_HOME=path, LD_LIBRARY_PATH=library)
    doctor = [[python, "-m", "fp8lab.doctor"]]
    ok = ok and _make_or(["doctor", f"VENV={VENV}"], doctor, "make doctor", run_env, record)
    work = ROOT / "lab-bare"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(ROOT / "notebooks", work)
    for key in chapters:
        copy = next(work.glob(f"{key}_*.ipynb"))
        ok = ok and _step(f"chapter {key} executed", [python, "-c", _EXECUTE, str(copy),
                                                       str(work)], run_env, record)
    shutil.rmtree(work, ignore_errors=True)
    return _write(record, ok, wheelhouse, system_site, chapters)


def _write(record: list[dict], ok: bool, wheelhouse: Path, system_site: bool,
           chapters: tuple[str, ...]) -> int:
    gpu = _gpu()
    now = datetime.datetime.now(datetime.timezone.utc)
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.split(",")[0].lower()).strip("-") or "no-gpu"
    path = RESULTS / f"setup_bare_{slug}_{now:%Y%m%d}.json"
    files = sorted(p.name for p in wheelhouse.iterdir()) if wheelhouse.is_dir() else []
    body = {
        "ok": ok,
        "seconds": round(sum(step["seconds"] for step in record), 1),
        "gpu": gpu,
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "python": sys.version.split()[0],
        "system_site": system_site,
        "network": "none used (pip --no-index)",
        "wheelhouse_files": len(files),
        "chapters": list(chapters),
        "steps": record,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=1) + "\n")
    print(f"{'set-up done' if ok else 'set-up FAILED'} in {body['seconds']:.0f} s; wrote "
          f"{path.relative_to(ROOT)}")  # fmt: skip
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/setup_bare.py", description=__doc__.split("\n")[0])
    parser.add_argument("--wheelhouse", type=Path, default=ROOT / "wheelhouse",
                        help="the folder of wheels to install from (default: ./wheelhouse)")
    parser.add_argument("--system-site", action="store_true",
                        help="let the venv see the machine's packages (its CUDA torch)")
    parser.add_argument("--chapters", default=FIRST,
                        help="the chapters to execute after the doctor, in order (default: 00)")
    args = parser.parse_args(argv)
    if not args.wheelhouse.is_dir():
        parser.error(f"--wheelhouse {args.wheelhouse}: no such folder (make wheelhouse makes one)")
    chapters = tuple(key.strip() for key in args.chapters.split(",") if key.strip())
    known = {p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    if not chapters or not set(chapters) <= known:
        parser.error(f"--chapters {args.chapters!r}: name chapters by number, of {sorted(known)}")
    return run(args.wheelhouse.resolve(), args.system_site, chapters)


if __name__ == "__main__":
    sys.exit(main())
