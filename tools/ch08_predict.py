"""Chapter 08's four-GPU predictions, made from the committed two-GPU results before any
four-GPU run: ``python -m tools.ch08_predict`` writes
``notebooks/results/08_parallelism_4gpu_prediction.json``.

From ``08_parallelism_2gpu.json`` (two H100s) it reads the one- and two-GPU FP8 and BF16
steps, the backward window of the profiled DDP step and the all-reduce's alpha-beta fit, and
projects with :mod:`fp8lab.parallel.projection` (anchored at the measured two-GPU steps):

* DDP's step and scaling efficiency at four GPUs;
* FSDP2's step at four GPUs, its measured overhead scaled by the FSDP traffic;
* TP = 4 with SP (the group processing 4 B sequences), scaled by tensor-parallel traffic;

and, from :func:`fp8lab.memory.estimate`, the peak memory per GPU of the four-GPU layouts
(DDP, FSDP2, TP = 4 with SP, TP 2 x DP 2). The file is stamped with the hash of its source file
and of the code that made it, so that the four-GPU run tests a prediction fixed beforehand.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import sys
from pathlib import Path

from fp8lab import collectives, memory
from fp8lab.config import TransformerConfig
from fp8lab.flops import layer_parameters
from fp8lab.parallel import projection

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "notebooks" / "results" / "08_parallelism_2gpu.json"
TARGET = ROOT / "notebooks" / "results" / "08_parallelism_4gpu_prediction.json"
CODE = (Path(projection.__file__), Path(__file__))
CFG = TransformerConfig(4096, 16384, 32, num_layers=2, name="te-tutorial x 2")
S, B, N_TO = 2048, 4, 4
BUCKET = 200 * 2**20  # DDP's bucket in the two-GPU run (bucket_cap_mb=200)
PRECISIONS = {"bf16": "bf16", "fp8": "fp8-delayed"}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _row(rows: list, **where) -> dict:
    hits = [r for r in rows if all(r.get(k) == v for k, v in where.items())]
    if not hits:
        raise ValueError(f"{SOURCE.name}: no row with {where}")
    return hits[0]


def measured(results: dict) -> dict:
    """What the predictions start from, read from the two-GPU results."""
    ddp = results["ddp"]["data"]["rows"]
    links = [r for r in results["links"]["data"]["rows"] if r["op"] == "all_reduce"]
    fit = collectives.fit_alpha_beta(
        [r["bytes"] for r in links], [r["time_us"] * 1e-6 for r in links], "all_reduce", 2
    )
    window = _row(results["timeline"]["data"]["rows"], layout="DP")["window_us"] / 1e3
    inputs = {"alpha_us": fit.alpha_s * 1e6, "bus_gbs": fit.bus_gbs, "window_ms": window}
    for p in PRECISIONS:
        inputs[f"one_ms_{p}"] = _row(ddp, n=1, batch=B, precision=p)["step_ms"]
        inputs[f"ddp_ms_{p}"] = _row(ddp, n=2, batch=B, precision=p, mode="tuned")["step_ms"]
        inputs[f"fsdp_ms_{p}"] = _row(results["fsdp"]["data"]["rows"], precision=p)["step_ms"]
        inputs[f"tp_sp_ms_{p}"] = _row(
            results["tp"]["data"]["rows"], precision=p, layout="TP+SP"
        )["step_ms"]
    return inputs


def _traffic_s(layout: str, batch: int, n: int, link: projection.Link) -> float:
    traffic = collectives.step_traffic(CFG, layout, batch, S, n)
    return collectives.traffic_time(traffic, link.bus_gbs, link.alpha_s)


def predictions(inputs: dict) -> list[dict]:
    """One row per layout and precision: the predicted four-GPU step and efficiency."""
    link = projection.Link(inputs["alpha_us"] * 1e-6, inputs["bus_gbs"])
    grad_bytes = 2 * CFG.num_layers * sum(layer_parameters(CFG).values())
    rows = []
    for p in PRECISIONS:
        one = inputs[f"one_ms_{p}"]
        steps = {
            "DDP": projection.dp_step_ms(
                N_TO, anchor_n=2, anchor_ms=inputs[f"ddp_ms_{p}"],
                window_ms=inputs["window_ms"], grad_bytes=grad_bytes,
                bucket_bytes=BUCKET, link=link,
            ),
            "FSDP2": projection.scaled_step_ms(
                one, inputs[f"fsdp_ms_{p}"], _traffic_s("FSDP", B, N_TO, link),
                _traffic_s("FSDP", B, 2, link),
            ),
            "TP=4+SP": projection.scaled_step_ms(
                one, inputs[f"tp_sp_ms_{p}"], _traffic_s("TP+SP", N_TO * B, N_TO, link),
                _traffic_s("TP+SP", 2 * B, 2, link),
            ),
        }
        for layout, step in steps.items():
            rows.append({"layout": layout, "precision": p, "gpus": N_TO, "step_ms": step,
                         "efficiency": projection.efficiency(one, step)})
    return rows


def peaks() -> list[dict]:
    """The estimator's peak memory per GPU (MiB) for the four-GPU layouts."""
    layouts = {
        "DDP": (memory.Layout(dp=4), B),
        "FSDP2": (memory.Layout(dp=4, zero_stage=3), B),
        "TP=4+SP": (memory.Layout(tp=4, sequence_parallel=True), 4 * B),
        "TP2xDP2 (SP)": (memory.Layout(tp=2, sequence_parallel=True, dp=2), 2 * B),
    }
    rows = []
    for name, (layout, batch) in layouts.items():
        for p, precision in PRECISIONS.items():
            found = memory.estimate(
                CFG, batch, S, precision=precision, layout=layout, hidden_dropout=0.0
            )
            rows.append({"layout": name, "precision": p, "peak_mib": found.peak_bytes / 2**20})
    return rows


def main(argv: list[str] | None = None) -> int:
    """Write the prediction file (``--check``: only say whether the committed one is current)."""
    argv = sys.argv[1:] if argv is None else argv
    payload = json.loads(SOURCE.read_text())
    inputs = measured(payload["results"])
    record = {
        "stamp": {
            "made_from": f"notebooks/results/{SOURCE.name}",
            "source_sha256": _sha(SOURCE),
            "source_date": payload["stamp"].get("date"),
            "source_gpu": payload["stamp"].get("gpu_name"),
            "code_sha256": {p.name: _sha(p) for p in CODE},
        },
        "model": {"config": CFG.name, "S": S, "B": B},
        "inputs": inputs,
        "steps": predictions(inputs),
        "peaks": peaks(),
    }
    if "--check" in argv:
        committed = json.loads(TARGET.read_text()) if TARGET.exists() else {}
        same = {k: v for k, v in committed.items() if k != "date"} == record
        print("current" if same else "stale: run python -m tools.ch08_predict")
        return 0 if same else 1
    record["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    TARGET.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
