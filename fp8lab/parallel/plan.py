"""Chapter 08's plan: the tasks one launch of the worker runs, in order, at the sizes of a
preset. The notebook builds it and hands it to :func:`fp8lab.distributed.launch`; the same
list, saved as JSON, is what ``python -m fp8lab.parallel.worker --plan PLAN.json`` reads. Its
tasks are :class:`fp8lab.parallel.jobs.Task`\\ s: the plan sits below the launcher and imports
nothing of it.
"""

from __future__ import annotations

from fp8lab.parallel.jobs import Task


def chapter_tasks(
    seq: int, batch: int, seq_long: int, long_steps: dict, *, cuda: bool, smoke: bool
) -> list:
    """The chapter's tasks: links, DDP (variants, checks, amax), the fair rounds, FSDP2, TP/SP,
    CP, the profiled timeline, and TP with one hardware queue and with Userbuffers (a second
    job on GPUs: ``CUDA_DEVICE_MAX_CONNECTIONS`` must be set before CUDA starts). ``seq`` and
    ``batch`` are the shared S and B per GPU; ``seq_long`` is context parallelism's sequence."""
    task = Task
    one_queue = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if cuda else {}
    ddp_variants = [
        {"n": "all", "mode": "default"},  # 1, 2, ... GPUs; DDP's default 25 MB buckets
        {"n": "all", "mode": "tuned"},  # 200 MB buckets, gradients as views of them
        {"n": "all", "mode": "no_overlap"},  # one all-reduce after the backward
        {"n": "all", "mode": "tuned", "batch": 2 * batch},  # twice the work per GPU
    ]
    rounds = {"rounds": 2, "warmup": 1, "iters": 2} if smoke else {"rounds": 8, "warmup": 2}
    return [
        task(
            "links",
            "links",
            {"max_bytes": 2**20 if smoke else 2**30, "max_calls": 4 if smoke else 100},
        ),
        task("ddp", "ddp", {"variants": ddp_variants}, timeout_s=300),
        # a small learning rate: trajectories can be compared only while they do not diverge
        task("ddp_check", "ddp_check", {"batch": batch, "steps": 6, "lr": 1e-4}, timeout_s=200),
        task("amax", "amax", {"steps": 3, "calls": 5 if smoke else 100}, timeout_s=150),
        task("rounds", "rounds", {**rounds, "iters": rounds.get("iters", 8)}, timeout_s=300),
        task("fsdp", "fsdp", timeout_s=150),
        task("tp_check", "tp_check", {"batch": 2, "steps": 3}, timeout_s=200),
        task("tp", "tp", {"variants": [{"sp": True}, {"sp": False}]}, timeout_s=150),
        task("cp_check", "cp_check", {"batch": 1, "seq": 2 * seq, "steps": 3}, timeout_s=200),
        task(
            "cp",
            "cp",
            {
                "cases": [
                    {"seq": seq_long, "batch": 1, **long_steps},
                    {"seq": seq, "batch": 2 * batch, "single": False},
                ]
            },
            timeout_s=240,
        ),
        task("timeline", "timeline", {"layouts": ["DP", "TP+SP"]}, timeout_s=150),
        task("tp_overlap", "tp", {"variants": [{"sp": True}]}, env=one_queue, timeout_s=120),
        task(
            "tp_userbuffers",
            "tp",
            {"variants": [{"sp": True, "userbuffers": True}]},
            env=one_queue,
            timeout_s=150,
        ),
    ]
