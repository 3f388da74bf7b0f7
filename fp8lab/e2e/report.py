"""What chapter 09 shows from its result files, as tables: the models, the runs, the paired
accuracy verdicts with the margin in compute terms, the speed rounds and the cost projection.

Each function takes the loaded records (:func:`fp8lab.e2e.load_results`, the speed file) and
returns a ``pandas.DataFrame`` or plain numbers; an empty input gives an empty table, so a
page without result files still renders and says so.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import torch

from fp8lab import checks, flops, protocol
from fp8lab import corpus as text
from fp8lab.config import TransformerConfig
from fp8lab.e2e import stats
from fp8lab.e2e.settings import MODELS, RECIPES, SETTINGS, SPLIT_BY
from fp8lab.e2e.speed import ANCHOR, comparison


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
        per_step = flops.training_flops(cfg, plan.batch, plan.seq, causal=True)
        rows[model] = {
            "H / F / L": f"{cfg.hidden_size} / {cfg.ffn_hidden_size} / {cfg.num_layers}",
            "heads (KV groups)": f"{cfg.num_attention_heads} ({cfg.num_gqa_groups})",
            "V": f"{cfg.vocab_size:,}",
            "parameters": f"{flops.parameter_count(cfg) / 1e6:,.1f} M",
            "GFLOP/token": f"{per_step / plan.tokens_per_step / 1e9:.2f}",
            "B x S": f"{plan.batch} x {plan.seq}",
            "used for": "accuracy and speed" if model == "llama" else "speed only",
        }
    return pd.DataFrame(rows)


def gradient_gap(grads: torch.Tensor, reference: torch.Tensor) -> dict:
    """``grads`` against ``reference`` (flat tensors): the relative L2 error and the share of
    entries exactly zero where the reference's are not."""
    checks.tensor("grads", grads, dims=1, floating=True)
    checks.tensor("reference", reference, dims=1, floating=True)
    if grads.shape != reference.shape:
        raise ValueError(f"grads {tuple(grads.shape)} and reference "
                         f"{tuple(reference.shape)}: need the same shape")
    grads, reference = grads.float(), reference.float()
    error = (torch.linalg.vector_norm(grads - reference) / reference.norm()).item()
    zeroed = ((grads == 0) & (reference != 0)).float().mean().item()
    return {"relative error": error, "zeroed": zeroed}


def accuracy(runs, margin: float, baseline: str = ANCHOR, settings=RECIPES) -> dict:
    """Per FP8 setting of ``settings``: its final validation loss minus ``baseline``'s, paired
    by seed and judged by the protocol against ``margin`` (nats): a
    :class:`fp8lab.protocol.Paired` with five seeds or more, else the row of
    :func:`fp8lab.protocol.paired_summary`. torchao's: ``baseline="torch-bf16"``,
    ``settings=TORCH_SETTINGS``."""
    checks.choice("baseline", baseline, SETTINGS)
    found = {}
    for name in settings:
        checks.choice("settings", name, SETTINGS)
        if name == baseline:
            continue
        mine, base = stats.by_seed(runs, name), stats.by_seed(runs, baseline)
        if not set(mine) & set(base):
            continue
        names = (SETTINGS[name].label, SETTINGS[baseline].label)
        try:
            found[name] = protocol.paired(mine, base, margin=margin, names=names)
        except ValueError:  # fewer than five pairs (a smoke run): a row, no verdict
            found[name] = protocol.paired_summary(mine, base, margin=margin, names=names)
    return found


def accuracy_table(found: dict, runs, baseline: str = ANCHOR) -> pd.DataFrame:
    """:func:`accuracy` as a table, with the steps at which ``baseline`` reached each setting's
    mean loss (a share of its run)."""
    checks.choice("baseline", baseline, SETTINGS)
    rows = {}
    last = next((r["steps_planned"] for r in runs if r["setting"] == baseline), None)
    for name, result in found.items():
        row = (result if isinstance(result, dict) else
               {"seeds": len(result.seeds), "mean": result.mean, "low": result.low,
                "high": result.high, "verdict": result.verdict,
                "detectable": result.detectable})
        losses = stats.by_seed(runs, name)
        reached = stats.bf16_steps_to(runs, float(np.mean(list(losses.values()))), baseline)
        rows[SETTINGS[name].label] = {
            "pairs": row["seeds"], "mean Δ": row["mean"], "95% low": row["low"],
            "95% high": row["high"], "detects": row.get("detectable", np.nan),
            "BF16 steps to its loss": np.nan if reached is None or last is None
            else reached / last,
            "verdict": row["verdict"],
        }
    return pd.DataFrame(rows).T


