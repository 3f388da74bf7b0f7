"""The gradient-accumulation step, its main_grad lifecycle, and the CPU stand-in for TE's FusedAdam.

Each expectation comes from an independent computation: one batch N times larger for the
accumulated gradient, ``torch.optim.AdamW``/``Adam`` for the optimizer arithmetic, FP8 grids
computed by hand for the FP8 write-back. The tests marked ``gpu`` hold the stand-in and the
step's assumptions to Transformer Engine itself.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import fp8lab.reference as ref
from fp8lab import training
from fp8lab.config import TransformerConfig
from fp8lab.memory import Part
from fp8lab.models import GPT
from fp8lab.reference import quantization as q
from fp8lab.reference import recipe as ref_recipe
from fp8lab.speedometer import Timing
from fp8lab.training import StepOptions, train_step

CFG = TransformerConfig(32, 64, 4, num_layers=2, vocab_size=64, max_seq_len=16, name="tiny")


def _batches(count, batch=2, seq=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randint(0, 64, (batch, seq), generator=generator),
            torch.randint(0, 64, (batch, seq), generator=generator),
        )
        for _ in range(count)
    ]


def _gpt(form="te_layer", dtype=torch.float32, fp8_recipe=None, seed=0, **kwargs):
    torch.manual_seed(seed)
    init = (
        ref.quantized_model_init(enabled=True, recipe=fp8_recipe)
        if fp8_recipe is not None
        else contextlib.nullcontext()
    )
    with init:
        return GPT(
            CFG,
            form=form,
            te=ref,
            params_dtype=dtype,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            **kwargs,
        )


def _relative(a: dict, b: dict) -> float:
    num = sum(((a[k] - b[k]) ** 2).sum() for k in b)
    return float(num.sqrt() / sum((v**2).sum() for v in b.values()).sqrt())


# --- the step ----------------------------------------------------------------------------------


def test_n_micro_batches_give_the_gradient_of_one_batch_n_times_larger():
    micro = _batches(4)
    whole = [(torch.cat([x for x, _ in micro]), torch.cat([y for _, y in micro]))]
    model = _gpt(form="pytorch")
    result = train_step(model, micro, None)
    accumulated = training.optimizer_gradients(model)
    loss_whole = train_step(model, whole, None).loss
    one_batch = training.optimizer_gradients(model)
    assert _relative(accumulated, one_batch) < 1e-5
    assert result.loss == pytest.approx(loss_whole, rel=1e-5)
    assert result.micro_batches == 4 and result.optimizer_ms == 0.0


def test_the_three_accumulation_paths_agree_in_fp32():
    micro = _batches(3)
    grads = {}
    for mode in training.GRAD_ACCUMULATION:
        model = _gpt(fuse_wgrad_accumulation=mode == "fused")
        train_step(model, micro, None, options=StepOptions(grad_accumulation=mode))
        grads[mode] = training.optimizer_gradients(model, mode)
        if mode == "fused":  # TE modules wrote main_grad; their .grad stays None
            weight = model.layers[0].layer.layernorm_mlp.fc1_weight
            assert weight.grad is None and weight.main_grad.abs().sum() > 0
    assert _relative(grads["fp32_buffer"], grads["param"]) < 1e-6
    assert _relative(grads["fused"], grads["param"]) < 1e-5


def test_main_grad_is_zeroed_once_per_step_not_per_micro_batch():
    micro = _batches(2)
    model = _gpt(fuse_wgrad_accumulation=True)
    options = StepOptions(grad_accumulation="fused")
    train_step(model, micro, None, options=options)
    first = training.optimizer_gradients(model, "fused")
    train_step(model, micro, None, options=options)  # same weights (no optimizer): same sum
    second = training.optimizer_gradients(model, "fused")
    assert _relative(second, first) < 1e-6
    alone = training.optimizer_gradients(model, "fused")
    train_step(model, micro[:1], None, options=options)
    one = training.optimizer_gradients(model, "fused")
    assert _relative(one, alone) > 0.1  # one micro-batch is not the sum of two


def test_bf16_accumulation_in_grad_drifts_from_fp32_main_grad():
    micro = _batches(8)
    grads = {}
    for mode in ("param", "fp32_buffer"):
        model = _gpt(dtype=torch.bfloat16)
        train_step(model, micro, None, options=StepOptions(grad_accumulation=mode))
        grads[mode] = training.optimizer_gradients(model, mode)
    assert 0 < _relative(grads["param"], grads["fp32_buffer"]) < 0.05


def test_cache_fp8_weights_passes_is_first_microbatch_and_cleans_up():
    seen = []

    class Spy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(4, 4))

        def forward(self, x, is_first_microbatch=None):
            seen.append(is_first_microbatch)
            return x @ self.weight

    model = torch.nn.Sequential(Spy())
    batches = [(torch.ones(2, 4), torch.zeros(2, 4))] * 3
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    train_step(
        model, batches, optimizer, options=StepOptions(cache_fp8_weights=True), loss_fn=F.mse_loss
    )
    assert seen == [True, False, False]
    model(torch.ones(2, 4))  # hooks removed after the step
    assert seen[-1] is None
    with pytest.raises(ValueError, match="is_first_microbatch"):
        plain = torch.nn.Linear(4, 4)
        train_step(
            plain,
            batches,
            torch.optim.SGD(plain.parameters(), lr=0.1),
            options=StepOptions(cache_fp8_weights=True),
            loss_fn=F.mse_loss,
        )


def test_weight_caching_reuses_the_first_cast_under_current_scaling():
    """Within a step the weights do not change, so a cached FP8 copy is the copy a fresh cast
    would make: current scaling gives the same gradients with and without caching."""
    micro = _batches(3)
    grads = {}
    for cache in (False, True):
        model = _gpt()
        train_step(
            model,
            micro,
            None,
            te=ref,
            fp8_recipe=ref_recipe.Float8CurrentScaling(),
            options=StepOptions(cache_fp8_weights=cache),
        )
        grads[cache] = training.optimizer_gradients(model)
    assert _relative(grads[True], grads[False]) == 0.0


def test_mismatched_accumulation_settings_are_refused():
    micro = _batches(1)
    fused = _gpt(fuse_wgrad_accumulation=True)
    with pytest.raises(ValueError, match="fuse_wgrad_accumulation=True"):
        train_step(fused, micro, None)
    plain = _gpt()
    with pytest.raises(ValueError, match="no module built with fuse_wgrad"):
        train_step(plain, micro, None, options=StepOptions(grad_accumulation="fused"))
    bf16 = _gpt(dtype=torch.bfloat16, fuse_wgrad_accumulation=True)
    with pytest.raises(ValueError, match="use_decoupled_grad"):
        train_step(
            bf16,
            micro,
            torch.optim.AdamW(bf16.parameters()),
            options=StepOptions(grad_accumulation="fused"),
        )
    with pytest.raises(ValueError, match="fp8_recipe needs te"):
        train_step(plain, micro, None, fp8_recipe=ref_recipe.DelayedScaling())
    with pytest.raises(TypeError, match="micro_batches"):
        train_step(plain, micro[0], None)


def test_fused_step_hands_main_grad_to_the_optimizer():
    """With FP32 parameters main_grad becomes .grad; with BF16 ones it becomes decoupled_grad
    (TE's FusedAdam, use_decoupled_grad=True). Either way every weight moves."""
    micro = _batches(2)
    for dtype, make in (
        (torch.float32, lambda ps: torch.optim.SGD(ps, lr=0.1)),
        (
            torch.bfloat16,
            lambda ps: ref.optimizers.FusedAdam(
                ps, lr=1e-2, master_weights=True, use_decoupled_grad=True
            ),
        ),
    ):
        model = _gpt(dtype=dtype, fuse_wgrad_accumulation=True)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        train_step(
            model,
            micro,
            make(list(model.parameters())),
            options=StepOptions(grad_accumulation="fused"),
        )
        unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
        assert unchanged == [], (dtype, unchanged)


def test_gradient_clipping_bounds_the_norm_the_optimizer_reads():
    micro = _batches(2)
    model = _gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    result = train_step(model, micro, optimizer, options=StepOptions(max_grad_norm=1e-3))
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert result.grad_norm > 1e-3 and norm.item() == pytest.approx(1e-3, rel=1e-3)


def test_train_groups_batches_into_steps():
    model = _gpt(form="pytorch")
    losses = training.train(
        model, _batches(5), torch.optim.SGD(model.parameters(), lr=0.1), micro_batches=2
    )
    assert losses.shape == (2,)
    with pytest.raises(ValueError, match="not both"):
        training.train(
            model,
            _batches(2),
            torch.optim.SGD(model.parameters(), lr=0.1),
            bf16_autocast=False,
            options=StepOptions(),
        )


@pytest.mark.parametrize("given, micro", [(3, 4), (1, 2), (0, 1), (0, 3)])
def test_too_few_batches_name_micro_batches_and_the_count(given, micro):
    """Fewer batches than one step needs: the error says how many a step needs and how many
    there were (an empty stream says so)."""
    model = _gpt(form="pytorch")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = (
        rf"micro_batches={micro} needs at least {micro} batches .*batches held {given}"
        if given
        else "batches: no batch to train on"
    )
    with pytest.raises(ValueError, match=expected):
        training.train(model, iter(_batches(given)), optimizer, micro_batches=micro)
    with pytest.raises(TypeError, match="batches must be an iterable"):
        training.train(model, 3, optimizer)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(count=st.integers(0, 7), micro=st.integers(1, 4))
def test_train_runs_one_step_per_full_group_or_says_why_none(count, micro):
    """Property: ``count // micro`` steps, or (none) a ValueError naming the argument at fault."""
    model = torch.nn.Linear(3, 1)
    batches = [(torch.randn(2, 3), torch.randn(2, 1)) for _ in range(count)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def run():
        return training.train(
            model, batches, optimizer, micro_batches=micro, loss_fn=F.mse_loss
        )

    if count >= micro:
        assert run().shape == (count // micro,)
        return
    with pytest.raises(ValueError, match="micro_batches=" if count else "batches: no batch"):
        run()


def test_time_step_returns_a_timing_with_the_optimizer_share():
    model = _gpt(form="pytorch")
    timing = training.time_step(
        model, _batches(2), torch.optim.SGD(model.parameters(), lr=0.1), warmup=1, iters=3
    )
    assert isinstance(timing, Timing) and timing.iters == 3 and timing.mode == "step"
    assert 0 < timing.extra["optimizer_ms"] <= timing.median_ms * 3
    assert timing.extra["micro_batches"] == 2


def test_step_result_rules():
    with pytest.raises(ValueError, match="optimizer_ms"):
        training.StepResult(loss=1.0, micro_batches=1, step_ms=1.0, optimizer_ms=2.0)
    assert training.StepResult(1.0, 4, 8.0, 1.0).micro_batch_ms == 2.0


# --- training state ----------------------------------------------------------------------------


def test_training_state_bytes_counts_each_part_once():
    model = _gpt(form="pytorch", dtype=torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())  # tied embeddings: one parameter
    optimizer = ref.optimizers.FusedAdam(model.parameters(), master_weights=True)
    train_step(model, _batches(1), optimizer)
    parts = training.training_state_bytes(model, optimizer)
    assert parts[Part.PARAMETERS] == 2 * n
    assert parts[Part.GRADIENTS] == 2 * n
    assert parts[Part.MASTER_WEIGHTS] == 4 * n
    assert parts[Part.OPTIMIZER_STATES] == 8 * n


def test_training_state_bytes_counts_main_grad_and_weight_caches():
    model = _gpt(dtype=torch.bfloat16, fuse_wgrad_accumulation=True)
    n = sum(p.numel() for p in model.parameters())
    optimizer = ref.optimizers.FusedAdam(
        model.parameters(), master_weights=True, use_decoupled_grad=True
    )
    train_step(
        model,
        _batches(2),
        optimizer,
        te=ref,
        fp8_recipe=ref_recipe.DelayedScaling(),
        options=StepOptions(grad_accumulation="fused", cache_fp8_weights=True),
    )
    parts = training.training_state_bytes(model, optimizer)
    assert parts[Part.GRADIENTS] == 4 * n  # main_grad, aliased by decoupled_grad
    assert parts[training.CACHE_WORKSPACES] > 0


# --- the FusedAdam stand-in --------------------------------------------------------------------


@pytest.mark.parametrize("adam_w_mode", [True, False])
def test_stand_in_matches_torch_adam_on_fp32_parameters(adam_w_mode):
    torch.manual_seed(0)
    start = [torch.randn(5, 7), torch.randn(3)]
    ours = [torch.nn.Parameter(t.clone()) for t in start]
    theirs = [torch.nn.Parameter(t.clone()) for t in start]
    kwargs = {"lr": 1e-2, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 0.1}
    optimizer = ref.optimizers.FusedAdam(ours, adam_w_mode=adam_w_mode, **kwargs)
    reference = (torch.optim.AdamW if adam_w_mode else torch.optim.Adam)(theirs, **kwargs)
    for _ in range(5):
        grads = [torch.randn_like(t) for t in start]
        for p, q_, g in zip(ours, theirs, grads, strict=True):
            p.grad, q_.grad = g.clone(), g.clone()
        optimizer.step()
        reference.step()
    for p, q_ in zip(ours, theirs, strict=True):
        torch.testing.assert_close(p, q_, rtol=1e-5, atol=1e-6)


def test_master_weights_keep_updates_that_bf16_would_lose():
    weight = torch.nn.Parameter(torch.ones(64, dtype=torch.bfloat16))
    kept = torch.nn.Parameter(torch.ones(64, dtype=torch.bfloat16))
    with_master = ref.optimizers.FusedAdam([weight], lr=1e-4, master_weights=True)
    without = ref.optimizers.FusedAdam([kept], lr=1e-4)
    for _ in range(10):  # each update (1e-4) is below half a BF16 ulp at 1.0 (2**-8)
        weight.grad = torch.ones_like(weight)
        kept.grad = torch.ones_like(kept)
        with_master.step()
        without.step()
    master = with_master.get_unscaled_state(weight, "master_param")
    assert torch.all(kept == 1.0)
    assert master[0].item() == pytest.approx(1 - 10e-4, rel=1e-4)
    assert torch.equal(weight, master.to(torch.bfloat16))


@pytest.mark.parametrize(
    "fp8_recipe", [ref_recipe.DelayedScaling(), ref_recipe.Float8CurrentScaling()]
)
def test_fp8_weights_are_written_back_as_fp8_values(fp8_recipe):
    torch.manual_seed(0)
    with ref.quantized_model_init(enabled=True, recipe=fp8_recipe):
        linear = ref.Linear(64, 32, bias=False, params_dtype=torch.float32)
    linear.weight.grad = torch.randn(32, 64)
    if fp8_recipe.delayed():  # TE 2.20 leaves delayed-scaling FP8 weights alone, silently
        before = linear.weight.detach().clone()
        ref.optimizers.FusedAdam(linear.parameters()).step()
        assert torch.equal(linear.weight.detach(), before)
    else:
        with pytest.raises(RuntimeError, match="master_weights"):
            ref.optimizers.FusedAdam(linear.parameters()).step()
    optimizer = ref.optimizers.FusedAdam(linear.parameters(), lr=1e-3, master_weights=True)
    x = torch.randn(16, 64)
    for _ in range(3):
        with ref.autocast(recipe=fp8_recipe):
            out = linear(x)
        out.pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    master = optimizer.get_unscaled_state(linear.weight, "master_param")
    if fp8_recipe.delayed():  # the module's current weight scale (TE's fused FP8 Adam kernel)
        scale = linear.fp8_meta["scaling_fwd"].scale[1]
        assert scale.item() != 1.0  # updated by the autocasts
    else:  # the master's own amax (quantize_)
        scale = q.scale_from_amax(q.amax_of(master), 448.0)
    expected = q.cast_to_fp8(master, scale, torch.float8_e4m3fn).float() / scale
    torch.testing.assert_close(linear.weight.detach(), expected, rtol=1e-6, atol=0)
    assert not torch.equal(linear.weight.detach(), master)


def test_decoupled_gradients_are_read_and_cleared_as_te_does():
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    optimizer = ref.optimizers.FusedAdam([p], lr=0.1, master_weights=True, use_decoupled_grad=True)
    p.grad = torch.full((4,), -1.0, dtype=torch.bfloat16)  # ignored
    p.decoupled_grad = torch.ones(4)  # FP32, another dtype than the parameter
    optimizer.step()
    assert torch.all(p < 0)
    optimizer.zero_grad()
    assert p.decoupled_grad is None and p.grad is not None


def test_seed_master_weights_from_a_twin_and_from_high_precision_init_values():
    twin = _gpt(dtype=torch.bfloat16)
    model = _gpt(dtype=torch.bfloat16, fp8_recipe=ref_recipe.DelayedScaling())
    model.load_weights_from(twin)
    optimizer = ref.optimizers.FusedAdam(model.parameters(), master_weights=True)
    assert training.seed_master_weights(optimizer, model, twin) == len(list(model.parameters()))
    fc1 = model.layers[0].layer.layernorm_mlp.fc1_weight
    twin_fc1 = twin.layers[0].layer.layernorm_mlp.fc1_weight
    assert torch.equal(optimizer.get_unscaled_state(fc1, "master_param"), twin_fc1.float())
    assert fc1._fp8lab_quantized  # FP8 again from the first optimizer step on
    with ref.quantized_model_init(
        recipe=ref_recipe.DelayedScaling(), preserve_high_precision_init_val=True
    ):
        linear = ref.Linear(32, 16)
    optimizer = ref.optimizers.FusedAdam(linear.parameters(), master_weights=True)
    kept = linear.weight.get_high_precision_init_val().float()
    assert training.seed_master_weights(optimizer, linear) == 1
    assert torch.equal(optimizer.get_unscaled_state(linear.weight, "master_param"), kept)
    assert linear.weight.get_high_precision_init_val() is None
    with pytest.raises(ValueError, match="master_weights=True"):
        training.seed_master_weights(torch.optim.SGD(linear.parameters(), lr=0.1), linear)


def test_the_stand_in_refuses_what_it_does_not_model():
    p = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(NotImplementedError, match="capturable"):
        ref.optimizers.FusedAdam(p, capturable=True)
    with pytest.raises(NotImplementedError, match="exp_avg_dtype"):
        ref.optimizers.FusedAdam(p, exp_avg_dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="FusedSGD"):
        ref.optimizers.FusedSGD  # noqa: B018


# --- against Transformer Engine (GPU lane) -----------------------------------------------------


@pytest.mark.gpu
def test_stand_in_matches_te_fused_adam_with_master_weights():
    import transformer_engine.pytorch as te

    torch.manual_seed(0)
    start = [torch.randn(256, 128, dtype=torch.bfloat16), torch.randn(128, dtype=torch.bfloat16)]
    ours = [torch.nn.Parameter(t.clone()) for t in start]
    theirs = [torch.nn.Parameter(t.clone().cuda()) for t in start]
    kwargs = {"lr": 1e-3, "weight_decay": 0.01, "master_weights": True, "use_decoupled_grad": True}
    optimizer = ref.optimizers.FusedAdam(ours, **kwargs)
    reference = te.optimizers.FusedAdam(theirs, **kwargs)
    for _ in range(5):
        for p, q_ in zip(ours, theirs, strict=True):
            g = torch.randn(p.shape)
            p.decoupled_grad, q_.decoupled_grad = g, g.cuda()
        optimizer.step()
        reference.step()
    for p, q_ in zip(ours, theirs, strict=True):
        torch.testing.assert_close(
            optimizer.get_unscaled_state(p, "master_param"),
            reference.get_unscaled_state(q_, "master_param").cpu(),
            rtol=1e-5,
            atol=1e-6,
        )
        assert (p.float() - q_.float().cpu()).abs().max() <= 2**-7 * p.float().abs().max()


@pytest.mark.gpu
def test_te_fused_wgrad_overwrites_main_grad_on_the_first_micro_batch():
    """The reference's assumption, read from TE's linear.py (accumulate = not is_first_microbatch)."""
    import transformer_engine.pytorch as te

    linear = te.Linear(
        64, 32, bias=False, fuse_wgrad_accumulation=True, params_dtype=torch.bfloat16
    )
    x = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(16, 32, device="cuda", dtype=torch.bfloat16)
    expected = dy.float().t() @ x.float()
    for first, offset in ((True, 0.0), (None, 7.0), (False, 7.0)):
        linear.weight.main_grad = torch.full((32, 64), 7.0, device="cuda")
        linear(x, is_first_microbatch=first).backward(dy)
        assert linear.weight.grad is None
        torch.testing.assert_close(linear.weight.main_grad - offset, expected, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
def test_te_step_paths_agree_and_caching_is_exact_under_current_scaling():
    import transformer_engine.common.recipe as te_recipe
    import transformer_engine.pytorch as te

    micro = [(x.cuda(), y.cuda()) for x, y in _batches(4, batch=4, seq=16)]
    grads = {}
    for mode, cache in (
        ("param", False),
        ("fp32_buffer", False),
        ("fused", False),
        ("param", True),
    ):
        torch.manual_seed(0)
        model = GPT(
            CFG,
            form="te_layer",
            te=te,
            params_dtype=torch.bfloat16,
            device="cuda",
            hidden_dropout=0.0,
            attention_dropout=0.0,
            fuse_wgrad_accumulation=mode == "fused",
        )
        train_step(
            model,
            micro,
            None,
            te=te,
            fp8_recipe=te_recipe.Float8CurrentScaling(),
            options=StepOptions(grad_accumulation=mode, cache_fp8_weights=cache),
        )
        grads[(mode, cache)] = training.optimizer_gradients(model, mode)
    base = grads[("fp32_buffer", False)]
    assert _relative(grads[("fused", False)], base) < 0.02
    assert _relative(grads[("param", False)], base) < 0.02
    assert _relative(grads[("param", True)], grads[("param", False)]) < 5e-3


@pytest.mark.gpu
def test_train_leaves_the_peak_memory_counter_to_its_caller():
    model = GPT(CFG, device="cuda")
    torch.cuda.reset_peak_memory_stats()
    big = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    del big
    batches = [(x.cuda(), y.cuda()) for x, y in _batches(2)]
    training.train(model, batches, torch.optim.SGD(model.parameters(), lr=0.1))
    assert torch.cuda.max_memory_allocated() >= 256 * 2**20
    result = train_step(model, batches, None)
    assert result.peak_memory_bytes < 256 * 2**20  # the step measures its own peak


def test_decoupled_gradients_do_not_outlive_their_step():
    """train_step frees .grad at the start of a step; the optimizer's .decoupled_grad references
    are dropped after its step, so the previous step's gradients are not alive through the next
    forward and backward (2 bytes per parameter in BF16: llama3-8b at S=4096 would run out of
    memory on an H200 in its second step)."""
    model = _gpt(dtype=torch.bfloat16)
    optimizer = ref.optimizers.FusedAdam(
        model.parameters(), lr=1e-3, master_weights=True, use_decoupled_grad=True
    )
    alive_in_forward = []

    def record(module, args):
        params = module.parameters()
        alive_in_forward.append(any(getattr(p, "decoupled_grad", None) is not None for p in params))

    model.register_forward_pre_hook(record)
    tokens = torch.randint(0, CFG.vocab_size, (2, CFG.max_seq_len + 1))
    step = [(tokens[:, :-1], tokens[:, 1:])]
    for _ in range(2):
        training.train_step(model, step, optimizer, te=ref)
    assert alive_in_forward == [False, False]
    assert all(getattr(p, "decoupled_grad", None) is None for p in model.parameters())


@pytest.mark.gpu
def test_te_fused_adam_peak_does_not_grow_after_the_second_step():
    """TE's FusedAdam(use_decoupled_grad=True) reads param.decoupled_grad; once train_step drops
    it after the optimizer step, the third step's peak is the second's."""
    import transformer_engine.pytorch as te

    cfg = TransformerConfig(256, 1024, 4, num_layers=2, vocab_size=512, max_seq_len=64)
    torch.manual_seed(0)
    model = GPT(cfg, form="te_layer", te=te, params_dtype=torch.bfloat16, device="cuda")
    optimizer = te.optimizers.FusedAdam(
        model.parameters(), lr=1e-4, master_weights=True, use_decoupled_grad=True
    )
    tokens = torch.randint(0, cfg.vocab_size, (4, cfg.max_seq_len + 1), device="cuda")
    step = [(tokens[:, :-1], tokens[:, 1:])]
    peaks = [train_step(model, step, optimizer, te=te).peak_memory_bytes for _ in range(3)]
    assert peaks[2] <= peaks[1] + 2**20, peaks
    assert all(getattr(p, "decoupled_grad", None) is None for p in model.parameters())


def test_lm_loss_refuses_targets_outside_the_vocabulary_or_all_ignored():
    logits = torch.randn(2, 4, 8)
    targets = torch.randint(0, 8, (2, 4))
    for bad in (8, -1, 100):
        wrong = targets.clone()
        wrong[1, 2] = bad
        with pytest.raises(ValueError, match=r"targets hold ids .*\[0, V=8\)"):
            training.lm_loss(logits, wrong)
    with pytest.raises(ValueError, match="targets: every id is the ignore index"):
        training.lm_loss(logits, torch.full((2, 4), -100))
    some_ignored = targets.clone()
    some_ignored[0] = -100
    expected = F.cross_entropy(logits.flatten(0, 1), some_ignored.flatten())
    assert torch.equal(training.lm_loss(logits, some_ignored), expected)


def test_train_step_refuses_targets_outside_the_vocabulary():
    model = _gpt()
    (inputs, targets), = _batches(1)
    with pytest.raises(ValueError, match="targets"):
        train_step(model, [(inputs, targets + CFG.vocab_size)], None)
    with pytest.raises(ValueError, match="targets"):
        training.train(
            model, [(inputs, torch.full_like(targets, -100))], torch.optim.SGD(model.parameters())
        )


def test_swapped_te_and_recipe_say_which_is_which():
    model, micro = _gpt(), _batches(1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for run in (
        lambda **kw: train_step(model, micro, None, **kw),
        lambda **kw: training.train(model, micro, optimizer, **kw),
    ):
        with pytest.raises(TypeError, match="te=.* not the TE module.*fp8_recipe= a recipe"):
            run(te=ref_recipe.DelayedScaling(), fp8_recipe=ref)
        with pytest.raises(TypeError, match="te=.* not the TE module"):
            run(te=ref_recipe, fp8_recipe=ref_recipe.DelayedScaling())
        with pytest.raises(TypeError, match="fp8_recipe=.* is a module, not a recipe"):
            run(te=ref, fp8_recipe=ref_recipe)
