"""Property-test entries for fp8lab.memory (imported by tests/test_inputs.py)."""

import hypothesis.strategies as st

from fp8lab import flops, memory
from fp8lab.memory.activations import saved_per_layer
from fp8lab.memory.sizes import step_sizes
from fp8lab.memory.spec import StepSpec, require_seq, step_spec
from fp8lab.memory.timeline import simulate
from fp8lab.memory.tree import build_tree
from tests.property_support import TINY, TINY_GQA, Entry, ints, maybe, reals

# TINY and TINY_GQA hold 16 positions: longer sequences are rejected (tested in test_memory.py)
SEQ = ints(1, TINY.max_seq_len)


def _node(name, nbytes):
    node = memory.MemoryNode(name, nbytes)
    node.add("part", nbytes)
    return node.total


def _spec_args():
    """Arguments of a StepSpec (and of estimate) with the strategies that draw them."""
    return {
        "cfg": maybe(st.sampled_from([TINY, TINY_GQA])),
        "batch": maybe(ints()),
        "seq": maybe(SEQ),
        "precision": maybe(st.sampled_from(["bf16", "fp8-delayed", "fp8-block"])),
        "weights": maybe(st.sampled_from([None, "bf16", "fp32-autocast", "bf16-master"])),
        "recompute": maybe(st.sampled_from(flops.RECOMPUTE)),
        "layout": maybe(st.sampled_from([None, memory.Layout(tp=2, sequence_parallel=True)])),
        "accumulation": maybe(ints(1, 4)),
        "hidden_dropout": maybe(reals(0, 0.9)),
    }


SPEC_ALIASES = {
    "layout": ["tp", "sequence parallelism"],
    "seq": ["sequence parallelism"],
    "precision": ["weights"],
    "weights": ["precision"],
}


def _sized(part, **kwargs):
    """One stage of the estimate, fed a checked StepSpec."""
    sizes = step_sizes(StepSpec(**kwargs))
    if part == "tree":
        return build_tree(sizes).total
    if part == "timeline":
        timeline = simulate(sizes)
        return {"peak": timeline.peak, "phases": timeline.phases}
    return sizes


def _verdict(batch, precision, gpu, headroom):
    return memory.fit_verdict(memory.estimate(TINY, batch, 16, precision=precision), gpu, headroom)


def _fits(batch, headroom):
    return memory.fitting_gpus(memory.estimate(TINY, batch, 16), headroom)


