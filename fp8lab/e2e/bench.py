"""The bench chapter 09's runs share: the corpus, the tokenizer, the token streams and the
initial weights, built once per process; each run then trains one model in one setting
(:meth:`Bench.run`, see :mod:`fp8lab.e2e.run`)."""

from __future__ import annotations

import gc
from collections.abc import Callable

import torch

import fp8lab
from fp8lab import checks
from fp8lab import corpus as text
from fp8lab.config import TransformerConfig, pad_vocab
from fp8lab.e2e import build
from fp8lab.e2e.results import run_stamp
from fp8lab.e2e.run import run
from fp8lab.e2e.settings import (
    CORPUS,
    MODELS,
    PLANS,
    PRESETS,
    SPLIT_BY,
    Plan,
    model_config,
)
from fp8lab.models import GPT


def _check_inputs(device, log, corpus, tokenizer) -> None:
    if device is not None:
        try:
            torch.device(device)
        except (RuntimeError, TypeError):
            raise TypeError(f"device={checks.show(device)}: must be a torch device") from None
    if log is not None and not callable(log):
        raise TypeError(f"log={checks.show(log)}: must be callable or None")
    if corpus is not None and not isinstance(corpus, text.Corpus):
        raise TypeError(f"corpus={checks.show(corpus)}: must be a fp8lab.corpus.Corpus or None")
    if tokenizer is not None and not callable(getattr(tokenizer, "get_vocab_size", None)):
        raise TypeError(f"tokenizer={checks.show(tokenizer)}: must be a tokenizers.Tokenizer")


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
        _check_inputs(device, log, corpus, tokenizer)
        self.te, self.recipe = fp8lab.import_te()
        env = fp8lab.detect()
        self.device = torch.device(device) if device is not None else env.device
        self.on_gpu = env.uses_real_te and self.device.type == "cuda"
        self.log = log or (lambda message: None)
        spec = CORPUS[self.preset]
        self.corpus = corpus or text.stdlib_corpus(max_bytes=spec.max_bytes, split_by=SPLIT_BY)
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
        """The validation batches of ``model``'s plan (all, or its ``eval_batches``), on the
        device, built once."""
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

    def _fp8_recipe(self, setting):
        return build.fp8_recipe(self.recipe, setting)

    def _build(self, model_name: str, setting, fp8_recipe, graphs: bool = False):
        """``(model, optimizer, what trains)``: the model in ``setting``'s form with the shared
        initial weights; what trains is the model with its loss, compiled where the setting
        compiles (with CUDA graphs where ``graphs``)."""
        cfg, plan = self.config(model_name), self.plan(model_name)
        reference = self.reference(model_name)
        if setting.form == "pytorch":
            self._compiled = self._compiled or setting.compile
            return build.build_pytorch(cfg, plan, setting, reference, self.device, graphs)
        return build.build_te(cfg, plan, self.te, reference, self.device)

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

    def run(self, model: str, setting: str, seed: int = 0, steps: int | None = None) -> dict:
        """Train ``model`` in ``setting`` with data order ``seed`` for ``steps`` (default: the
        plan's) and return the result record (:func:`fp8lab.e2e.run.run`)."""
        return run(self, model, setting, seed, steps)

    def _stamp(self, record: dict) -> dict | None:
        """The record's stamp (:func:`fp8lab.e2e.results.run_stamp`), or ``None``."""
        return run_stamp(record, self.on_gpu, self.preset)
