"""The session-to-session floor: one panel of comparisons, run once in each GPU session.

``python -m tools.session_floor run`` (on a GPU with TE) times the panel through the book's
protocol (:func:`fp8lab.protocol.rounds`) and writes one stamped file per session into
``tests/gpu_results/session_floor/``. ``python -m tools.session_floor summary`` reads every
committed session, prints each comparison's estimate per session and the floors they give, and
with ``--write`` puts them into :data:`fp8lab.protocol.floor.PANEL`, where every verdict of the
book reads them, and rewrites the book's table of them (``book/_floor_table.md``, included by
``book/measurement.md``; ``python -m tools.session_floor page`` checks it is current).

The panel spans the regimes the chapters compare in: large GEMMs and a large layer (the GPU sets
the step), a small layer run eagerly (the host sets it), GEMMs and a small layer on the kernels'
own time, and an A/A pair (a layer against an identical copy of itself: what the rig reads
where nothing differs).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "tests" / "gpu_results" / "session_floor"
FLOOR_MODULE = ROOT / "fp8lab" / "protocol" / "floor.py"
PAGE = ROOT / "book" / "_floor_table.md"
PANEL_PATTERN = re.compile(r"^PANEL: dict\[.*?^}\n|^PANEL: dict\[[^\n]*= \{\}\n", re.M | re.S)


def _layer_steps(te, hidden: int, names: dict, batch: int, seq: int, device: str):
    """Forward + backward steps of ``te.TransformerLayer`` (F = 4H, head size 128): one per
    ``names[label] = fp8 recipe or None``, each on a fresh layer with the same weights."""
    import torch

    from fp8lab.config import TransformerConfig
    from fp8lab.layers import build_layer

    cfg = TransformerConfig(hidden, 4 * hidden, max(1, hidden // 128), name=f"H={hidden}")
    x = torch.randn(seq, batch, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn_like(x)
    steps = {}
    for label, fp8_recipe in names.items():
        torch.manual_seed(0)
        layer = build_layer("te_layer", cfg, te, params_dtype=torch.bfloat16, device=device)

        def step(layer=layer, fp8_recipe=fp8_recipe):
            with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
                out = layer(x)
            out.backward(grad)

        steps[label] = step
    return steps


def measure(smoke: bool = False) -> dict:
    """Every comparison of the panel, timed on this GPU: ``{name: {"regime", "record",
    "idle"}}`` (regime: the floor class it stands for; idle: the GPU idle share measured).
    ``smoke``: tiny sizes on the CPU, to check the code, not to measure."""
    from fp8lab import ceilings, protocol
    from fp8lab.environment import import_te

    te, recipe = import_te()
    device = "cpu" if smoke else "cuda"
    n, big, small, seq = (64, 256, 128, 64) if smoke else (8192, 4096, 512, 2048)
    panel = {}

    def add(name, regime, result, first, second, basis="wall"):
        comparison = result.compare(first, second, basis=basis)
        idle = {n: result.idle_share(n) for n in (first, second)}
        panel[name] = {"regime": regime, "record": comparison.record(), "idle": idle}
        print(f"{name:48s} {comparison.phrase()}", flush=True)

    gemms = {
        "FP8 fast": ceilings.matmul_step(n, n, n, "fp8", fast_accumulation=True, device=device),
        "BF16": ceilings.matmul_step(n, n, n, "bf16", device=device),
        "BF16 NN": ceilings.matmul_step(n, n, n, "bf16", layout="nn", device=device),
    }
    if smoke:
        del gemms["FP8 fast"]  # no FP8 GEMM on a CPU
    result = protocol.rounds(gemms, rounds=7, calls=10, warmup=10, warmup_s=1.0, device=device)
    if "FP8 fast" in gemms:
        add("GEMM 8192, FP8 fast accum. vs BF16", "device", result, "FP8 fast", "BF16")
    add("GEMM 8192 BF16, NN vs TN", "device", result, "BF16 NN", "BF16")
    if not smoke:  # kernel time, the clock of chapter 00's and 04's fine GEMM comparisons
        fine = {
            "FP8 fast": ceilings.matmul_step(4096, 4096, 4096, "fp8", fast_accumulation=True),
            "FP8": ceilings.matmul_step(4096, 4096, 4096, "fp8"),
            "BF16 1024": ceilings.matmul_step(1024, 1024, 1024, "bf16"),
            "FP8 1024": ceilings.matmul_step(1024, 1024, 1024, "fp8"),
        }
        result = protocol.rounds(fine, rounds=7, calls=10, warmup=10, warmup_s=0.5,
                                 kernel_time="rounds")
        add("GEMM 4096, fast vs FP32 accum. (kernels)", "kernel", result, "FP8 fast", "FP8",
            basis="kernel")
        add("GEMM 1024, FP8 vs BF16 (kernels)", "kernel", result, "FP8 1024", "BF16 1024",
            basis="kernel")
    large = {"FP8": recipe.DelayedScaling(), "BF16": None, "BF16 again": None}
    steps = _layer_steps(te, big, large, 4, seq, device)
    result = protocol.rounds(steps, rounds=7, calls=5, warmup=5, warmup_s=1.0, device=device)
    add("layer H=4096, FP8 delayed vs BF16", "device", result, "FP8", "BF16")
    add("layer H=4096 BF16, A/A", "device", result, "BF16 again", "BF16")
    small_names = {"FP8": recipe.DelayedScaling(), "BF16": None}
    steps = _layer_steps(te, small, small_names, 4, seq, device)
    result = protocol.rounds(steps, rounds=7, calls=10, warmup=10, warmup_s=0.5,
                             kernel_time="rounds", device=device)
    add("layer H=512 eager, FP8 delayed vs BF16", "host", result, "FP8", "BF16")
    if not smoke:  # kernel time is a GPU measurement
        add("layer H=512, FP8 delayed vs BF16 (kernels)", "kernel", result, "FP8", "BF16",
            basis="kernel")
    return panel


def run(folder: Path) -> Path:
    """One session's panel, written as a stamped JSON file into ``folder``."""
    from fp8lab import stamp

    machine = stamp.where_it_runs()
    now = datetime.datetime.now(datetime.timezone.utc)
    record = stamp.stamp_record(stamp.producer_modules(Path(__file__)), machine)
    payload = {"session": now.strftime("%Y-%m-%d %H:%M UTC"), "stamp": record,
               "comparisons": measure()}
    folder.mkdir(parents=True, exist_ok=True)
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", machine["gpu_name"]).strip("-").lower()
    path = folder / f"{now:%Y%m%d-%H%M}_{gpu}.json"
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def panel_of(folder: Path = FOLDER) -> dict:
    """``{comparison: (regime, {session file: estimate})}`` over the session files."""
    panel: dict = {}
    for path in sorted(folder.glob("*.json")):
        for name, entry in json.loads(path.read_text())["comparisons"].items():
            regime, sessions = panel.setdefault(name, (entry["regime"], {}))
            sessions[path.stem] = round(float(entry["record"]["estimate"]), 4)
    return panel


