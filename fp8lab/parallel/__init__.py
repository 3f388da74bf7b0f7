"""Chapter 08's kit: the processes :mod:`fp8lab.distributed` starts on several GPUs.

* :mod:`~fp8lab.parallel.layouts` -- how each layout (DDP, FSDP2, TP/SP, CP) wraps or shards the
  model with Transformer Engine: the chapter shows this file in full;
* :mod:`~fp8lab.parallel.model` -- the stack of ``te.TransformerLayer``, its data, optimizer and
  training step;
* :mod:`~fp8lab.parallel.tasks_speed`, :mod:`~fp8lab.parallel.tasks_checks`,
  :mod:`~fp8lab.parallel.tasks_rounds` -- what a task measures (step time, memory, bandwidth, a
  timeline, the data-parallel layouts in alternating rounds) or checks (each layout against one
  GPU and against an FP32 reference);
* :mod:`~fp8lab.parallel.measure` -- timing, memory, one collective, a profiled step;
* :mod:`~fp8lab.parallel.process`, :mod:`~fp8lab.parallel.machine` -- a worker's ranks and
  groups, how each rank's result becomes one row; where the job ran;
* :mod:`~fp8lab.parallel.arguments`, :mod:`~fp8lab.parallel.worker` -- the command line and the
  entry point, ``python -m fp8lab.parallel.worker --plan PLAN.json --out FOLDER`` (under
  torchrun);
* :mod:`~fp8lab.parallel.jobs` -- the launcher's side: the tasks of a launch (``Task``),
  starting, watching and ending one job (no torch);
* :mod:`~fp8lab.parallel.plan`, :mod:`~fp8lab.parallel.report` -- the chapter's side: the tasks
  of one launch, and how their rows are read (intervals, verdicts, what an older file lacks).

This package imports none of them, so that ``python -m fp8lab.parallel.worker`` and the
launcher's :mod:`~fp8lab.parallel.jobs` load nothing they do not run.
"""
