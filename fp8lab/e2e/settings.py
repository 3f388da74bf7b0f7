"""What chapter 09's runs train and time, and how: the models, their plans, the settings and
the commands that split the long runs.

``llama`` is trained for accuracy *and* timed: one architecture carries every verdict of the
chapter. ``large`` (five layers of Llama 3 8B at S = 8192, the length of the cost projection)
is timed only. Every run of a model starts from the same initial weights (drawn from
``plan.init_seed`` on the device), sees the batches of its data-order seed in the same order,
and follows the same warm-up and cosine learning rate with the same AdamW.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fp8lab import checks
from fp8lab.config import TransformerConfig
from fp8lab.recipes import label

MODELS = ("llama", "large")
PRESETS = ("smoke", "full")
SEEDS = (0, 1, 2, 3, 4)  # data orders: five per setting, paired by seed
SMOKE_SEEDS = (0, 1)  # what the CPU lane runs (no verdict: the protocol needs five)
SCHEMA = 3
ACCURACY_MODEL = "llama"
RECIPES = ("bf16", "delayed", "current", "block")  # setting names are fp8lab.recipes names


@dataclass(frozen=True)
class CorpusSpec:
    """The corpus slice and the tokenizer's vocabulary of a preset."""

    vocab_size: int
    max_bytes: int | None


CORPUS = {"full": CorpusSpec(8192, None), "smoke": CorpusSpec(512, 400_000)}
SPLIT_BY = "package"  # a package's sibling files (encodings/ tables) stay on one side

# (H, F, A, G, L, S) per model and preset
SHAPES = {
    ("llama", "full"): (1024, 3072, 16, 4, 24, 1024),
    ("large", "full"): (4096, 14336, 32, 8, 5, 8192),
    ("llama", "smoke"): (128, 256, 4, 2, 1, 64),
    ("large", "smoke"): (128, 384, 4, 2, 1, 128),
}


def model_config(model: str, vocab_size: int, preset: str = "full") -> TransformerConfig:
    """Llama-shaped models (SwiGLU, RMSNorm, GQA, RoPE, no biases, untied head): ``llama``,
    H = 1024 and 24 layers (about 0.3 B parameters at V = 8192), trained and timed;
    ``large``, five layers of Llama 3 8B's shape, timed at S = 8192."""
    checks.choice("model", model, MODELS)
    checks.choice("preset", preset, PRESETS)
    vocab_size = checks.integer("vocab_size", vocab_size)
    h, f, a, g, layers, seq = SHAPES[(model, preset)]
    return TransformerConfig(
        h, f, a, num_gqa_groups=g, num_layers=layers, vocab_size=vocab_size,
        activation="swiglu", normalization="RMSNorm", bias=False, tied_embeddings=False,
        position_embedding="rope", max_seq_len=seq, name=model,
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
    eval_batches: int | None = None  # None: the whole validation split
    min_lr_ratio: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1  # on matrices and embeddings; not on norms
    max_grad_norm: float = 1.0
    init_seed: int = 1234

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq

    def lr_factor(self, step: int) -> float:
        """Linear warm-up over ``warmup_steps``, then a cosine down to ``min_lr_ratio`` at the
        last step (the multiplier ``torch.optim.lr_scheduler.LambdaLR`` applies)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (
            1 + math.cos(math.pi * progress)
        )

    def before_end(self, share: float) -> int:
        """The step ``share`` of the plan before its end (at least one step before it)."""
        share = checks.number("share", share, positive=True, maximum=0.5)
        return self.steps - max(1, round(share * self.steps))

    def eval_points(self, steps: int) -> list[int]:
        """Steps after which the validation loss is measured: every ``eval_every``, 10% and 5%
        before the plan's end (the compute margin and its control read them) and at the end."""
        marks = {self.before_end(0.10), self.before_end(0.05)}
        points = {*range(self.eval_every, steps + 1, self.eval_every), steps}
        return sorted(points | {m for m in marks if 0 < m <= steps})


PLANS = {
    ("llama", "full"): Plan(16, 1024, 200, 3e-4, 20, eval_every=25),
    ("large", "full"): Plan(1, 8192, 20, 1e-4, 2, eval_every=20),
    ("llama", "smoke"): Plan(4, 64, 6, 2e-3, 2, eval_every=3, eval_batches=2),
    ("large", "smoke"): Plan(2, 128, 4, 1e-3, 1, eval_every=4, eval_batches=2),
}


@dataclass(frozen=True)
class Setting:
    """One way to train. ``family`` ``"te"``: the Llama of ``te.TransformerLayer`` and
    ``recipe`` a name of :mod:`fp8lab.recipes` (``"bf16"``: none); ``"torch"``: the same Llama
    in plain PyTorch with the TE model's initial weights, ``recipe`` ``"bf16"`` or one of
    torchao's float8 recipes (:data:`TORCHAO_RECIPES`)."""

    name: str
    recipe: str
    family: str = "te"

    @property
    def label(self) -> str:
        if self.family == "te":
            return f"TE {label(self.recipe)}"
        return "PyTorch BF16" if self.recipe == "bf16" else f"torchao FP8 {self.recipe}"

    @property
    def fp8(self) -> bool:
        return self.recipe != "bf16"


TORCHAO_RECIPES = ("tensorwise", "rowwise")
TORCH_SETTINGS = ("torch-bf16", *(f"torchao-{name}" for name in TORCHAO_RECIPES))
SETTINGS = {name: Setting(name, name) for name in RECIPES}
SETTINGS["torch-bf16"] = Setting("torch-bf16", "bf16", "torch")
SETTINGS.update({f"torchao-{name}": Setting(f"torchao-{name}", name, "torch")
                 for name in TORCHAO_RECIPES})
# One command per group of seeds: each fits one GPU command of under 9 minutes on an H100.
COMMAND_SEEDS = ((0, 1), (2, 3), (4,))
GROUPS = {
    "accuracy": tuple(f"{name}:{seed}" for seed in SEEDS for name in RECIPES),
    # torchao against its own BF16: the same Llama in plain PyTorch, paired by seed
    "torchao": tuple(f"{name}:{seed}" for seed in SEEDS for name in TORCH_SETTINGS),
}


def parse_runs(runs: str) -> list[tuple[str, int]]:
    """``"bf16:1,delayed"`` -> ``[("bf16", 1), ("delayed", 0)]``."""
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