def page(folder: Path = FOLDER) -> str:
    """The book's table of the panel: each comparison's estimate per session, its move, and
    each regime's floor."""
    from fp8lab.protocol.floor import floors_from, largest_move

    panel = panel_of(folder)
    sessions = sorted({s for _, found in panel.values() for s in found})
    gpus = {path.stem: json.loads(path.read_text())["stamp"]["gpu_name"]
            for path in sorted(folder.glob("*.json"))}
    lines = [
        "<!-- Generated by `python -m tools.session_floor summary --write` from "
        "tests/gpu_results/session_floor/; do not edit. -->",
        "",
        "| comparison | regime | " + " | ".join(f"session {i + 1}" for i in range(len(sessions)))
        + " | largest move |",
        "| --- | --- | " + " | ".join("---:" for _ in sessions) + " | ---: |",
    ]
    for name, (regime, found) in panel.items():
        cells = [f"{found[s]:.3f}×" if s in found else "—" for s in sessions]
        lines.append(f"| {name} | {regime} | " + " | ".join(cells)
                     + f" | {largest_move(found.values()):.1%} |")
    lines.append("")
    for i, session in enumerate(sessions):
        day, clock = session.split("_")[0].split("-")
        when = f"{day[:4]}-{day[4:6]}-{day[6:]} {clock[:2]}:{clock[2:]} UTC"
        lines.append(f"Session {i + 1}: {gpus.get(session, 'unknown GPU')}, {when}.")
    floors = floors_from(panel)
    if not floors:
        lines += ["", "No regime has three sessions yet: no floor, no verdict."]
        return "\n".join(lines) + "\n"
    lines += ["", "| regime | floor | sessions | comparisons |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {f.regime} | {f.relative:.1%} | {f.sessions} | {f.comparisons} |"
              for f in floors.values()]
    return "\n".join(lines) + "\n"


def summary(folder: Path = FOLDER, write: bool = False) -> int:
    from fp8lab.protocol.floor import floors_from

    panel = panel_of(folder)
    for name, (regime, sessions) in panel.items():
        values = ", ".join(f"{v:.4f}" for v in sessions.values())
        print(f"{name:48s} {regime:7s} {values}")
    for regime, floor in floors_from(panel).items():
        print(f"floor {regime:7s} {floor}")
    if write:
        lines = ["PANEL: dict[str, tuple[str, dict[str, float]]] = {"]
        for name, (regime, sessions) in panel.items():
            lines.append(f"    {name!r}: ({regime!r}, {{")
            lines += [f"        {session!r}: {value!r}," for session, value in sessions.items()]
            lines.append("    }),")
        text = FLOOR_MODULE.read_text()
        new, count = PANEL_PATTERN.subn("\n".join([*lines, "}"]) + "\n", text, count=1)
        if count != 1:
            raise SystemExit(f"no PANEL block found in {FLOOR_MODULE}")
        FLOOR_MODULE.write_text(new)
        PAGE.write_text(page(folder))
        print(f"wrote {len(panel)} comparisons into {FLOOR_MODULE.relative_to(ROOT)} and "
              f"{PAGE.relative_to(ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.session_floor",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("run", "summary", "page"))
    parser.add_argument("--folder", type=Path, default=FOLDER)
    parser.add_argument("--write", action="store_true", help="summary: update the library")
    parser.add_argument("--smoke", action="store_true", help="run: tiny sizes on the CPU")
    args = parser.parse_args(argv)
    if args.action == "run" and args.smoke:
        measure(smoke=True)
        return 0
    if args.action == "run":
        print(f"wrote {run(args.folder)}")
        return 0
    if args.action == "page":
        current = PAGE.is_file() and PAGE.read_text() == page(args.folder)
        state = "current" if current else "STALE: run summary --write"
        print(f"{PAGE.relative_to(ROOT)} is {state}")
        return 0 if current else 1
    return summary(args.folder, args.write)


if __name__ == "__main__":
    sys.exit(main())
