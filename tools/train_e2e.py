"""Chapter 09's long runs: two GPTs trained on real text in BF16 and in every FP8 setting.

Each run trains one model in one setting from the same initial weights, on the same batches in
the same order (``seed`` picks the order; the BF16 band repeats BF16 over seeds 0, 1, 2), with
the same warm-up + cosine learning rate and the same AdamW settings, and writes one small JSON
file: the training loss of every step, the validation loss every ``eval_every`` steps, the
wall time of every step, tokens/s and MFU of the whole step (data loading, forward, backward
and optimizer; validation excluded), peak memory, what exactly ran (recipe, attention and weight
precision, optimizer, compilation) and the corpus and tokenizer it ran on. On a GPU with
Transformer Engine and the full preset, the file is stamped like the chapters
(:func:`fp8lab.stamp.stamp_record`, over the fp8lab modules this script imports and this script
itself); the CPU lane checks the stamps (``tests/test_e2e.py``).

Run it on a GPU box, one group per command (each under ten minutes on one H200)::

    python -m tools.train_e2e --model small --group te --out DIR
    python -m tools.train_e2e --model small --group torch --out DIR
    python -m tools.train_e2e --model large --group te --out DIR
    python -m tools.train_e2e --model large --group torch --out DIR
    python -m tools.train_e2e --plan                       # models, plans, FLOPs, commands

and commit the files of ``DIR`` under ``tests/gpu_results/e2e/``. ``--runs bf16:1,te-delayed``
runs single settings; ``--steps N`` stops early (such a file is not stamped: only full runs are
results). A command skips the runs that would not finish inside ``--budget-s`` and prints the
command that runs them.

The training step is :func:`fp8lab.training.train` (its :func:`~fp8lab.training.train_step`
with gradient clipping, called once per evaluation interval, with ``on_step`` advancing the
learning-rate schedule and taking the step's wall time); the FP8 weights setting uses
Transformer Engine's ``FusedAdam(master_weights=True)`` with its FP32 master weights seeded from
the shared initial weights (:func:`fp8lab.training.seed_master_weights`). Everything else
around the step (the schedule, the optimizer, the clocks, the validation) lives in
:meth:`Bench.run`.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

import fp8lab
from fp8lab import checks, flops, training
from fp8lab import corpus as text
from fp8lab.config import TransformerConfig, pad_vocab
from fp8lab.models import GPT
from fp8lab.speedometer import Timing

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "tests" / "gpu_results" / "e2e"
MODELS = ("small", "large")
PRESETS = ("smoke", "full")
BAND_SEEDS = (0, 1, 2)
SCHEMA = 1

# --- what is trained, and how ----------------------------------------------------------------


@dataclass(frozen=True)
class CorpusSpec:
    """The corpus slice and the tokenizer's vocabulary of a preset."""

    vocab_size: int
    max_bytes: int | None


CORPUS = {"full": CorpusSpec(8192, None), "smoke": CorpusSpec(512, 400_000)}


def model_config(model: str, vocab_size: int, preset: str = "full") -> TransformerConfig:
    """``small``: GPT-2 small's shape (H=768, 12 layers, LayerNorm, GeLU, learned positions,
    tied embeddings); ``large``: five layers of Llama 3 8B's shape (H=4096, F=14336, 32 heads
    in 8 KV groups, SwiGLU, RMSNorm, RoPE, no biases, untied), 1.16B parameters at V=8192."""
    checks.choice("model", model, MODELS)
    checks.choice("preset", preset, PRESETS)
    vocab_size = checks.integer("vocab_size", vocab_size)
    smoke = preset == "smoke"
    if model == "small":
        shape = (64, 256, 4, 2, 64) if smoke else (768, 3072, 12, 12, 1024)
        h, f, a, layers, seq = shape
        return TransformerConfig(
            h, f, a, num_layers=layers, vocab_size=vocab_size, max_seq_len=seq, name="small"
        )
    h, f, a, g, layers, seq = (64, 192, 4, 2, 2, 64) if smoke else (4096, 14336, 32, 8, 5, 2048)
    return TransformerConfig(
        h,
        f,
        a,
        num_gqa_groups=g,
        num_layers=layers,
        vocab_size=vocab_size,
        activation="swiglu",
        normalization="RMSNorm",
        bias=False,
        tied_embeddings=False,
        position_embedding="rope",
        max_seq_len=seq,
        name="large",
    )


