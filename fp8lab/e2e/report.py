"""What chapter 09 shows from its result files, as tables: the models, the runs, the paired
accuracy verdicts, the alternated speed, and the cost projection; and one live probe, the
first update of each FP8 setting against BF16's.

Each function takes the loaded records (:func:`fp8lab.e2e.load_results`, the speed file) and
returns a ``pandas.DataFrame``; an empty input gives an empty table, so a page without result
files still renders and says so.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import torch

from fp8lab import corpus as text
from fp8lab import flops
from fp8lab.config import TransformerConfig
from fp8lab.e2e import stats
from fp8lab.e2e import steps as stepping
from fp8lab.e2e.settings import ACCURACY_SETTINGS, MODELS, SETTINGS, SPLIT_BY
from fp8lab.e2e.speed import ANCHOR, ratio


def encodings_share(root=None) -> dict:
    """How much of the validation text a split by file puts in ``encodings/`` (codec tables,
    near-copies of each other), against a split by package."""
    shares = {}
    for split_by in ("file", SPLIT_BY):
        corpus = text.stdlib_corpus(root=root, split_by=split_by)
        sizes = dict(zip(corpus.validation_files, map(len, corpus.validation_texts), strict=True))
        codec = sum(size for path, size in sizes.items() if path.startswith("encodings/"))
        shares[split_by] = codec / sum(sizes.values())
    return shares


def model_table(bench) -> pd.DataFrame:
    """Shape, size, FLOPs per token, batch and length of both models' plans."""
    rows = {}
    for model in MODELS:
        cfg, plan = bench.config(model), bench.plan(model)
        per_token = flops.training_flops(cfg, plan.batch, plan.seq, causal=True)
        n = flops.parameter_count(cfg)
        rows[model] = {
            "H / F / L": f"{cfg.hidden_size} / {cfg.ffn_hidden_size} / {cfg.num_layers}",
            "norm, MLP": f"{cfg.normalization}, {cfg.activation}",
            "V": f"{cfg.vocab_size:,}",
            "parameters": f"{n / 1e6:,.1f} M",
            "GFLOP/token": f"{per_token / plan.tokens_per_step / 1e9:.2f}",
            "B x S": f"{plan.batch} x {plan.seq}",
            "steps (epochs)": f"{plan.steps} ({bench.epochs(model):.2f})",
            "used for": "accuracy and speed" if model == "small" else "speed only",
        }
    return pd.DataFrame(rows)


def by_seed(runs, setting: str, step: int | None = None) -> dict[int, float]:
    """``{seed: validation loss}`` of ``setting``'s runs after ``step`` (default: the last)."""
    found = {}
    for run in runs:
        if run["setting"] != setting or run.get("error"):
            continue
        at = step if step is not None else run["validation"]["step"][-1]
        value = stats.validation_at(run, at)
        if value is not None:
            found[run["seed"]] = value
    return found


def accuracy_table(runs, margin: float, yardsticks: dict[str, int | None]) -> pd.DataFrame:
    """Per FP8 setting and yardstick (``{name: step}``, None for the final step): the mean
    paired difference to TE BF16 and its 95% interval, judged against ``margin``."""
    rows = []
    for name in ACCURACY_SETTINGS[1:]:
        for yardstick, step in yardsticks.items():
            found = stats.paired_difference(
                by_seed(runs, name, step), by_seed(runs, "bf16", step), margin
            )
            rows.append(
                {
                    "setting": SETTINGS[name].label,
                    "yardstick": yardstick,
                    "pairs": len(found["seeds"]),
                    "mean Δ": found["mean"],
                    "95% low": found["low"],
                    "95% high": found["high"],
                    "verdict": found["verdict"],
                }
            )
    return pd.DataFrame(rows)


def first_update(bench, names=ACCURACY_SETTINGS, model: str = "small") -> pd.DataFrame:
    """The weight gradients of the transformer layers on the first batch, in each setting
    (after the calibration step where the setting has one), against TE BF16's: relative
    error and the share that came out exactly zero where BF16's is not."""
    plan, rows, reference = bench.plan(model), {}, None
    loader = text.PackedLoader(bench.train_tokens, plan.batch, plan.seq, device=bench.device)
    batch = loader.batch_at(0)
    for name in names:
        setting = SETTINGS[name]
        fp8_recipe = bench._fp8_recipe(setting)
        fp8 = {"te": bench.te, "fp8_recipe": fp8_recipe} if fp8_recipe is not None else {}
        built, optimizer, trained = bench._build(model, setting, fp8_recipe)
        if setting.calibrate:
            stepping.calibrate(trained, batch, optimizer, fp8)
        with stepping.precision(bench.device, **fp8):
            loss = trained(*batch)
        loss.backward()
        grads = torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).float().flatten()
                for p in built.layers.parameters()
            ]
        )
        if reference is None:
            reference = grads
        error = (torch.linalg.vector_norm(grads - reference) / reference.norm()).item()
        zeros = ((grads == 0) & (reference != 0)).float().mean().item()
        rows[SETTINGS[name].label] = {"relative error": error, "zeroed": zeros}
        del built, optimizer, trained, loss, grads
        bench.release()
    return pd.DataFrame(rows).T


