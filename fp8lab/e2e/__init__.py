"""Chapter 09's kit: a small GPT trained on real text in BF16 and in FP8 over five data-order
seeds, and the speed ratios of a small and a large GPT measured in alternating rounds.

* :mod:`~fp8lab.e2e.settings` -- the models, their plans, the settings and the groups of runs;
* :mod:`~fp8lab.e2e.build` -- one setting's recipe, model (shared initial weights) and optimizer;
* :mod:`~fp8lab.e2e.steps` -- the step without host syncs, calibration, CUDA-graph forms;
* :mod:`~fp8lab.e2e.stats` -- paired differences over seeds, their intervals and verdicts;
* :mod:`~fp8lab.e2e.bench` -- :class:`Bench`: corpus, tokenizer, token streams and initial
  weights, built once; :meth:`Bench.run` trains one model in one setting;
* :mod:`~fp8lab.e2e.run` -- one long run and its result record; the runs of one command;
* :mod:`~fp8lab.e2e.evaluation` -- :func:`evaluate`, the validation loss (without gradients,
  so validation does not roll TE's delayed-scaling amax history);
* :mod:`~fp8lab.e2e.results` -- result files, their names, throughput and stamps;
* :mod:`~fp8lab.e2e.speed` -- the alternated speed rounds and their per-round ratios.

The command lines are ``python -m tools.train_e2e`` and ``python -m tools.e2e_speed``.
"""

from __future__ import annotations

from fp8lab.e2e import speed  # noqa: F401  (fp8lab.e2e.speed, chapter 09's speed rounds)
from fp8lab.e2e.bench import Bench
from fp8lab.e2e.build import param_groups  # noqa: F401
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
from fp8lab.e2e.run import FirstStepFailed, describe_plan, run_all  # noqa: F401
from fp8lab.e2e.settings import (  # noqa: F401
    ACCURACY_MODEL,
    ACCURACY_SETTINGS,
    CORPUS,
    GROUPS,
    MODELS,
    PLANS,
    PRESETS,
    SCHEMA,
    SEEDS,
    SETTINGS,
    SPLIT_BY,
    CorpusSpec,
    Plan,
    Setting,
    model_config,
    parse_runs,
)

__all__ = [
    "SEEDS",
    "CORPUS",
    "GROUPS",
    "MODELS",
    "PLANS",
    "SETTINGS",
    "Bench",
    "evaluate",
    "load_results",
    "model_config",
    "parse_runs",
    "result_modules",
    "write_record",
]