@dataclass(frozen=True)
class Plan:
    """One model's run: batch shape, length, learning-rate schedule, AdamW and measurement."""

    batch: int  # B
    seq: int  # S
    steps: int
    lr: float  # peak learning rate
    warmup_steps: int
    eval_every: int
    timing_warmup: int  # steps left out of the throughput (compilation, autotuning)
    eval_batches: int | None = None  # None: the whole validation split
    min_lr_ratio: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1  # on matrices and embeddings; not on norms and biases
    max_grad_norm: float = 1.0  # gradients clipped to this global L2 norm
    init_seed: int = 1234

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq

    def lr_factor(self, step: int) -> float:
        """Linear warm-up over ``warmup_steps``, then a cosine down to ``min_lr_ratio`` at the
        last step (the multiplier ``torch.optim.lr_scheduler.LambdaLR`` applies at ``step``)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (
            1 + math.cos(math.pi * progress)
        )

    def eval_points(self, steps: int) -> list[int]:
        """Step counts after which the validation loss is measured: every ``eval_every`` steps
        and at the end."""
        points = list(range(self.eval_every, steps + 1, self.eval_every))
        return points if points and points[-1] == steps else [*points, steps]


PLANS = {
    ("small", "full"): Plan(16, 1024, 300, 6e-4, 30, eval_every=20, timing_warmup=10),
    ("large", "full"): Plan(8, 2048, 60, 3e-4, 6, eval_every=20, timing_warmup=10),
    ("small", "smoke"): Plan(8, 64, 30, 3e-3, 3, eval_every=10, timing_warmup=3, eval_batches=4),
    ("large", "smoke"): Plan(8, 64, 30, 3e-3, 3, eval_every=10, timing_warmup=3, eval_batches=4),
}


@dataclass(frozen=True)
class Setting:
    """One way to train: the layer form, the FP8 recipe (TE) or torchao recipe, and extras."""

    name: str
    label: str
    form: str = "te_layer"
    recipe: str | None = None  # TE: "delayed", "current" or "block"
    fp8_attention: bool = False  # DelayedScaling(fp8_dpa=True, fp8_mha=True)
    fp8_weights: bool = False  # te.quantized_model_init + FusedAdam(master_weights=True)
    torchao: str | None = None  # "tensorwise" or "rowwise"
    compile: bool = False

    @property
    def fp8(self) -> bool:
        return self.recipe is not None or self.torchao is not None

    @property
    def gpu_only(self) -> str | None:
        """Why this setting needs a GPU with TE (None if it runs on the CPU reference, where FP8
        attention is refused and ``te-fastest`` falls back to FP8 weights alone)."""
        if self.compile:  # every torchao setting compiles
            return (
                "compiled runs are measured on the GPU only (compiling would take longer "
                "than the CPU lane's budget)"
            )
        return None


SETTINGS = {
    s.name: s
    for s in (
        Setting("bf16", "TE BF16"),
        Setting("te-delayed", "TE FP8 delayed", recipe="delayed"),
        Setting("te-current", "TE FP8 current", recipe="current"),
        Setting("te-block", "TE FP8 block", recipe="block"),
        Setting(
            "te-fastest",
            "TE FP8 fastest",
            recipe="delayed",
            fp8_attention=True,
            fp8_weights=True,
        ),
        Setting("torch-bf16", "PyTorch BF16", form="pytorch"),
        Setting("torch-bf16-compiled", "PyTorch BF16 compiled", form="pytorch", compile=True),
        Setting(
            "ao-tensorwise",
            "torchao tensorwise",
            form="pytorch",
            torchao="tensorwise",
            compile=True,
        ),
        Setting(
            "ao-rowwise",
            "torchao rowwise",
            form="pytorch",
            torchao="rowwise",
            compile=True,
        ),
    )
}
# te-fastest tries these (FP8 attention, FP8 weights) in order; a variant that cannot take its
# first step here (no FP8 attention backend for the shape, say) gives way to the next.
FASTEST_VARIANTS = ((True, True), (False, True), (True, False))
GROUPS = {
    "te": (
        *(f"bf16:{seed}" for seed in BAND_SEEDS),
        "te-delayed",
        "te-current",
        "te-block",
        "te-fastest",
    ),
    "torch": ("torch-bf16", "torch-bf16-compiled", "ao-tensorwise", "ao-rowwise"),
}


def parse_runs(runs: str) -> list[tuple[str, int]]:
    """``"bf16:1,te-delayed"`` -> ``[("bf16", 1), ("te-delayed", 0)]``."""
    if not isinstance(runs, str) or not runs.strip():
        raise ValueError(f"runs={runs!r}: must be a comma-separated list of setting[:seed]")
    parsed = []
    for item in runs.split(","):
        name, _, seed = item.strip().partition(":")
        checks.choice("runs", name, SETTINGS)
        if seed and not seed.isdigit():
            raise ValueError(f"runs={runs!r}: the seed after ':' must be a number")
        parsed.append((name, int(seed or 0)))
    return parsed


def result_name(model: str, setting: str, seed: int) -> str:
    return f"{model}__{setting}__seed{seed}.json"


def expected_files() -> list[str]:
    """The result files of the whole plan: both models, every run of every group."""
    return [
        result_name(model, setting, seed)
        for model in MODELS
        for group in GROUPS.values()
        for setting, seed in parse_runs(",".join(group))
    ]


def load_results(directory: Path | str = RESULTS_DIR) -> list[dict]:
    """Every result file of ``directory``, in name order."""
    return [json.loads(path.read_text()) for path in sorted(Path(directory).glob("*.json"))]


# --- measuring -------------------------------------------------------------------------------


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay on matrices and embeddings, none on norms and biases."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches, te=None, fp8_recipe=None) -> float:
    """Mean next-token loss over ``batches``, in the precision the model trains in."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = torch.zeros((), device=device, dtype=torch.float64), 0
    for inputs, targets in batches:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            if fp8_recipe is not None:
                with te.autocast(enabled=True, recipe=fp8_recipe):
                    logits = model(inputs)
            else:
                logits = model(inputs)
        total += training.lm_loss(logits, targets).double() * targets.numel()
        count += targets.numel()
    model.train(was_training)
    return (total / count).item()


