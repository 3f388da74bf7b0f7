"""Chapter 09's kit: the plumbing around a Llama-shaped model trained on real text in BF16 and
in FP8 over five data-order seeds, and timed with a larger shape in alternated rounds.

The model, the recipes, the training step, the calibration pass and the graph capture are
written out in the chapter itself (its cells tagged ``worker``); :mod:`~fp8lab.e2e.worker`
loads those cells so that the long runs execute what the page shows. The rest is plumbing:

* :mod:`~fp8lab.e2e.settings` -- the models, their plans, the settings, the commands;
* :mod:`~fp8lab.e2e.bench` -- :class:`Bench`: corpus, tokenizer, token streams and the worker,
  set up once; :meth:`Bench.build` and :meth:`Bench.run`;
* :mod:`~fp8lab.e2e.run` -- one long run and its result record; the runs of one command;
* :mod:`~fp8lab.e2e.evaluation` -- :func:`evaluate`, the validation loss without gradients;
* :mod:`~fp8lab.e2e.results` -- result files, their names and stamps;
* :mod:`~fp8lab.e2e.speed` -- the speed rounds and their protocol comparisons;
* :mod:`~fp8lab.e2e.stats` -- losses by seed, the margin in compute terms;
* :mod:`~fp8lab.e2e.report` -- the chapter's tables;
* :mod:`~fp8lab.e2e.rope` -- a CPU stand-in for ``te.RotaryPositionEmbedding``.

The command lines are ``python -m tools.train_e2e`` and ``python -m tools.e2e_speed``.
"""

from __future__ import annotations

from fp8lab.e2e.bench import Bench
from fp8lab.e2e.evaluation import evaluate
from fp8lab.e2e.results import (  # noqa: F401
    RESULTS_DIR,
    ROOT,
    expected_files,
    load_results,
    result_modules,
    result_name,
    write_record,
)
from fp8lab.e2e.rope import RotaryStandIn
from fp8lab.e2e.run import FirstStepFailed, commands, describe_plan, run_all  # noqa: F401
from fp8lab.e2e.settings import (  # noqa: F401
    ACCURACY_MODEL,
    COMMAND_SEEDS,
    CORPUS,
    GROUPS,
    MODELS,
    PLANS,
    PRESETS,
    RECIPES,
    SCHEMA,
    SEEDS,
    SETTINGS,
    SMOKE_SEEDS,
    SPLIT_BY,
    TORCH_SETTINGS,
    TORCHAO_RECIPES,
    CorpusSpec,
    Plan,
    Setting,
    model_config,
    parse_runs,
)
from fp8lab.e2e.speed import class_call_kept  # noqa: F401

__all__ = [
    "CORPUS",
    "GROUPS",
    "MODELS",
    "PLANS",
    "SEEDS",
    "SETTINGS",
    "Bench",
    "RotaryStandIn",
    "evaluate",
    "load_results",
    "model_config",
    "parse_runs",
    "result_modules",
    "write_record",
]
