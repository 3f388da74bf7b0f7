"""Every helper that makes tensors resolves its device through ``fp8lab.devices``: a name torch
does not know, or a CUDA device on a machine without one, is a ValueError naming ``device``."""

import pytest
import torch

from fp8lab import capture, ceilings, data, layers, models, profiling, rotary, speedometer
from fp8lab.config import TransformerConfig

TINY = TransformerConfig(32, 64, 4, num_layers=1, vocab_size=64, max_seq_len=16)
BAD = ["gpu", "tpu:0"] + ([] if torch.cuda.is_available() else ["cuda", "cuda:0"])

CALLS = {
    "time_callable": lambda device: speedometer.time_callable(
        lambda: None, warmup=0, iters=1, device=device
    ),
    "measure_matmul": lambda device: ceilings.measure_matmul(16, 16, 16, device=device),
    "measure_copy_bandwidth": lambda device: ceilings.measure_copy_bandwidth(64, device=device),
    "measure_ceilings": lambda device: ceilings.measure_ceilings(device=device),
    "markov_batches": lambda device: data.markov_batches(8, 2, 4, device=device),
    "rotary_angles": lambda device: rotary.rotary_angles(4, 8, device=device),
    "torch_linear": lambda device: layers.torch_linear(4, 4, True, device=device),
    "build_layer": lambda device: layers.build_layer("pytorch", TINY, device=device),
    "GPT": lambda device: models.GPT(TINY, device=device),
    "random_tokens": lambda device: models.random_tokens(TINY, 2, 4, device=device),
    "profile": lambda device: profiling.profile(lambda: None, warmup=0, iters=1, device=device),
}


@pytest.mark.parametrize("device", BAD)
@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_device_this_machine_lacks_is_a_value_error_naming_device(name, device):
    with pytest.raises(ValueError, match="device="):
        CALLS[name](device)


@pytest.mark.parametrize("name", ["time_callable", "markov_batches", "rotary_angles"])
def test_cpu_is_accepted(name):
    CALLS[name]("cpu")


def test_capture_step_takes_no_module_backward_hook():
    """Output gradients come from a hook on the output tensor: no warning where the inputs need
    no gradient, and the same values as the gradient of the output."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    x = torch.randn(32, 8)
    with _no_warnings():
        captured = capture.capture_step(model, lambda: model(x).pow(2).sum())
    hidden = model[0](x)
    expected = 2 * model[1](hidden)
    assert torch.equal(captured["1.output gradient"], expected.detach().flatten())


class _no_warnings:
    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings(record=True)
        self.seen = self._catch.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._catch.__exit__(*exc)
        assert not [str(w.message) for w in self.seen]


@pytest.mark.parametrize(
    "call, argument",
    [
        (lambda: capture.by_kind([torch.ones(2)]), "captured"),
        (lambda: capture.of_kind({"a": "b"}, "weight"), "captured"),
        (lambda: capture.of_kind([1], "weight"), "captured"),
        (
            lambda: capture.capture_step(torch.nn.Linear(2, 2), lambda: 0, module_types="Linear"),
            "module_types",
        ),
        (
            lambda: capture.capture_step(
                torch.nn.Linear(2, 2), lambda: 0, module_types=torch.nn.Linear
            ),
            "module_types",
        ),
    ],
)
def test_capture_helpers_name_a_wrong_container(call, argument):
    with pytest.raises(TypeError, match=argument):
        call()


@pytest.mark.parametrize(
    "arguments, argument",
    [
        ({"roofs": {"r": 1}}, "roofs"),
        ({"roofs": "bf16"}, "roofs"),
        ({"points": [(1.0, 2.0)]}, "points"),
        ({"points": {"s": "12"}}, "points"),
        ({"point_colors": ["red"]}, "point_colors"),
        ({"intensity_range": 5.0}, "intensity_range"),
    ],
)
def test_plot_roofline_names_a_wrong_container(arguments, argument):
    from fp8lab import roofline

    call = {"roofs": [roofline.Roof("r", 100.0, 1000.0)], **arguments}
    with pytest.raises(TypeError, match=argument):
        roofline.plot_roofline(None, call.pop("roofs"), **call)