def speed_table(record: dict) -> pd.DataFrame:
    """Per model and setting: device and host ms per step (medians over rounds), the ratio to
    TE BF16 with its interval over the rounds, tokens/s and how it ran."""
    rows = {}
    for model, entry in (record or {}).get("models", {}).items():
        for group in entry["groups"]:
            for name in group["settings"]:
                if (model, SETTINGS[name].label) in rows or name not in group["ms_per_step"]:
                    continue
                device_ms = float(np.median(group["ms_per_step"][name]))
                found = ratio(record, model, name) or {}
                ran = group["what_ran"][name]
                rows[(model, SETTINGS[name].label)] = {
                    "GPU ms": device_ms,
                    "host ms": float(np.median(group["host_ms_per_step"][name])),
                    "× TE BF16": found.get("estimate"),
                    "95% interval": f"{found['low']:.2f}–{found['high']:.2f}" if found else "",
                    "tokens/s": entry["tokens_per_step"] / device_ms * 1e3,
                    "graphs": ran["graphs"] or ("refused" if ran["refused"] else "none"),
                }
    table = pd.DataFrame(rows).T
    if not table.empty:
        table.index.names = ["model", "setting"]
    return table


def projection(record: dict, target: TransformerConfig, tokens: float, seq: int) -> pd.DataFrame:
    """GPU-hours to train ``target`` on ``tokens`` at the large model's measured rates: its
    layers at each setting's rate, its LM head (BF16 in every setting) at TE BF16's. One GPU's
    rate, perfect scaling: a lower bound."""
    per_step = record["models"]["large"]["flops_per_step"]
    head, layers = head_and_layers(target, seq)
    table, rows = speed_table(record), {}
    for name in (ANCHOR, "torch-bf16-compiled", *ACCURACY_SETTINGS[1:]):
        key = ("large", SETTINGS[name].label)
        if key not in table.index:
            continue
        rate = per_step / (table.loc[key, "GPU ms"] / 1e3)  # model FLOP/s of this setting
        bf16 = per_step / (table.loc[("large", SETTINGS[ANCHOR].label), "GPU ms"] / 1e3)
        seconds = tokens * (layers / rate + head / bf16)
        rows[SETTINGS[name].label] = {
            "model TFLOP/s": rate / 1e12,
            "GPU-hours (M)": seconds / 3600 / 1e6,
        }
    return pd.DataFrame(rows).T


def head_and_layers(cfg: TransformerConfig, seq: int) -> tuple[float, float]:
    """Training FLOPs per token of ``cfg``'s LM head and of its layers (causal attention)."""
    head = 3 * flops.lm_head_flops(cfg, 1, seq) / seq
    return head, 3 * cfg.num_layers * flops.layer_flops(cfg, 1, seq, causal=True) / seq


def find(runs, setting: str, seed: int = 0) -> dict | None:
    """The run of ``setting`` with ``seed``, or None."""
    return next((r for r in runs if (r["setting"], r["seed"]) == (setting, seed)), None)


def origin(runs, made_here: bool) -> str:
    """Where the runs come from, in words: the stamp's GPU and stack, or "made here"."""
    if not runs:
        return "nowhere yet: no result files (on a GPU box, python -m tools.train_e2e --plan)"
    if made_here:
        return "made here, just now, at smoke size (not stamped)"
    stamp = next((r["stamp"] for r in runs if r.get("stamp")), None)
    if stamp is None:
        return "committed without a GPU stamp"
    return (
        f"{stamp['gpu_name']}, torch {stamp['torch']}, TE {stamp['transformer_engine']}, "
        f"cuDNN {stamp.get('cudnn', '?')}, {stamp['date']}"
    )


def run_table(runs) -> pd.DataFrame:
    """One row per setting: its seeds, steps, minutes and problems."""
    rows = []
    for name in ACCURACY_SETTINGS:
        mine = [r for r in runs if r["setting"] == name]
        if not mine:
            continue
        rows.append(
            {
                "setting": SETTINGS[name].label,
                "seeds": ", ".join(str(r["seed"]) for r in sorted(mine, key=lambda r: r["seed"])),
                "steps": min(r.get("steps_run", 0) for r in mine),
                "minutes": f"{sum(r['wall_s'] for r in mine) / 60:.1f}",
                "failed": sum(r["error"] is not None for r in mine),
            }
        )
    return pd.DataFrame(rows)


def same_data(old: dict | None, new: dict) -> bool:
    """Whether two records ran on the same corpus, tokenizer, model and plan."""
    if old is None or old["tokenizer"]["sha256"] != new["tokenizer"]["sha256"]:
        return False
    return all(
        json.dumps(old[key], sort_keys=True) == json.dumps(new[key], sort_keys=True)
        for key in ("corpus", "config", "plan")
    )


def gap(first: dict, second: dict, steps: int) -> float:
    """The largest difference of two training-loss curves over their first ``steps``."""
    a = np.array(first["train_loss"][:steps], float)
    b = np.array(second["train_loss"][:steps], float)
    return float(np.nanmax(np.abs(a - b)))
