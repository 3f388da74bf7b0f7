"""Chapter 06's library: sentences from signs, the capture guard, sizing, optimizer states, and the CPU
reference's FusedAdam without master weights (as TE 2.20)."""

from __future__ import annotations

import math

import pytest
import torch

from fp8lab import memory
from fp8lab.config import preset_config as preset
from fp8lab.weights import attempt, capture_guard, change, fsdp_gather_bytes, largest_layers
from fp8lab.weights.optimizer_states import expected_bytes


def test_change_words_follow_the_sign_and_the_rounding():
    assert change(0.42) == "0.42 ms less"
    assert change(-0.1, "GiB", 1) == "0.1 GiB more"
    assert change(0.001).startswith("no change")
    assert change(math.nan) == "not measured"
    with pytest.raises(ValueError, match="value"):
        change(math.inf)










def test_largest_layers_fits_and_one_more_does_not():
    cfg = preset("llama3-8b")
    h200 = 141e9
    best = largest_layers(cfg, 4096, h200)
    budget = 0.9 * h200 - memory.CUDA_CONTEXT
    assert memory.estimate(best, 1, 4096).peak_bytes <= budget
    more = cfg.replace(num_layers=best.num_layers + 1)
    assert memory.estimate(more, 1, 4096).peak_bytes > budget
    assert largest_layers(cfg, 4096, 1e9) is None


def test_fsdp_fp8_gather_halves_the_weight_traffic():
    bf16 = fsdp_gather_bytes(1000, 2)
    fp8 = fsdp_gather_bytes(1000, 2, "fp8")
    assert fp8["all-gather"] * 2 == bf16["all-gather"] == 2000
    assert fp8["reduce-scatter"] == bf16["reduce-scatter"] == 1000
    with pytest.raises(ValueError, match="world"):
        fsdp_gather_bytes(1000, 1)


STATE_OPTIONS = {  # chapter 06's settings, as FusedAdam keyword arguments
    "FP32 master, FP32 moments (default)": {},
    "FP32 master, FP8 moments": {"exp_avg_dtype": torch.uint8, "exp_avg_sq_dtype": torch.uint8},
    "FP32 master as BF16 remainders": {"store_param_remainders": True},
    "no master weights": {"master_weights": False},
}


def test_expected_state_bytes():
    values = {label: expected_bytes(o) for label, o in STATE_OPTIONS.items()}
    assert values["FP32 master, FP32 moments (default)"] == 12
    assert values["FP32 master, FP8 moments"] == 8  # Hopper: each FP8 moment keeps a transpose
    assert expected_bytes(STATE_OPTIONS["FP32 master, FP8 moments"], fp8_transpose=False) == 6
    assert values["FP32 master as BF16 remainders"] == 10
    assert values["no master weights"] == 8
    with pytest.raises(ValueError, match="options"):
        expected_bytes({"lr": 1.0})


def test_attempt_turns_an_error_into_a_row():
    assert attempt(lambda: 3) == (3, None)
    value, reason = attempt(lambda: 1 / 0)
    assert value is None and reason.startswith("refused: ZeroDivisionError")

    def refuse():
        raise RuntimeError("Use master_weights=True.")

    assert attempt(refuse)[1] == "refused: RuntimeError: Use master_weights=True"


def test_words_agree_tie_and_locate_the_spread():
    from fp8lab.weights.words import count_words, smallest_words

    assert count_words(1, "micro-batch") == "1 micro-batch"
    assert count_words(4, "micro-batch") == "4 micro-batches"
    assert smallest_words({"a": 12.0, "b": 8.0, "c": 7.99}) == "“b” and “c” tie at 8.0 B/param"
    assert smallest_words({"a": 12.0, "b": 6.0}) == "“b”, at 6.0 B/param"
    assert smallest_words({"a": math.nan}) == "not measured"




def _fp8_linear(te, recipe):
    torch.manual_seed(0)
    with te.quantized_model_init(enabled=True, recipe=recipe):
        return te.Linear(16, 16, bias=False, params_dtype=torch.float32)


def _one_step(te, layer, recipe):
    optimizer = te.optimizers.FusedAdam(layer.parameters(), lr=0.1, master_weights=False)
    with te.autocast(enabled=True, recipe=recipe):
        layer(torch.randn(8, 16)).sum().backward()
    optimizer.step()


def test_reference_fused_adam_skips_delayed_fp8_weights_without_master_weights():
    from fp8lab import reference as te
    from fp8lab.reference.recipe import DelayedScaling, Float8CurrentScaling

    layer = _fp8_linear(te, DelayedScaling())
    before = layer.weight.detach().clone()
    _one_step(te, layer, DelayedScaling())
    assert torch.equal(layer.weight.detach(), before)  # silently not updated, as TE 2.20
    layer = _fp8_linear(te, Float8CurrentScaling())
    with pytest.raises(RuntimeError, match="master_weights"):
        _one_step(te, layer, Float8CurrentScaling())


def test_capture_guard_puts_the_class_call_back():
    class Model(torch.nn.Module):
        def forward(self, x):
            return x

    model = Model()
    with pytest.raises(RuntimeError, match="capture"), capture_guard(model):
        Model.__call__ = lambda self, x: x + 1  # what a failed capture leaves
        raise RuntimeError("capture failed")
    assert "__call__" not in Model.__dict__ and model(1) == 1
    with pytest.raises(TypeError, match="model"), capture_guard("not a module"):
        pass
