"""What chapter 09's long runs train, and how: the two models, their plans (batch shape,
length, learning-rate schedule, AdamW, measurement), the settings (BF16 and every FP8 form)
and the groups of runs one command runs.

Every run of a model starts from the same initial weights, sees the same batches in the same
order (``seed`` picks the order; the BF16 band repeats BF16 over seeds 0, 1, 2), and follows
the same warm-up + cosine learning rate with the same AdamW settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fp8lab import checks
from fp8lab.config import TransformerConfig

MODELS = ("small", "large")
PRESETS = ("smoke", "full")
BAND_SEEDS = (0, 1, 2)
SCHEMA = 1


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
