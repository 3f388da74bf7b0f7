"""The bench chapter 09's runs share: the corpus, the tokenizer, the token streams, and the
chapter's own code (:mod:`fp8lab.e2e.worker`), set up once per process; each run then builds
one model in one setting from that code (:meth:`Bench.build`) and trains it
(:meth:`Bench.run`, see :mod:`fp8lab.e2e.run`)."""

from __future__ import annotations

import gc
from collections.abc import Callable

import torch

import fp8lab
from fp8lab import checks
from fp8lab import corpus as text
from fp8lab.config import TransformerConfig, pad_vocab
from fp8lab.e2e import worker
from fp8lab.e2e.results import run_stamp
from fp8lab.e2e.run import run
from fp8lab.e2e.settings import (
    CORPUS,
    MODELS,
    PLANS,
    PRESETS,
    SETTINGS,
    SPLIT_BY,
    Plan,
    model_config,
)


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
    """The corpus, the tokenizer, the token streams and the chapter's worker cells, set up
    once; :meth:`build` makes one model in one setting, :meth:`run` trains it."""

    def __init__(self, preset: str | None = None, device=None, log: Callable | None = print,
                 corpus: text.Corpus | None = None, tokenizer=None, worker_module=None):
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
        self.worker = worker_module or worker.load()
        self._validation: dict[str, list] = {}

    def config(self, model: str) -> TransformerConfig:
        return model_config(model, self.vocab_size, self.preset)

    def plan(self, model: str) -> Plan:
        checks.choice("model", model, MODELS)
        return PLANS[(model, self.preset)]

    def loader(self, model: str, seed: int = 0) -> text.PackedLoader:
        """The training batches of ``model``'s plan in data order ``seed``, on the device."""
        plan = self.plan(model)
        return text.PackedLoader(self.train_tokens, plan.batch, plan.seq, seed=seed,
                                 device=self.device)

    def validation_batches(self, model: str) -> list:
        """The validation batches of ``model``'s plan (all, or its ``eval_batches``), built once."""
        if model not in self._validation:
            plan = self.plan(model)
            loader = text.PackedLoader(
                self.validation_tokens, plan.batch, plan.seq, device=self.device, shuffle=False
            )
            count = len(loader) if plan.eval_batches is None else min(len(loader),
                                                                       plan.eval_batches)
            self._validation[model] = list(loader.batches(count))
        return self._validation[model]

    def epochs(self, model: str) -> float:
        """How many times a full run goes through the training split."""
        return self.plan(model).steps / len(self.loader(model))

    def build(self, model: str, setting: str):
        """``(model, optimizer, fp8_recipe)`` from the worker cells: the same initial weights in
        every setting (``torch.manual_seed(plan.init_seed)`` before the model is made)."""
        checks.choice("setting", setting, SETTINGS)
        chosen, plan, code = SETTINGS[setting], self.plan(model), self.worker
        torch.manual_seed(plan.init_seed)
        built = code.Llama(self.config(model), self.te, device=self.device)
        if chosen.family == "torch":  # the same weights, in plain PyTorch
            te_model = built
            built = code.copy_from_te(code.TorchLlama(self.config(model), self.device), te_model)
            del te_model
            if chosen.fp8:
                if self.device.type != "cuda":
                    raise ValueError(f"setting={setting!r}: torchao's float8 training needs a "
                                     "CUDA GPU (its FP8 matrix products run there only)")
                built = code.to_float8(built, chosen.recipe)
            return built, code.make_optimizer(built, plan), None
        optimizer = code.make_optimizer(built, plan)
        return built, optimizer, code.make_recipe(self.recipe, chosen.recipe)

    def release(self) -> None:
        """Free the last run's memory and TE's global FP8 state, so runs do not see each other."""
        manager = getattr(getattr(self.te, "quantization", None), "FP8GlobalStateManager", None)
        if manager is not None:
            manager.reset()
        from fp8lab.e2e.speed import end_te_capture

        end_te_capture()
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def run(self, model: str, setting: str, seed: int = 0, steps: int | None = None) -> dict:
        """Train ``model`` in ``setting`` with data order ``seed`` for ``steps`` (default: the
        plan's); the result record (:func:`fp8lab.e2e.run.run`)."""
        return run(self, model, setting, seed, steps)

    def _stamp(self, record: dict) -> dict | None:
        return run_stamp(record, self.on_gpu, self.preset)