def speed_table(record: dict | None) -> pd.DataFrame:
    """Per model and setting: GPU and host ms per step (medians over rounds), the ratio to TE
    BF16 with its interval and verdict, tokens/s and how it ran."""
    rows = {}
    for model, entry in (record or {}).get("models", {}).items():
        for group in entry["groups"]:
            for name in group["settings"]:
                key = (model, SETTINGS[name].label)
                if key in rows or name not in group["ms_per_step"]:
                    continue
                ms = float(np.median(group["ms_per_step"][name]))
                found = comparison(record, model, name) if name != ANCHOR else None
                ran = group["what_ran"][name]
                rows[key] = {
                    "GPU ms": ms,
                    "host ms": float(np.median(group["host_ms_per_step"][name])),
                    "× TE BF16": np.nan if found is None else found.estimate,
                    "95% interval": "" if found is None
                    else f"{found.low:.2f}–{found.high:.2f}",
                    "verdict": "" if found is None else found.verdict,
                    "tokens/s": entry["tokens_per_step"] / ms * 1e3,
                    "graphs": ran["graphs"] or ("refused" if ran["refused"] else "none"),
                }
    table = pd.DataFrame(rows).T
    if not table.empty:
        table.index.names = ["model", "setting"]
    return table


def projection(record: dict, target: TransformerConfig, tokens: float, seq: int) -> pd.DataFrame:
    """GPU-hours to train ``target`` on ``tokens`` at the large shape's measured rates, which
    must have been timed at ``seq``: its layers at each setting's rate (TE BF16's rate times
    the setting's paired ratio to it, so that drift between groups cancels), its LM head
    (BF16 in every setting) at TE BF16's. One GPU's rate, perfect scaling: a lower bound.
    An empty table where the record was timed at another length (a GPU file read at the
    smoke length on a CPU): rates are not carried from one length to another."""
    checks.integer("seq", seq)
    entry = record["models"]["large"]
    if entry["config"]["max_seq_len"] != seq:
        return pd.DataFrame()
    head, layers = head_and_layers(target, seq)
    table, rows = speed_table(record), {}
    bf16_key = ("large", SETTINGS[ANCHOR].label)
    if bf16_key not in table.index:
        return pd.DataFrame()
    bf16 = entry["flops_per_step"] / (table.loc[bf16_key, "GPU ms"] / 1e3)
    for name in RECIPES:  # each recipe's rate from its paired ratio to BF16, not its own ms
        found = comparison(record, "large", name) if name != ANCHOR else None
        if name != ANCHOR and found is None:
            continue
        rate = bf16 * (1.0 if found is None else found.estimate)
        seconds = tokens * (layers / rate + head / bf16)
        rows[SETTINGS[name].label] = {"model TFLOP/s": rate / 1e12,
                                      "GPU-hours (M)": seconds / 3600 / 1e6}
    return pd.DataFrame(rows).T


def head_and_layers(cfg: TransformerConfig, seq: int) -> tuple[float, float]:
    """Training FLOPs per token of ``cfg``'s LM head and of its layers (causal attention)."""
    head = 3 * flops.lm_head_flops(cfg, 1, seq) / seq
    return head, 3 * cfg.num_layers * flops.layer_flops(cfg, 1, seq, causal=True) / seq


def find(runs, setting: str, seed: int = 0) -> dict | None:
    """The run of ``setting`` with ``seed``, or None."""
    return next((r for r in runs if (r["setting"], r["seed"]) == (setting, seed)), None)


def origin(runs, made_here: bool) -> str:
    """Where the runs come from, in words: each stack they were stamped on (GPU, torch, TE,
    cuDNN) with its dates and its number of runs, or "made here"."""
    if not runs:
        return "nowhere yet: no result files (on a GPU box, python -m tools.train_e2e --plan)"
    if made_here:
        return "made here, just now, at smoke size (not stamped)"
    stacks: dict[str, list[str]] = {}
    for run in runs:
        stamp = run.get("stamp")
        if not stamp:
            continue
        stack = (f"{stamp['gpu_name']}, torch {stamp['torch']}, "
                 f"TE {stamp['transformer_engine']}, cuDNN {stamp.get('cudnn', '?')}")
        stacks.setdefault(stack, []).append(stamp["date"])
    if not stacks:
        return "committed without a GPU stamp"
    parts = []
    for stack, dates in stacks.items():
        first, last = min(dates), max(dates)
        when = first if first == last else f"{first} to {last}"
        parts.append(f"{len(dates)} on {stack}, {when}")
    unstamped = len(runs) - sum(len(d) for d in stacks.values())
    return "; ".join(parts + ([f"{unstamped} not stamped"] if unstamped else []))


def run_table(runs) -> pd.DataFrame:
    """One row per setting: its seeds, steps, minutes and problems."""
    rows = []
    for name in SETTINGS:  # TE's settings, then the PyTorch and torchao ones
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
