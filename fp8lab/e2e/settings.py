"""What chapter 09's long runs train, and how: the two models, their plans (batch shape,
length, learning-rate schedule, AdamW, measurement), the settings (BF16 and every FP8 form)
and the groups of runs one command runs.

Every run of a model starts from the same initial weights, sees the same batches in the same
order (``seed`` picks the order: every setting runs with each of :data:`SEEDS`, so that a
setting and BF16 pair up seed by seed), and follows the same warm-up + cosine learning rate
with the same AdamW settings. The large model is measured for speed only: its short runs are
not trained long or stably enough to judge accuracy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fp8lab import checks
from fp8lab.config import TransformerConfig
from fp8lab.recipes import label

MODELS = ("small", "large")
PRESETS = ("smoke", "full")
SEEDS = (0, 1, 2, 3, 4)  # data orders: five per setting, paired by seed
SCHEMA = 2


@dataclass(frozen=True)
class CorpusSpec:
    """The corpus slice and the tokenizer's vocabulary of a preset."""

    vocab_size: int
    max_bytes: int | None


CORPUS = {"full": CorpusSpec(8192, None), "smoke": CorpusSpec(512, 400_000)}
# Split by top-level package: the near-duplicate codec tables of encodings/ (and any package's
# sibling files) stay on one side.
SPLIT_BY = "package"


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
        """Step counts after which the validation loss is measured: at the end of the warm-up,
        every ``eval_every`` steps, and at the end."""
        points = {*range(self.eval_every, steps + 1, self.eval_every), steps}
        if self.warmup_steps <= steps:
            points.add(self.warmup_steps)
        return sorted(points)


PLANS = {
    ("small", "full"): Plan(16, 1024, 300, 6e-4, 30, eval_every=30, timing_warmup=10),
    ("large", "full"): Plan(8, 2048, 30, 3e-4, 6, eval_every=30, timing_warmup=10),
    ("small", "smoke"): Plan(8, 64, 30, 3e-3, 3, eval_every=10, timing_warmup=3, eval_batches=4),
    ("large", "smoke"): Plan(8, 64, 30, 3e-3, 3, eval_every=10, timing_warmup=3, eval_batches=4),
}


@dataclass(frozen=True)
class Setting:
    """One way to train: the layer form, the FP8 recipe (TE) and its options."""

    name: str
    label: str
    form: str = "te_layer"
    recipe: str | None = None  # TE: a name of fp8lab.recipes ("delayed", "current")
    amax_history_len: int = 1024  # delayed scaling: TE's defaults unless the setting says
    amax_compute_algo: str = "max"
    calibrate: bool = False  # one forward and backward that only records amaxes, before step 0
    compile: bool = False

    @property
    def fp8(self) -> bool:
        return self.recipe is not None

    @property
    def gpu_only(self) -> str | None:
        """Why this setting needs a GPU with TE (None if it runs on the CPU reference)."""
        if self.compile:
            return (
                "compiled runs are measured on the GPU only (compiling would take longer "
                "than the CPU lane's budget)"
            )
        return None


SETTINGS = {
    s.name: s
    for s in (
        Setting("bf16", f"TE {label('bf16')}"),
        Setting("te-delayed", f"TE {label('delayed')}", recipe="delayed"),
        Setting(
            "te-delayed-calibrated",
            f"TE {label('delayed')}, calibrated",
            recipe="delayed",
            amax_history_len=16,
            amax_compute_algo="most_recent",
            calibrate=True,
        ),
        Setting("te-current", f"TE {label('current')}", recipe="current"),
        Setting("torch-bf16", "PyTorch BF16", form="pytorch"),
        Setting("torch-bf16-compiled", "PyTorch BF16 compiled", form="pytorch", compile=True),
    )
}
# The accuracy runs: TE BF16 and each FP8 setting, every data-order seed (on the small model
# only: the large one is measured for speed). Seed-major, so a batch cut short leaves pairs.
ACCURACY_MODEL = "small"
ACCURACY_SETTINGS = ("bf16", "te-delayed", "te-delayed-calibrated", "te-current")
GROUPS = {
    "accuracy": tuple(f"{name}:{seed}" for seed in SEEDS for name in ACCURACY_SETTINGS),
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
