"""The speedometer: statistics, modes, derived rates, and clear errors."""

import pytest
import torch

from fp8lab.reference import recipe
from fp8lab.speedometer import Timing, speedometer, time_callable


def test_statistics_of_a_timing():
    timing = Timing(
        "t", (1.0, 2.0, 3.0, 4.0, 10.0), "cpu", tokens=1000, flops=2e12, peak_tflops=4000
    )
    assert (
        timing.median_ms == 3.0
        and timing.mean_ms == 4.0
        and timing.min_ms == 1.0
        and timing.max_ms == 10.0
    )
    assert timing.spread == pytest.approx((7.0 - 1.5) / 3.0)  # interquartile range over the median
    assert timing.tokens_per_s == pytest.approx(1000 / 3e-3)
    assert timing.tflops == pytest.approx(2e12 / 3e-3 / 1e12)
    assert timing.mfu == pytest.approx(timing.tflops / 4000)
    row = timing.summary()
    assert {"median_ms", "spread", "tokens_per_s", "tflops", "mfu"} <= set(row)
    assert "MFU" in str(timing)


def test_time_callable_counts_calls_and_warmup():
    calls = []
    timing = time_callable(lambda: calls.append(1), warmup=3, iters=7, device="cpu")
    assert len(calls) == 10 and timing.iters == 7 and timing.warmup == 3


@pytest.mark.parametrize("mode", ["forward", "forward_backward", "step"])
def test_modes_on_a_module(mode):
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 16)
    x = torch.randn(8, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1) if mode == "step" else None
    before = model.weight.detach().clone()
    timing = speedometer(
        model, x, mode=mode, optimizer=optimizer, warmup=2, iters=5, tokens=8, flops=1e6
    )
    assert timing.mode == mode and timing.iters == 5
    assert timing.grads_zeroed is (None if mode == "forward" else True)
    assert model.weight.grad is None  # zeroed between iterations (set to None)
    assert (not torch.equal(before, model.weight)) == (mode == "step")
    assert timing.extra["input_shapes"] == "(8, 32)"


def test_gradient_accumulation_when_not_zeroing():
    model = torch.nn.Linear(4, 4, bias=False)
    x = torch.ones(2, 4)
    grad = torch.ones(2, 4)
    timing = speedometer(model, x, grad_output=grad, warmup=1, iters=3, zero_grad=False)
    assert timing.grads_zeroed is False
    torch.testing.assert_close(model.weight.grad, torch.full((4, 4), 8.0))  # 4 iterations x 2 rows


def test_autocast_kwargs_reach_te():
    from fp8lab import reference as te

    layer = te.Linear(32, 16)
    x = torch.randn(16, 32)
    speedometer(
        layer,
        x,
        autocast_kwargs={"enabled": True, "recipe": recipe.DelayedScaling()},
        warmup=1,
        iters=2,
    )
    assert layer.fp8_meta["scaling_fwd"].amax_history.abs().sum() > 0  # FP8 casts happened


def test_context_factory_is_used():
    entered = []

    class Marker:
        def __enter__(self):
            entered.append(1)

        def __exit__(self, *exc):
            return False

    speedometer(
        torch.nn.Linear(4, 4), torch.randn(2, 4), mode="forward", context=Marker, warmup=1, iters=2
    )
    assert len(entered) == 3


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"iters": 0}, ValueError, "iters=0"),
        ({"warmup": -1}, ValueError, "warmup=-1"),
        ({"mode": "backward"}, ValueError, "mode='backward'"),
        ({"mode": "step"}, ValueError, "needs an optimizer"),
        ({"autocast_kwargs": {}, "context": object}, ValueError, "not both"),
        ({"min_warmup_ms": -5}, ValueError, "min_warmup_ms=-5"),
    ],
)
def test_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        speedometer(torch.nn.Linear(4, 4), torch.randn(2, 4), **kwargs)


def test_module_and_input_on_different_devices():
    model = torch.nn.Linear(4, 4).to(torch.float64)
    model.weight = torch.nn.Parameter(torch.randn(4, 4, device="meta"))
    with pytest.raises(ValueError, match="parameter 'weight' is on meta but the input is on cpu"):
        speedometer(model, torch.randn(2, 4))
    with pytest.raises(ValueError, match="at least one input tensor"):
        speedometer(torch.nn.Linear(4, 4))


def test_out_of_memory_names_the_configuration(monkeypatch):
    def boom():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")

    with pytest.raises(
        MemoryError, match=r"out of GPU memory while timing 'big layer' \(callable\) on cpu"
    ):
        time_callable(boom, label="big layer", device="cpu")

    class Huge(torch.nn.Module):
        def forward(self, x):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(MemoryError, match=r"'Huge' \(forward, inputs \(2, 4\)\)"):
        speedometer(Huge(), torch.randn(2, 4), mode="forward", warmup=1, iters=1)


def test_the_clock_reads_the_time_between_its_marks():
    import time

    from fp8lab.speedometer import Clock

    clock = Clock("cpu")
    time.sleep(0.03)  # ten times the second: a loaded machine's late wake-up cannot swap them
    clock.mark()
    time.sleep(0.003)
    clock.mark()
    first, second = clock.read()
    assert first >= 30.0 and 3.0 <= second < first
    assert clock.host_ms == pytest.approx(first + second)  # on a CPU the host's time is all
    with pytest.raises(ValueError, match="device"):
        Clock("gpu")


def test_time_calls_is_one_clock_mark_per_call():
    import time

    from fp8lab.speedometer import time_calls

    calls = []
    times = time_calls(lambda: (calls.append(1), time.sleep(0.002)), 3, torch.device("cpu"))
    assert len(calls) == 3 and len(times) == 3 and min(times) >= 2.0
    assert times.host_ms == pytest.approx(sum(times) / 3)
    with pytest.raises(ValueError, match="calls"):
        time_calls(lambda: None, 0, "cpu")


def test_a_training_step_is_timed_on_the_clock_with_the_optimizer_marked(monkeypatch):
    from fp8lab import speedometer
    from fp8lab.training import step as step_module

    marks = []

    class Recording(speedometer.Clock):
        def mark(self):
            marks.append(len(marks))
            super().mark()

    monkeypatch.setattr(step_module, "Clock", Recording)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = (torch.randn(2, 4), torch.randn(2, 4))
    result = step_module.train_step(
        model, [batch], optimizer, loss_fn=torch.nn.functional.mse_loss
    )
    assert marks == [0, 1, 2]  # the start, the hand-over to the optimizer, the end
    assert 0 <= result.optimizer_ms <= result.step_ms