class FirstStepFailed(RuntimeError):
    """A setting could not take its first training step here."""


def _finite(values) -> list:
    return [None if v is None or not math.isfinite(v) else round(float(v), 5) for v in values]


def result_modules() -> list[str]:
    """What a result file's stamp hashes: the fp8lab modules this script imports, and itself."""
    from fp8lab import stamp

    return sorted({*stamp.producer_modules(Path(__file__)), "tools.train_e2e"})


class Bench:
    """The corpus, the tokenizer, the token streams and the initial weights, built once; then
    :meth:`run` trains one model in one setting and returns its result record."""

    def __init__(
        self,
        preset: str | None = None,
        device: torch.device | str | None = None,
        log: Callable[[str], None] | None = print,
        corpus: text.Corpus | None = None,
        tokenizer=None,
    ):
        self.preset = checks.choice("preset", preset or fp8lab.preset(), PRESETS)
        self.te, self.recipe = fp8lab.import_te()
        env = fp8lab.detect()
        self.device = torch.device(device) if device is not None else env.device
        self.on_gpu = env.uses_real_te and self.device.type == "cuda"
        self.log = log or (lambda message: None)
        spec = CORPUS[self.preset]
        self.corpus = corpus or text.stdlib_corpus(max_bytes=spec.max_bytes)
        self.tokenizer = tokenizer or text.train_tokenizer(self.corpus, spec.vocab_size)
        self.vocab_size = pad_vocab(self.tokenizer.get_vocab_size(), text.VOCAB_MULTIPLE)
        self.train_tokens = text.token_stream(self.corpus, self.tokenizer, "train")
        self.validation_tokens = text.token_stream(self.corpus, self.tokenizer, "validation")
        self._references: dict[str, GPT] = {}
        self._validation: dict[str, list] = {}
        self._compiled = False

    def config(self, model: str) -> TransformerConfig:
        return model_config(model, self.vocab_size, self.preset)

    def plan(self, model: str) -> Plan:
        checks.choice("model", model, MODELS)
        return PLANS[(model, self.preset)]

    def reference(self, model: str) -> GPT:
        """The initial weights every run of ``model`` starts from (FP32, on the CPU, drawn from
        ``plan.init_seed``: the same on every machine)."""
        if model not in self._references:
            torch.manual_seed(self.plan(model).init_seed)
            self._references[model] = GPT(self.config(model), form="pytorch", device="cpu")
        return self._references[model]

    def validation_batches(self, model: str) -> list:
        if model not in self._validation:
            plan = self.plan(model)
            loader = text.PackedLoader(
                self.validation_tokens, plan.batch, plan.seq, device=self.device, shuffle=False
            )
            count = (
                len(loader) if plan.eval_batches is None else min(len(loader), plan.eval_batches)
            )
            self._validation[model] = list(loader.batches(count))
        return self._validation[model]

    def epochs(self, model: str) -> float:
        """How many times a full run goes through the training split."""
        plan = self.plan(model)
        loader = text.PackedLoader(self.train_tokens, plan.batch, plan.seq)
        return plan.steps / len(loader)

    # building ---------------------------------------------------------------------------------

    def _fp8_recipe(self, setting: Setting, fp8_attention: bool):
        if setting.recipe == "delayed":
            if fp8_attention:
                return self.recipe.DelayedScaling(fp8_dpa=True, fp8_mha=True)
            return self.recipe.DelayedScaling()
        if setting.recipe == "current":
            return self.recipe.Float8CurrentScaling()
        if setting.recipe == "block":
            return self.recipe.Float8BlockScaling()
        return None

    def _adamw(self, model: torch.nn.Module, plan: Plan) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            param_groups(model, plan.weight_decay),
            lr=plan.lr,
            betas=plan.betas,
            eps=plan.eps,
            fused=self.device.type == "cuda",
        )

    def _build(self, model_name: str, setting: Setting, fp8_recipe, fp8_weights: bool):
        """``(model, optimizer, what trains)``: the model in ``setting``'s form with the shared
        initial weights; what trains is the compiled model where the setting compiles."""
        te, device, plan = self.te, self.device, self.plan(model_name)
        cfg, reference = self.config(model_name), self.reference(model_name)
        no_dropout = {"hidden_dropout": 0.0, "attention_dropout": 0.0}
        if setting.form == "pytorch":
            model = GPT(cfg, form="pytorch", device=device, **no_dropout)
            model.load_weights_from(reference)
            if setting.torchao is not None:
                from torchao.float8 import Float8LinearConfig, convert_to_float8_training

                convert_to_float8_training(
                    model,
                    config=Float8LinearConfig.from_recipe_name(setting.torchao),
                    module_filter_fn=lambda module, fqn: fqn != "head",  # LM head stays BF16
                )
            optimizer = self._adamw(model, plan)
            if setting.compile:
                self._compiled = True
                return model, optimizer, torch.compile(model)
            return model, optimizer, model
        if not fp8_weights:
            model = GPT(cfg, form="te_layer", te=te, device=device, **no_dropout)
            model.load_weights_from(reference)
            return model, self._adamw(model, plan), model
        # FP8 weights: FP8 parameters (BF16 where TE keeps no FP8 copy), FP32 masters in the
        # optimizer seeded with the exact initial weights, not with their FP8 roundings.
        twin = GPT(cfg, form="te_layer", te=te, device=device, **no_dropout)
        twin.load_weights_from(reference)
        with te.quantized_model_init(enabled=True, recipe=fp8_recipe):
            model = GPT(
                cfg,
                form="te_layer",
                te=te,
                params_dtype=torch.bfloat16,
                device=device,
                **no_dropout,
            )
        model.load_weights_from(twin)
        optimizer = te.optimizers.FusedAdam(
            param_groups(model, plan.weight_decay),
            lr=plan.lr,
            betas=plan.betas,
            eps=plan.eps,
            master_weights=True,
        )
        training.seed_master_weights(optimizer, model, source=twin)
        del twin
        return model, optimizer, model

    def release(self) -> None:
        """Free the last run's memory and TE's global FP8 state, so runs do not see each other.

        ``torch._dynamo.reset()`` drops compiled graphs: the compiled settings' models, and the
        variants of TE's own ``torch.compile``'d helpers (its fused bias-dropout-add recompiles
        for each shape and dtype and stops at dynamo's recompile limit, chapter 03)."""
        if self._compiled or self.device.type == "cuda":
            torch._dynamo.reset()
            self._compiled = False
        manager = getattr(getattr(self.te, "quantization", None), "FP8GlobalStateManager", None)
        if manager is not None:
            manager.reset()
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def step_function(self, model: str, setting: str, seed: int = 0) -> Callable[[], object]:
        """A callable that trains ``model`` in ``setting`` for one more step (at the peak learning
        rate), for a profiler; call :meth:`release` when done with it."""
        checks.choice("model", model, MODELS)
        chosen = SETTINGS[checks.choice("setting", setting, SETTINGS)]
        if chosen.gpu_only and not self.on_gpu:
            raise ValueError(f"setting={setting!r}: needs a GPU with TE ({chosen.gpu_only})")
        plan = self.plan(model)
        fp8_recipe = self._fp8_recipe(chosen, chosen.fp8_attention)
        _, optimizer, trained = self._build(model, chosen, fp8_recipe, chosen.fp8_weights)
        fp8 = {"te": self.te, "fp8_recipe": fp8_recipe} if fp8_recipe is not None else {}
        batches = iter(
            text.PackedLoader(
                self.train_tokens, plan.batch, plan.seq, seed=seed, device=self.device
            )
        )

        options = training.StepOptions(max_grad_norm=plan.max_grad_norm)

        def step():
            return training.train(trained, [next(batches)], optimizer, options=options, **fp8)

        return step

    # running ----------------------------------------------------------------------------------

    def run(self, model: str, setting: str, seed: int = 0, steps: int | None = None) -> dict:
        """Train ``model`` in ``setting`` with data order ``seed`` for ``steps`` (default: the
        plan's) and return the result record (see the module docstring)."""
        checks.choice("model", model, MODELS)
        checks.choice("setting", setting, SETTINGS)
        seed = checks.integer("seed", seed, minimum=0)
        plan, cfg, chosen = self.plan(model), self.config(model), SETTINGS[setting]
        steps = plan.steps if steps is None else checks.integer("steps", steps, maximum=plan.steps)
        if chosen.gpu_only and not self.on_gpu:
            raise ValueError(f"setting={setting!r}: needs a GPU with TE ({chosen.gpu_only})")
        begin = time.perf_counter()
        record = {
            "schema": SCHEMA,
            "model": model,
            "setting": setting,
            "label": chosen.label,
            "seed": seed,
            "preset": self.preset,
            "config": asdict(cfg),
            "parameters": flops.parameter_count(cfg),
            "plan": asdict(plan),
            "steps_planned": plan.steps,
            "steps_requested": steps,
            "corpus": self.corpus.describe(),
            "tokenizer": {
                "vocab_size": self.tokenizer.get_vocab_size(),
                "model_vocab_size": self.vocab_size,
                "sha256": text.tokenizer_sha256(self.tokenizer),
                "train_tokens": int(self.train_tokens.size),
                "validation_tokens": int(self.validation_tokens.size),
            },
            "device": torch.cuda.get_device_name() if self.device.type == "cuda" else "cpu",
            "notes": [],
            "error": None,
        }
        variants = (
            FASTEST_VARIANTS
            if setting == "te-fastest"
            else ((chosen.fp8_attention, chosen.fp8_weights),)
        )
        for fp8_attention, fp8_weights in variants:
            try:
                record.update(self._train(model, chosen, seed, steps, fp8_attention, fp8_weights))
                break
            except FirstStepFailed as failure:
                record["notes"].append(
                    f"FP8 attention={fp8_attention}, FP8 weights={fp8_weights}: {failure}"
                )
                self.release()
        else:
            record["error"] = "could not take a first step: " + " | ".join(record["notes"])
        self.release()
        record["wall_s"] = round(time.perf_counter() - begin, 1)
        record["stamp"] = self._stamp(record)
        return record

    def _stamp(self, record: dict) -> dict | None:
        """A stamp for a run of the whole plan on a GPU with TE (one that failed or diverged on
        the way included: that is a result too); none for a run cut short with ``steps``."""
        whole_plan = record["steps_requested"] == record["steps_planned"]
        if not (self.on_gpu and self.preset == "full" and whole_plan):
            return None
        from fp8lab import stamp as lane

        return lane.stamp_record(result_modules(), run_seconds=record["wall_s"])

    def _train(
        self,
        model_name: str,
        setting: Setting,
        seed: int,
        steps: int,
        fp8_attention: bool,
        fp8_weights: bool,
    ) -> dict:
        plan, cfg, cuda = self.plan(model_name), self.config(model_name), self.device.type == "cuda"
        fp8_recipe = self._fp8_recipe(setting, fp8_attention)
        try:
            model, optimizer, trained = self._build(model_name, setting, fp8_recipe, fp8_weights)
        except Exception as error:  # a setting this machine cannot build
            raise FirstStepFailed(
                f"{type(error).__name__}: {error}".splitlines()[0][:300]
            ) from None
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, plan.lr_factor)
        loader = text.PackedLoader(
            self.train_tokens, plan.batch, plan.seq, seed=seed, device=self.device
        )
        validation = self.validation_batches(model_name)
        fp8 = {"te": self.te, "fp8_recipe": fp8_recipe} if fp8_recipe is not None else {}
        options = training.StepOptions(max_grad_norm=plan.max_grad_norm)
        seconds: list[float] = []
        clock = [0.0]

        def on_step(_model, _step):
            now = time.perf_counter()
            seconds.append(now - clock[0])
            scheduler.step()
            clock[0] = time.perf_counter()

        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        losses: list[float] = []
        evaluated: list[tuple[int, float]] = []
        error = None
        for stop in plan.eval_points(steps):
            done = len(losses)
            try:
                clock[0] = time.perf_counter()
                chunk = training.train(
                    trained,
                    loader.batches(stop - done, start=done),
                    optimizer,
                    on_step=on_step,
                    options=options,
                    **fp8,
                )
            except Exception as failure:
                message = f"{type(failure).__name__}: {failure}".splitlines()[0][:300]
                if not losses:
                    del model, optimizer, trained
                    raise FirstStepFailed(message) from None
                error = f"step {done}..{stop}: {message}"
                break
            losses.extend(chunk.tolist())
            value = evaluate(model, validation, **fp8)
            evaluated.append((stop, value))
            self.log(
                f"  {model_name} {setting.name}: step {stop}/{steps} train {chunk[-1]:.4f} "
                f"validation {value:.4f} ({sum(seconds):.0f} s training)"
            )
            if not (math.isfinite(value) and np.isfinite(chunk).all()):
                error = f"non-finite loss by step {stop}: stopped"
                break
        peak_allocated = torch.cuda.max_memory_allocated() if cuda else None
        peak_reserved = torch.cuda.max_memory_reserved() if cuda else None
        what_ran = {
            "form": setting.form,
            "recipe": None if fp8_recipe is None else repr(fp8_recipe),
            "fp8_attention": fp8_attention,
            "fp8_weights": fp8_weights,
            "torchao": setting.torchao,
            "compiled": setting.compile,
            "optimizer": f"{type(optimizer).__module__}.{type(optimizer).__name__}",
            "optimizer_master_weights": fp8_weights,
        }
        del model, optimizer, trained
        return {
            "what_ran": what_ran,
            "steps_run": len(losses),
            "train_loss": _finite(losses),
            "validation": {
                "step": [s for s, _ in evaluated],
                "loss": _finite(v for _, v in evaluated),
            },
            "step_ms": [round(s * 1e3, 3) for s in seconds],
            "throughput": self._throughput(cfg, plan, setting, seconds, peak_allocated),
            "memory": {
                "peak_allocated_bytes": peak_allocated,
                "peak_reserved_bytes": peak_reserved,
            },
            "non_finite_losses": int(sum(not math.isfinite(v) for v in losses)),
            "error": error,
        }

    def _throughput(self, cfg, plan, setting, seconds, peak_allocated) -> dict | None:
        if len(seconds) < 2:
            return None
        skip = min(plan.timing_warmup, len(seconds) - 1)
        dtype = "fp8" if setting.fp8 else "bf16"
        peak = None
        if self.device.type == "cuda":
            from fp8lab.datasheet import gpu_spec

            try:
                peak = gpu_spec().peak_tflops(dtype)
            except ValueError:  # a GPU without a datasheet entry: no MFU, the rest stands
                peak = None
        timing = Timing(
            setting.name,
            tuple(s * 1e3 for s in seconds[skip:]),
            self.device.type,
            mode="step",
            warmup=skip,
            tokens=plan.tokens_per_step,
            flops=flops.training_flops(cfg, plan.batch, plan.seq, causal=True),
            peak_tflops=peak,
            peak_memory_bytes=peak_allocated,
        )
        return {
            "median_ms": timing.median_ms,
            "spread": timing.spread,
            "steps_timed": timing.iters,
            "first_step_s": seconds[0],
            "tokens_per_step": plan.tokens_per_step,
            "tokens_per_s": timing.tokens_per_s,
            "flops_per_step": timing.flops,
            "model_tflops": timing.tflops,
            "mfu": timing.mfu,
            "mfu_peak_dtype": dtype,
            "mfu_peak_tflops": peak,
        }


