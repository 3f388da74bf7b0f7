"""The four forms of the layer compute one function (CPU reference here, real TE on a GPU box).

The same test runs on both lanes: ``import_te()`` hands it TE's modules on a GPU with TE and the
CPU reference elsewhere. Weights are copied under the canonical names, dropout is off, and every
form is compared with the plain PyTorch layer at BF16 tolerance (relative error of the whole
tensor). Set ``FP8LAB_LAYERS_REPORT=path.json`` to write the measured errors.
"""

import json
import os

import pytest
import torch

from fp8lab import import_te
from fp8lab.config import TransformerConfig, pad_vocab
from fp8lab.environment import detect
from fp8lab.formats import relative_error
from fp8lab.layers import (
    FORMS,
    build_layer,
    canonical_state_dict,
    load_canonical_state_dict,
    rotary_angles,
)
from fp8lab.models import GPT

try:  # real TE on a GPU box, the CPU reference elsewhere; a CUDA machine without TE skips this file
    TE, RECIPE = import_te()
except RuntimeError as reason:
    pytest.skip(str(reason), allow_module_level=True)
DEVICE = detect().device
CONFIGS = {
    "gpt": TransformerConfig(128, 512, 4),
    "llama": TransformerConfig(
        128,
        384,
        4,
        num_gqa_groups=2,
        activation="swiglu",
        normalization="RMSNorm",
        bias=False,
        position_embedding="rope",
    ),
}
OUTPUT_BOUND, GRAD_BOUND = 1e-2, 2e-2
ERRORS: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    path = os.environ.get("FP8LAB_LAYERS_REPORT")
    if path:
        with open(path, "w") as handle:
            json.dump(ERRORS, handle, indent=1, sort_keys=True)


def same_weights(cfg, forms=FORMS, dtype=torch.bfloat16):
    layers = {
        form: build_layer(
            form,
            cfg,
            TE,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            params_dtype=dtype,
            device=DEVICE,
        )
        for form in forms
    }
    state = canonical_state_dict(layers["pytorch"])
    for name in state:  # non-trivial norms and biases, so a swapped name cannot hide
        if state[name].dim() == 1:
            state[name] = state[name] + 0.1 * torch.randn_like(state[name].float()).to(
                state[name].dtype
            )
    for layer in layers.values():
        load_canonical_state_dict(layer, state)
    return layers


def run(layer, x, rotary):
    x = x.clone().requires_grad_()
    out = layer(x, rotary=rotary)
    out.backward(torch.ones_like(out) * 0.01 + out.detach() * 0.1)
    return out, x.grad, canonical_state_dict(layer, grad=True)


@pytest.mark.parametrize("name", CONFIGS)
def test_four_forms_compute_the_same_function(name):
    cfg = CONFIGS[name]
    layers = same_weights(cfg)
    x = torch.randn(64, 2, cfg.hidden_size, device=DEVICE, dtype=torch.bfloat16)
    rotary = (
        rotary_angles(64, cfg.head_dim, device=DEVICE) if cfg.position_embedding == "rope" else None
    )
    expected_out, expected_dx, expected_grads = run(layers["pytorch"], x, rotary)
    for form in FORMS[1:]:
        out, dx, grads = run(layers[form], x, rotary)
        ERRORS[f"{name}/{form}/output"] = relative_error(out, expected_out)
        ERRORS[f"{name}/{form}/input_grad"] = relative_error(dx, expected_dx)
        assert ERRORS[f"{name}/{form}/output"] < OUTPUT_BOUND, form
        assert ERRORS[f"{name}/{form}/input_grad"] < GRAD_BOUND, form
        assert set(grads) == set(expected_grads)
        for key in grads:
            ERRORS[f"{name}/{form}/grad/{key}"] = error = relative_error(
                grads[key], expected_grads[key]
            )
            assert error < GRAD_BOUND, (form, key, error)


def test_fp8_forms_agree_under_autocast():
    """Under FP8 the three TE forms quantize the same four GEMMs: outputs agree within FP8 noise."""
    cfg = CONFIGS["gpt"]
    layers = same_weights(cfg, forms=FORMS)
    x = torch.randn(64, 2, cfg.hidden_size, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        bf16 = layers["pytorch"](x)
        with TE.autocast(recipe=RECIPE.Float8CurrentScaling()):
            outs = {form: layers[form](x) for form in FORMS[1:]}
    for form, out in outs.items():
        ERRORS[f"fp8/{form}/output_vs_bf16"] = error = relative_error(out, bf16)
        assert 1e-4 < error < 5e-2, (form, error)  # changed by FP8, but not broken


def test_gpt_from_any_form():
    cfg = TransformerConfig(
        128, 512, 4, num_layers=2, vocab_size=pad_vocab(1000, 64), max_seq_len=64
    )
    torch.manual_seed(0)
    models = {
        form: GPT(
            cfg,
            form=form,
            te=TE,
            params_dtype=torch.bfloat16,
            device=DEVICE,
            hidden_dropout=0.0,
            attention_dropout=0.0,
        )
        for form in FORMS
    }
    for form in FORMS[1:]:
        models[form].load_weights_from(models["pytorch"])
    tokens = torch.randint(0, cfg.vocab_size, (2, 64), device=DEVICE)
    with torch.no_grad():
        logits = {form: model(tokens) for form, model in models.items()}
    assert logits["pytorch"].shape == (2, 64, cfg.vocab_size)
    assert models["pytorch"].head.weight is models["pytorch"].embed.weight
    for form in FORMS[1:]:
        ERRORS[f"gpt/{form}/logits"] = error = relative_error(logits[form], logits["pytorch"])
        assert error < OUTPUT_BOUND, (form, error)


def test_rms_rope_gpt_and_untied_head():
    cfg = TransformerConfig(
        64,
        256,
        4,
        num_gqa_groups=2,
        num_layers=1,
        vocab_size=512,
        activation="swiglu",
        normalization="RMSNorm",
        bias=False,
        position_embedding="rope",
        tied_embeddings=False,
        max_seq_len=32,
    )
    model = GPT(cfg, form="te_layer", te=TE, device=DEVICE)
    assert model.pos is None and model.head.weight is not model.embed.weight
    assert model(torch.zeros(1, 32, dtype=torch.long, device=DEVICE)).shape == (1, 32, 512)


def test_builder_errors():
    cfg = CONFIGS["gpt"]
    with pytest.raises(ValueError, match="form='keras'"):
        build_layer("keras", cfg, TE)
    with pytest.raises(ValueError, match="needs te="):
        build_layer("te_layer", cfg)
    with pytest.raises(ValueError, match="attention= applies"):
        build_layer("te_modules", cfg, TE, attention="math")
    with pytest.raises(ValueError, match="hidden_dropout=1.5"):
        build_layer("te_modules", cfg, TE, hidden_dropout=1.5)
    layer = build_layer("te_layer", cfg, TE, device=DEVICE)
    state = canonical_state_dict(build_layer("pytorch", cfg))
    with pytest.raises(ValueError, match="do not match"):
        load_canonical_state_dict(layer, {k: v for k, v in state.items() if k != "fc1.bias"})
    state["fc1.weight"] = state["fc1.weight"][:, :64]
    with pytest.raises(ValueError, match="fc1.weight: shape"):
        load_canonical_state_dict(layer, state)
    with pytest.raises(TypeError, match="not one of the book's layer forms"):
        canonical_state_dict(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="no gradient"):
        canonical_state_dict(build_layer("pytorch", cfg), grad=True)
