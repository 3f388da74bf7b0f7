"""The processes :mod:`fp8lab.distributed` starts: one per GPU (or CPU process), under torchrun.

``python -m torch.distributed.run --nproc-per-node N -m fp8lab.parallel.worker --plan P --out D``
runs the tasks listed in the JSON file ``P`` in order. Rank 0 writes ``D/machine.json`` (where
it runs, :mod:`~fp8lab.parallel.machine`), ``D/<task>.started`` when a task begins and
``D/<task>.json`` when it ends: ``{"ok", "data": {"rows": [...]}, "error", "seconds"}``. Every
rank runs every task; a task builds the process groups it needs from the world size, so the
same code runs on 2, 4 or 8 GPUs (and on 2 CPU processes, through the CPU reference, with
gloo). A sub-run that raises becomes a row with its ``error``; the other rows of the task
still run.

Task kinds (one function each, :data:`TASKS`): ``links`` (collective bandwidth), ``amax``
(scales across ranks with and without amax reduction), ``ddp_check`` (losses of N GPUs against
one), ``ddp`` (step time and memory, 1..N GPUs), ``fsdp`` (FSDP2 with TE, meta init, FP8
weights), ``tp_check`` and ``tp`` (tensor and sequence parallelism, Userbuffers), ``cp_check``
and ``cp`` (context parallelism), ``timeline`` (where the kernels of one step run),
``rounds`` (the data-parallel layouts timed in alternating rounds,
:mod:`~fp8lab.parallel.tasks_rounds`), ``sleep`` (for tests).
"""

from __future__ import annotations

import sys
import time
import traceback

from fp8lab.parallel import tasks_checks, tasks_rounds, tasks_speed
from fp8lab.parallel.arguments import parse
from fp8lab.parallel.machine import machine_record
from fp8lab.parallel.process import Context, clean, error_text, setup, teardown, write_json

TASKS = {
    "links": tasks_speed.task_links,
    "amax": tasks_checks.task_amax,
    "ddp_check": tasks_checks.task_ddp_check,
    "ddp": tasks_speed.task_ddp,
    "fsdp": tasks_speed.task_fsdp,
    "tp_check": tasks_checks.task_tp_check,
    "tp": tasks_speed.task_tp,
    "cp_check": tasks_checks.task_cp_check,
    "cp": tasks_speed.task_cp,
    "timeline": tasks_speed.task_timeline,
    "rounds": tasks_rounds.task_rounds,
    "sleep": tasks_speed.task_sleep,
}


def run_task(ctx: Context, task: dict) -> None:
    """Run one task of the plan on every rank; rank 0 writes its ``.started`` and ``.json``."""
    name, kind = task["name"], task["kind"]
    if ctx.rank == 0:
        (ctx.out / f"{name}.started").write_text(str(time.time()))
    begin = time.perf_counter()
    error, data = None, {}
    try:
        data = TASKS[kind](ctx, task["args"])
    except Exception as caught:
        error = error_text(caught)
        if ctx.rank == 0:
            traceback.print_exc()
        clean(ctx)
    errors = [e for e in ctx.gather(error) if e]
    if ctx.rank == 0:
        result = {
            "ok": not errors,
            "data": data if not errors else {},
            "error": errors[0] if errors else None,
            "seconds": time.perf_counter() - begin,
        }
        write_json(ctx.out / f"{name}.json", result)
    ctx.barrier()


def main(argv: list[str] | None = None) -> int:
    """Run the tasks of a plan file; rank 0 writes their results (see the module's docstring)."""
    plan, out = parse(argv)
    ctx = setup(out)
    if ctx.rank == 0:
        write_json(ctx.out / "machine.json", machine_record(ctx))
    for task in plan["tasks"]:
        run_task(ctx, task)
    teardown(ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