def write_record(record: dict, out: Path | str = RESULTS_DIR) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / result_name(record["model"], record["setting"], record["seed"])
    path.write_text(json.dumps(record, indent=1, allow_nan=False) + "\n")
    return path


# --- the command line ------------------------------------------------------------------------


def describe_plan(bench: Bench) -> str:
    lines = []
    for model in MODELS:
        cfg, plan = bench.config(model), bench.plan(model)
        step = flops.training_flops(cfg, plan.batch, plan.seq, causal=True)
        lines.append(
            f"{model}: H={cfg.hidden_size} L={cfg.num_layers} V={cfg.vocab_size}, "
            f"{flops.parameter_count(cfg) / 1e6:.0f}M parameters; B={plan.batch} S={plan.seq}, "
            f"{plan.steps} steps ({bench.epochs(model):.2f} epochs), "
            f"{step / 1e12:.2f} TFLOP per step ({step / 600e12 * 1e3:.0f} ms at 600 TFLOP/s)"
        )
    lines.append(f"corpus: {json.dumps(bench.corpus.describe())}")
    lines.append("commands:")
    lines += [
        f"  python -m tools.train_e2e --model {m} --group {g} --out DIR"
        for m in MODELS
        for g in GROUPS
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.train_e2e", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", choices=MODELS)
    parser.add_argument("--group", choices=sorted(GROUPS))
    parser.add_argument("--runs", help="comma-separated setting[:seed], e.g. bf16:1,te-delayed")
    parser.add_argument("--steps", type=int, help="stop early (the file is then not stamped)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--budget-s", type=float, default=540.0)
    parser.add_argument("--preset", choices=PRESETS)
    parser.add_argument("--plan", action="store_true", help="print the plan and the commands")
    args = parser.parse_args(argv)
    begin = time.perf_counter()
    print(fp8lab.banner(), flush=True)
    bench = Bench(args.preset, log=lambda message: print(message, flush=True))
    if args.plan:
        print(describe_plan(bench))
        return 0
    if args.model is None or (args.group is None) == (args.runs is None):
        parser.error("give --model and one of --group or --runs (or --plan)")
    runs = parse_runs(",".join(GROUPS[args.group]) if args.group else args.runs)
    print(f"corpus: {json.dumps(bench.corpus.describe())}", flush=True)
    longest, failures = 0.0, 0
    for index, (setting, seed) in enumerate(runs):
        elapsed = time.perf_counter() - begin
        if index and elapsed + 1.2 * longest > args.budget_s:
            rest = ",".join(f"{s}:{n}" for s, n in runs[index:])
            print(
                f"time budget: {elapsed:.0f} s used; not started: {rest}\n"
                f"  run: python -m tools.train_e2e --model {args.model} --runs {rest} --out DIR",
                flush=True,
            )
            return 2
        if SETTINGS[setting].gpu_only and not bench.on_gpu:
            print(f"{setting}: skipped here ({SETTINGS[setting].gpu_only})", flush=True)
            continue
        started = time.perf_counter()
        record = bench.run(args.model, setting, seed, steps=args.steps)
        longest = max(longest, time.perf_counter() - started)
        path = write_record(record, args.out)
        failures += record["error"] is not None
        rate = record.get("throughput") or {}
        validation = (record.get("validation") or {}).get("loss") or [None]
        print(
            f"{path.name}: {record['wall_s']:.0f} s, "
            f"{(rate.get('tokens_per_s') or 0):,.0f} tokens/s, MFU {(rate.get('mfu') or 0):.1%}, "
            f"validation {validation[-1]}, peak "
            f"{(record.get('memory') or {}).get('peak_allocated_bytes') or 0:,} B, "
            f"stamped: {record['stamp'] is not None}, error: {record['error']}",
            flush=True,
        )
    print(f"done in {time.perf_counter() - begin:.0f} s", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
