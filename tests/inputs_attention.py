"""Property-test entries for the attention pieces: ``fp8lab.attention`` and the attention FLOPs
of ``fp8lab.flops`` (imported by tests/test_inputs.py)."""

from __future__ import annotations

import os

import hypothesis.strategies as st
import torch

from fp8lab import attention, flops, reference
from tests.property_support import Entry, ints, maybe

MASKS = st.sampled_from(flops.ATTENTION_MASKS)
WINDOWS = st.sampled_from([None, (-1, -1), (-1, 0), (0, 0), (7, 0), (3, 5), (64, 0)])
SHAPE = attention.AttentionShape(1, 16, 2, 8, groups=1)
FAST = {"warmup": 0, "iters": 2, "profile": False}
DEVICES = st.sampled_from([None, "cpu", torch.device("cpu")])
TE = reference  # what fp8lab.import_te() returns first without a GPU: a module with TE's names


_ROUNDS = attention.interleaved_rounds(
    {"a": lambda: None, "b": lambda: sum(range(100))}, rounds=2, iters=1, warmup_s=0.0,
    device="cpu",
)


def _probe(te, shape):
    """The arguments are checked first; then, without a GPU, fp8_dpa is refused."""
    try:
        return attention.probe_softmax_scale(
            te, lambda: TE.DelayedScaling(fp8_dpa=True), shape, device="cpu"
        )
    except NotImplementedError as error:
        assert "GPU" in str(error)
        return "refused on a CPU"


def _qkv(groups, kv_dtype):
    """q [1, 12, 4, 8] in FP32; k and v with ``groups`` heads in ``kv_dtype`` (FP64 differs from
    q's dtype), or the junk itself in their place."""
    torch.manual_seed(0)
    if not isinstance(groups, int) or groups <= 0:
        kv_dtype = groups
    if not isinstance(kv_dtype, torch.dtype):
        return torch.randn(1, 12, 4, 8), kv_dtype, kv_dtype
    k, v = (torch.randn(1, 12, groups, 8, dtype=kv_dtype) for _ in range(2))
    return torch.randn(1, 12, 4, 8), k, v


def _explicit(groups, kv_dtype, mask, window_size, dropout_p):
    return attention.explicit_attention(
        *_qkv(groups, kv_dtype), mask=mask, window_size=window_size, dropout_p=dropout_p
    )


def _sdpa(groups, kv_dtype, mask, window_size, dropout_p):
    return attention.sdpa_attention(
        *_qkv(groups, kv_dtype), mask=mask, window_size=window_size, dropout_p=dropout_p
    )


def _shape(batch, seq, heads, head_dim, groups, mask, window_size, dropout):
    return attention.AttentionShape(
        batch, seq, heads, head_dim, groups, mask, window_size, dropout
    ).flops()


def _context(backend, env):
    with attention.backend_context(backend, env=env):
        inside = os.environ.get("NVTE_FUSED_ATTN")
    return inside


def _capture(level):
    with attention.capture_te_log(level) as lines:
        pass
    return lines


def _run(backend, mode, iters, warmup):
    return attention.run_attention(
        lambda: lambda x: x * 2,
        lambda: (torch.randn(4, requires_grad=True),),
        backend=backend,
        mode=mode,
        iters=iters,
        warmup=warmup,
        profile=False,
    ).median_ms


def _result(backend, status, label):
    return attention.AttentionResult(label=label, backend=backend, status=status).as_row()["status"]


# explicit_attention and sdpa_attention take the same arguments and share their rules
ATTENTION_CALL = {
    "args": {
        "groups": maybe(st.sampled_from([1, 2, 4])),
        "kv_dtype": maybe(st.sampled_from([torch.float32, torch.float32, torch.float64])),
        "mask": maybe(MASKS),
        "window_size": maybe(WINDOWS),
        "dropout_p": maybe(st.sampled_from([0.0, 0.1])),
    },
    "aliases": {"groups": ["k ", "heads", "q "], "kv_dtype": ["k ", "dtype"]},
    "signed": True,
    "examples": 20,
}