ENTRIES = {
    "memory.Layout": Entry(
        memory.Layout,
        {
            "tp": maybe(ints(1, 4)),
            "sequence_parallel": maybe(st.booleans()),
            "dp": maybe(ints(1, 8)),
            "zero_stage": maybe(ints(0, 3)),
        },
        aliases={"tp": ["sequence_parallel"], "sequence_parallel": ["tp"]},
    ),
    "memory.MemoryNode": Entry(_node, {"name": st.just("n"), "nbytes": maybe(reals(0, 1e9))}),
    "memory.MemoryEstimate": Entry(
        lambda batch: memory.estimate(TINY, batch, 16).peak_mib, {"batch": maybe(ints())}
    ),
    "memory.Weights": Entry(
        memory.Weights,
        {
            "name": maybe(st.just("custom")),
            "param_bytes": maybe(reals(0.5, 4)),
            "grad_bytes": maybe(reals(0.5, 4)),
            "master_bytes": maybe(reals(0, 4)),
            "state_bytes": maybe(reals(0.5, 4)),
            "optimizer": maybe(st.sampled_from(["torch", "te-fused"])),
            "autocast": maybe(st.booleans()),
            "fp8_params": maybe(st.booleans()),
        },
    ),
    "memory.resolve_precision": Entry(
        memory.resolve_precision,
        {
            "precision": maybe(st.sampled_from(memory.PRECISIONS)),
            "weights": maybe(st.sampled_from([None, *memory.WEIGHTS])),
        },
        aliases={"precision": ["weights"], "weights": ["precision"]},
    ),
    "memory.bytes_per_parameter": Entry(
        memory.bytes_per_parameter,
        {
            "precision": maybe(st.sampled_from(memory.PRECISIONS)),
            "optimizer": maybe(st.sampled_from(memory.OPTIMIZERS)),
            "fp32_grads": maybe(st.booleans()),
            "hopper": maybe(st.booleans()),
            "momentum": maybe(st.sampled_from([0.0, 0.9])),
        },
        aliases={"momentum": ["optimizer"], "optimizer": ["momentum"]},
    ),
    "memory.zero_training_state": Entry(
        memory.zero_training_state,
        {
            "n_params": maybe(reals(1, 1e12)),
            "dp": maybe(ints()),
            "stage": maybe(ints(0, 3)),
            "k": maybe(reals(0, 16)),
            "weight_bytes": maybe(reals(0.5, 4)),
            "grad_bytes": maybe(reals(0.5, 4)),
        },
    ),
    "memory.korthikanti_activations": Entry(
        memory.korthikanti_activations,
        {
            "cfg": maybe(st.just(TINY)),
            "batch": maybe(ints()),
            "seq": maybe(SEQ),
            "tp": maybe(ints(1, 4)),
            "sequence_parallel": maybe(st.booleans()),
            "recompute": maybe(st.sampled_from(flops.RECOMPUTE)),
        },
    ),
    "memory.backward_transients": Entry(
        memory.backward_transients,
        {
            "cfg": maybe(st.just(TINY)),
            "tokens": maybe(ints()),
            "element": maybe(st.sampled_from([2, 4])),
            "fp8": maybe(st.booleans()),
            "tp": maybe(ints(1, 2)),
        },
    ),
    "memory.estimate": Entry(
        memory.estimate,
        {
            "cfg": maybe(st.sampled_from([TINY, TINY_GQA])),
            "batch": maybe(ints()),
            "seq": maybe(SEQ),
            "precision": maybe(st.sampled_from(["bf16", "fp8-delayed", "fp8-block"])),
            "weights": maybe(st.sampled_from([None, "bf16", "fp32-autocast", "bf16-master"])),
            "optimizer": maybe(st.sampled_from(memory.OPTIMIZERS)),
            "momentum": maybe(st.sampled_from([0.0, 0.9])),
            "adamw_impl": maybe(st.sampled_from(memory.ADAMW_IMPLS)),
            "recompute": maybe(st.sampled_from(flops.RECOMPUTE)),
            "layout": maybe(st.sampled_from([None, memory.Layout(tp=2, sequence_parallel=True)])),
            "accumulation": maybe(ints(1, 4)),
            "fp32_grads": maybe(st.booleans()),
            "hidden_dropout": maybe(reals(0, 0.9)),
            "flash_attention": maybe(st.booleans()),
            "hopper": maybe(st.booleans()),
            "amax_history_len": maybe(ints(1, 1024)),
            "include_optimizer": maybe(st.booleans()),
        },
        aliases={
            "layout": ["tp", "sequence parallelism"],
            "seq": ["sequence parallelism"],
            "precision": ["weights"],
            "weights": ["precision"],
            "optimizer": ["momentum"],
        },
    ),
    "memory.fits": Entry(
        memory.fits,
        {
            "peak_bytes": maybe(reals(0, 1e11)),
            "memory_bytes": maybe(reals(1e9, 1e11)),
            "headroom": maybe(reals(0.1, 1)),
            "context_bytes": maybe(reals(0, 1e9)),
            "compute": maybe(st.sampled_from(list(memory.PRECISIONS))),
            "compute_capability": maybe(st.sampled_from([None, (8, 0), (8, 9), (9, 0)])),
        },
    ),
    "memory.fit_verdict": Entry(
        _verdict,
        {
            "batch": maybe(ints()),
            "precision": maybe(st.sampled_from(["bf16", "fp8-delayed", "fp8-block"])),
            "gpu": maybe(st.sampled_from(["A100 SXM4 80GB", "L4", "L40S", "H100 SXM"])),
            "headroom": maybe(reals(0.1, 1)),
        },
        aliases={"gpu": ["name"]},
    ),
    "memory.measured_phase": Entry(
        memory.measured_phase,
        {
            "event": maybe(
                st.sampled_from(
                    [
                        "build: model built",
                        "step 1, forward: logits",
                        "step 2, backward: LM head",
                        "step 1, optimizer step: update",
                    ]
                )
            )
        },
    ),
    "memory.phase_peaks": Entry(
        lambda batch: memory.phase_peaks(memory.estimate(TINY, batch, 16)),
        {"batch": maybe(ints())},
    ),
    "memory.fitting_gpus": Entry(_fits, {"batch": maybe(ints()), "headroom": maybe(reals(0.1, 1))}),
    "memory.largest_micro_batch": Entry(
        memory.largest_micro_batch,
        {
            "cfg": maybe(st.just(TINY)),
            "seq": maybe(SEQ),
            "memory_bytes": maybe(reals(1e9, 1e11)),
            "headroom": maybe(reals(0.1, 1)),
            "context_bytes": maybe(reals(0, 1e9)),
            "max_batch": maybe(ints(1, 64)),
        },
    ),
    "memory.spec.StepSpec": Entry(StepSpec, _spec_args(), aliases=SPEC_ALIASES),
    "memory.spec.step_spec": Entry(
        lambda options: step_spec(TINY, 1, 16, options).compute,
        {
            "options": maybe(
                st.sampled_from([{}, {"precision": "fp8-delayed"}, {"optimizer": "sgd"}])
            )
        },
    ),
    "memory.spec.require_seq": Entry(
        require_seq, {"cfg": st.sampled_from([TINY, TINY_GQA]), "seq": maybe(SEQ)}
    ),
    "memory.sizes.step_sizes": Entry(
        lambda **kwargs: _sized("sizes", **kwargs), _spec_args(), aliases=SPEC_ALIASES
    ),
    "memory.activations.saved_per_layer": Entry(
        lambda **kwargs: saved_per_layer(StepSpec(**kwargs)), _spec_args(), aliases=SPEC_ALIASES
    ),
    "memory.timeline.simulate": Entry(
        lambda **kwargs: _sized("timeline", **kwargs), _spec_args(), aliases=SPEC_ALIASES
    ),
    "memory.tree.build_tree": Entry(
        lambda **kwargs: _sized("tree", **kwargs), _spec_args(), aliases=SPEC_ALIASES
    ),
}
