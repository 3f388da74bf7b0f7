"""FP8 format tools, synthetic data and tensor capture."""

import math

import pytest
import torch

from fp8lab import formats
from fp8lab.capture import by_kind, capture_step
from fp8lab.data import MarkovChain, markov_batches, uniform_loss


@pytest.mark.parametrize(
    "fmt, stored, bits",
    [
        ("FP16", 0.395263671875, "0 01101 1001010011"),
        ("BF16", 0.39453125, "0 01111101 1001010"),
        ("E4M3", 0.40625, "0 0101 101"),
        ("E5M2", 0.375, "0 01101 10"),
    ],
)
def test_worked_example_of_0_3952(fmt, stored, bits):
    encoding = formats.encode(0.3952, fmt)
    assert encoding.stored == stored and encoding.bits == bits


def test_limits_from_the_dtypes():
    e4m3, e5m2 = formats.info("E4M3"), formats.info("E5M2")
    assert (e4m3.exponent_bits, e4m3.mantissa_bits, e4m3.max) == (4, 3, 448.0)
    assert (e5m2.exponent_bits, e5m2.mantissa_bits, e5m2.max) == (5, 2, 57344.0)
    assert e4m3.smallest_subnormal == 2.0**-9 and e5m2.smallest_subnormal == 2.0**-16
    assert not e4m3.has_infinity and e4m3.nan_patterns == 2 and e4m3.finite_values == 253
    assert e5m2.has_infinity and e5m2.nan_patterns == 6 and e5m2.finite_values == 247
    assert formats.info("FP32").finite_values == 2**32 - 2**24 - 1
    assert len(formats.positive_values("E4M3")) == 126


def test_rounding_saturates_like_training_casts():
    assert formats.round_to(1e6, "E4M3").item() == 448.0
    assert math.isinf(formats.round_to(1e6, "E5M2", saturate=False).item())
    error = formats.relative_rounding_error(torch.tensor([1.0, 1.0625, 1e-9, 1e6]), "E4M3")
    assert (
        error[0] == 0
        and error[1] == pytest.approx(0.0625 / 1.0625)
        and error[2] == 1
        and error[3] == 1
    )


def test_range_fit_and_amax_scale():
    x = torch.full((100,), 1e-6)
    assert formats.range_fit(x, "E4M3").underflow == 1.0
    scale = formats.amax_scale(x, "E4M3")
    assert scale == pytest.approx(448e6)
    fit = formats.range_fit(x, "E4M3", scale)
    assert fit.underflow == 0 and fit.relative_error < 1e-6
    assert formats.range_fit(torch.tensor([1000.0, 1.0]), "E4M3").saturated == 0.5
    assert formats.amax_scale(torch.zeros(3), "E5M2") == 1.0


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: formats.info("E3M4"), ValueError, "format='E3M4'"),
        (lambda: formats.info(torch.int8), TypeError, "not one of the formats"),
        (lambda: formats.encode("1.0", "E4M3"), TypeError, "value must be a number"),
        (lambda: formats.range_fit(torch.ones(2), "E4M3", scale=0), ValueError, "scale=0"),
        (lambda: formats.all_values("FP32"), ValueError, "enumerate 8- and 16-bit"),
        (lambda: MarkovChain(4, branching=5), ValueError, "branching=5"),
    ],
)
def test_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_markov_stream_is_learnable_and_reproducible():
    chain = MarkovChain(64, branching=3, seed=1)
    assert torch.allclose(chain.transition.sum(1), torch.ones(64))
    assert (chain.transition > 0).sum(1).max() == 3
    assert chain.entropy_rate < math.log(3) + 1e-6 < uniform_loss(64)
    first = next(markov_batches(64, 2, 16, seed=3))
    again = next(markov_batches(64, 2, 16, seed=3))
    assert torch.equal(first[0], again[0]) and torch.equal(first[0][:, 1:], first[1][:, :-1])


def test_capture_step_records_every_kind():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    captured = capture_step(model, lambda: model(x).pow(2).sum(), max_elements=50)
    assert set(captured) == {
        f"{i}.{kind}"
        for i in ("0", "2")
        for kind in ("activation", "weight", "output gradient", "weight gradient")
    }
    assert (
        captured["0.activation"].numel() == 40 and captured["2.weight"].numel() == 50
    )  # subsampled
    assert set(by_kind(captured)) == {"activation", "weight", "output gradient", "weight gradient"}
    with pytest.raises(ValueError, match="no modules of types"):
        capture_step(torch.nn.ReLU(), lambda: x.sum(), module_types=(torch.nn.Conv1d,))


def test_capture_subsample_keeps_each_tensors_amax():
    """A per-tensor scale comes from the amax: the subsample must not lose it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    with torch.no_grad():
        model[0].weight[17, 3] = 9.0  # one outlier among 4096 weights
    x = torch.randn(32, 64)
    captured = capture_step(model, lambda: model(x).pow(2).sum(), max_elements=100)
    assert captured["0.weight"].numel() == 100
    assert captured["0.weight"].abs().max().item() == 9.0
    activation = model[0](x).detach()  # the second layer's input
    assert captured["1.activation"].abs().max().item() == activation.abs().max().item()