ENTRIES = {
    "flops.ATTENTION_MASKS": Entry(lambda: len(flops.ATTENTION_MASKS), {}, examples=2),
    "flops.attention_window": Entry(
        flops.attention_window,
        {"mask": maybe(MASKS), "window_size": maybe(WINDOWS)},
        signed=True,  # -1: no limit on that side
    ),
    "flops.attended_pairs": Entry(
        flops.attended_pairs,
        {"seq": maybe(ints(1, 5000)), "mask": maybe(MASKS), "window_size": maybe(WINDOWS)},
    ),
    "flops.attention_core_flops": Entry(
        flops.attention_core_flops,
        {
            "batch": maybe(ints()),
            "heads": maybe(st.sampled_from([8, 16, 32])),
            "seq": maybe(ints(1, 40000)),
            "head_dim": maybe(st.sampled_from([64, 128, 256])),
            "mask": maybe(MASKS),
            "window_size": maybe(WINDOWS),
            "groups": maybe(st.sampled_from([None, 1, 8])),
            "backward": maybe(st.booleans()),
            "backward_factor": maybe(st.sampled_from([2.0, 2.5])),
        },
        aliases={"heads": ["groups"], "groups": ["heads"]},
    ),
    "attention.BACKENDS": Entry(lambda: len(attention.BACKENDS), {}, examples=2),
    "attention.EXPECTED_FAMILY": Entry(lambda: len(attention.EXPECTED_FAMILY), {}, examples=2),
    "attention.AttentionShape": Entry(
        _shape,
        {
            "batch": maybe(ints(1, 4)),
            "seq": maybe(ints(1, 4096)),
            "heads": maybe(st.sampled_from([4, 8])),
            "head_dim": maybe(st.sampled_from([64, 128])),
            "groups": maybe(st.sampled_from([None, 1, 2, 4])),
            "mask": maybe(MASKS),
            "window_size": maybe(WINDOWS),
            "dropout": maybe(st.sampled_from([0.0, 0.1])),
        },
        aliases={"heads": ["groups"], "groups": ["heads"]},
    ),
    "attention.window_mask": Entry(
        attention.window_mask,
        {
            "seq": maybe(ints(1, 64)),
            "mask": maybe(MASKS),
            "window_size": maybe(WINDOWS),
            "device": maybe(DEVICES),
        },
    ),
    "attention.explicit_attention": Entry(_explicit, **ATTENTION_CALL),
    "attention.sdpa_attention": Entry(_sdpa, **ATTENTION_CALL),
    "attention.backend_context": Entry(
        _context,
        {
            "backend": maybe(st.sampled_from(list(attention.BACKENDS))),
            "env": maybe(st.sampled_from([None, {"NVTE_FP8_DPA_BWD": "0"}])),
        },
        examples=20,
    ),
    "attention.capture_te_log": Entry(
        _capture, {"level": maybe(st.sampled_from(["DEBUG", "INFO", "WARNING"]))}, examples=10
    ),
    "attention.run_attention": Entry(
        _run,
        {
            "backend": maybe(st.sampled_from(["explicit", "sdpa_auto", "te_auto"])),
            "mode": maybe(st.sampled_from(["forward", "forward_backward"])),
            "iters": maybe(ints(2, 4)),
            "warmup": maybe(ints(0, 2)),
        },
        examples=10,
    ),
    "attention.measure": Entry(
        lambda backend, shape, te, device: attention.measure(
            backend, shape, te, device=device, **FAST
        ),
        {
            "backend": maybe(st.sampled_from(["explicit", "sdpa_math", "sdpa_flash"])),
            "shape": maybe(st.just(SHAPE)),
            "te": maybe(st.sampled_from([None, TE])),
            "device": maybe(DEVICES),
        },
        examples=12,
    ),
    "attention.AttentionResult": Entry(
        _result,
        {
            "backend": maybe(st.sampled_from(list(attention.BACKENDS))),
            "status": maybe(st.sampled_from(["refused", "out of memory", "skipped"])),
            "label": maybe(st.just("row")),
        },
    ),
    "attention.SelectionLog": Entry(
        lambda title: attention.SelectionLog(title, error="x").summary(),
        {"title": maybe(st.just("case"))},
    ),
    "attention.te_selection_logs": Entry(
        lambda shape, recipe, timeout_s: attention.te_selection_logs(
            [{"shape": shape, "recipe": recipe}], timeout_s=timeout_s
        ),
        {
            "shape": maybe(st.just(SHAPE)),
            "recipe": maybe(st.sampled_from([None, "delayed", "current"])),
            "timeout_s": maybe(st.sampled_from([60.0, 300.0])),
        },
        aliases={"shape": ["cases"]},
        examples=8,
    ),
    "attention.copy_batches": Entry(
        lambda vocab_size, batch, half, steps, seed: len(
            attention.copy_batches(vocab_size, batch, half, steps, seed=seed, device="cpu")
        ),
        {
            "vocab_size": maybe(ints(2, 64)),
            "batch": maybe(ints(1, 3)),
            "half": maybe(ints(2, 8)),
            "steps": maybe(ints(1, 3)),
            "seed": maybe(ints(0, 5)),
        },
        examples=12,
    ),
    "attention.paired_interval": Entry(
        lambda first, second, margin, confidence: attention.paired_interval(
            first, second, margin=margin, confidence=confidence
        )["verdict"],
        {
            "first": maybe(st.just({0: 1.0, 1: 1.2, 2: 0.9})),
            "second": maybe(st.just({0: 1.1, 1: 1.1, 2: 1.0})),
            "margin": maybe(st.sampled_from([0.01, 0.5])),
            "confidence": maybe(st.sampled_from([0.9, 0.95])),
        },
        aliases={"first": ["seeds"], "second": ["seeds"]},
        examples=12,
    ),
    "attention.flex_step": Entry(
        lambda shape, compile: attention.flex_step(shape, device="cpu", compile=compile)(),
        {"shape": maybe(st.just(SHAPE)), "compile": maybe(st.sampled_from([None, False]))},
        examples=6,
    ),
    "attention.probe_softmax_scale": Entry(
        _probe, {"te": maybe(st.just(TE)), "shape": maybe(st.just(SHAPE))}, examples=6
    ),
    "attention.row_errors": Entry(
        lambda actual, expected: float(attention.row_errors(actual, expected).sum()),
        {
            "actual": maybe(st.sampled_from([torch.ones(1, 3, 4), torch.zeros(1, 3, 4)])),
            "expected": maybe(st.just(torch.ones(1, 3, 4))),
        },
        examples=8,
    ),
    "attention.backend_step": Entry(
        lambda backend, shape: attention.backend_step(backend, shape, device="cpu")(),
        {
            "backend": maybe(st.sampled_from(["explicit", "sdpa_math", "sdpa_flash"])),
            "shape": maybe(st.just(SHAPE)),
        },
        examples=8,
    ),
    "attention.interleaved_rounds": Entry(
        lambda rounds, iters, warmup_s: len(
            attention.interleaved_rounds(
                {"a": lambda: None, "b": lambda: None},
                rounds=rounds,
                iters=iters,
                warmup_s=warmup_s,
                device="cpu",
            )
        ),
        {
            "rounds": maybe(ints(2, 3)),
            "iters": maybe(ints(1, 2)),
            "warmup_s": maybe(st.sampled_from([0.0, 0.01])),
        },
        examples=6,
    ),
    "attention.round_summary": Entry(
        lambda frame: len(attention.round_summary(frame)),
        {"frame": maybe(st.just(_ROUNDS))},
        examples=4,
    ),
    "attention.beyond_spread": Entry(
        lambda first_ms, second_ms, spread: attention.beyond_spread(
            first_ms, second_ms, 0.01, spread
        ),
        {
            "first_ms": maybe(st.sampled_from([1.0, 1.2])),
            "second_ms": maybe(st.sampled_from([1.0])),
            "spread": maybe(st.sampled_from([0.0, 0.1])),
        },
        examples=6,
    ),
    "attention.refusal_reason": Entry(
        attention.refusal_reason,
        {"error": maybe(st.sampled_from([ValueError("No backend. Please run."), KeyError()]))},
        examples=4,
    ),
    "attention.faster": Entry(
        lambda first, second: attention.faster(attention.round_summary(_ROUNDS), first, second),
        {"first": maybe(st.sampled_from(["a", "b"])), "second": maybe(st.sampled_from(["a"]))},
        examples=6,
    ),
}
