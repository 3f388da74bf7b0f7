"""FLOPs and parameter counts: exact against FlopCounterMode and PyTorch, and against published
figures."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from fp8lab import flops
from fp8lab.config import TransformerConfig, pad_vocab, preset_config
from fp8lab.layers import PlainTransformerLayer
from fp8lab.models import GPT

SMALL = {
    "mha-gelu-tied": TransformerConfig(64, 256, 4, num_layers=2, vocab_size=96, max_seq_len=32),
    "gqa-swiglu-untied": TransformerConfig(
        64,
        160,
        8,
        num_gqa_groups=2,
        num_layers=2,
        vocab_size=80,
        activation="swiglu",
        normalization="RMSNorm",
        bias=False,
        tied_embeddings=False,
        position_embedding="rope",
        max_seq_len=32,
    ),
    "mha-swiglu-bias": TransformerConfig(
        32, 96, 2, num_layers=1, vocab_size=64, activation="swiglu", max_seq_len=32
    ),
    "gqa-gelu-rms": TransformerConfig(
        48,
        128,
        6,
        num_gqa_groups=3,
        num_layers=3,
        vocab_size=50,
        normalization="RMSNorm",
        max_seq_len=32,
    ),
}
B, S = 2, 16


def counted(model, tokens, backward):
    with FlopCounterMode(display=False) as counter:
        logits = model(tokens)
        if backward:
            logits.float().sum().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("name", SMALL)
def test_parameter_count_matches_pytorch(name):
    cfg = SMALL[name]
    model = GPT(cfg)
    assert flops.parameter_count(cfg) == sum(p.numel() for p in model.parameters())
    layer = PlainTransformerLayer(cfg)
    assert sum(flops.layer_parameters(cfg).values()) == sum(p.numel() for p in layer.parameters())


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "forward+backward"])
@pytest.mark.parametrize("name", SMALL)
def test_flop_counter_exact_with_math_attention(name, backward):
    """Attention as explicit matmuls: FlopCounterMode sees every product, full S x S convention."""
    cfg = SMALL[name]
    model = GPT(cfg, attention="math", hidden_dropout=0.0, attention_dropout=0.0)
    tokens = torch.randint(0, cfg.vocab_size, (B, S))
    expected = flops.training_flops(cfg, B, S) if backward else flops.forward_flops(cfg, B, S)
    assert counted(model, tokens, backward) == expected


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "forward+backward"])
@pytest.mark.parametrize("name", SMALL)
def test_flop_counter_exact_for_matmuls_with_sdpa(name, backward):
    """With fused SDPA the linear layers and LM head still match exactly; on CPU the SDPA kernel
    counts 0."""
    cfg = SMALL[name]
    model = GPT(cfg, hidden_dropout=0.0, attention_dropout=0.0)
    tokens = torch.randint(0, cfg.vocab_size, (B, S))
    attention = cfg.num_layers * flops.attention_flops(cfg, B, S)
    if backward:
        matmuls = flops.training_flops(cfg, B, S) - 3 * attention
        flash = flops.training_flops(cfg, B, S, attention_backward_factor=2.5)
    else:
        matmuls = flops.forward_flops(cfg, B, S) - attention
        flash = flops.forward_flops(cfg, B, S)
    total = counted(model, tokens, backward)
    assert total in (matmuls, flash)  # CPU: SDPA unseen; CUDA: flash/efficient kernels counted
    if not torch.cuda.is_available():
        assert total == matmuls


def test_causal_convention_halves_attention():
    cfg = preset_config("te-tutorial")
    full, causal = (
        flops.attention_flops(cfg, 2, 2048),
        flops.attention_flops(cfg, 2, 2048, causal=True),
    )
    assert full == 4 * 2 * 2048**2 * 4096 and causal * 2 == full
    assert (
        flops.layer_flops(cfg, 2, 2048) - flops.layer_flops(cfg, 2, 2048, causal=True) == full // 2
    )


def test_gpt3_175b_parameter_count():
    """Brown et al. 2020, table 2.1: 175.0B parameters for L=96, H=12288, A=96, S=2048."""
    count = flops.parameter_count(preset_config("gpt3-175b"))
    assert count == pytest.approx(175.0e9, rel=0.003)


def test_llama3_8b_parameter_count():
    """Meta's Llama 3 8B model card: 8.03B parameters."""
    assert flops.parameter_count(preset_config("llama3-8b")) == pytest.approx(8.03e9, rel=0.001)


def test_palm_540b_mfu_worked_example():
    """Chowdhery et al. 2022, appendix B: 238.3K tokens/s on 6144 TPU v4 (275 TFLOP/s) is 46.2%
    MFU."""
    per_token = flops.palm_flops_per_token(540.35e9, layers=118, heads=48, head_dim=256, seq=2048)
    utilisation = flops.mfu(per_token * 238.3e3, 1.0, peak_tflops=275, n_gpus=6144)
    assert utilisation == pytest.approx(0.462, abs=0.0005)


def test_megatron_eq3_equals_full_recompute_training_flops():
    """Narayanan et al. 2021, eq. 3, for a GPT shape with F = 4H: equal to our sum with full
    recompute."""
    cfg = TransformerConfig(2048, 8192, 16, num_layers=24, vocab_size=51200, tied_embeddings=True)
    ours = flops.training_flops(cfg, batch=8, seq=2048, recompute="full")
    assert ours == pytest.approx(flops.megatron_flops(cfg, batch=8, seq=2048), rel=1e-12)


def test_megatron_175b_time_to_train():
    """Narayanan et al. 2021, sec. 5.1: 175B on 300B tokens, 1024 A100s at 140 TFLOP/s: about 34
    days."""
    seconds = flops.time_to_train_s(300e9, 175e9, n_gpus=1024, tflops_per_gpu=140, recompute="full")
    assert seconds / 86400 == pytest.approx(34, abs=1)
    assert flops.time_to_train_s(300e9, 175e9, 1024, 140) == pytest.approx(seconds * 6 / 8)


def test_total_training_flops_6nd_and_8nd():
    """The run-level rule: 6ND without recompute, 8ND with full recompute; selective has no N-D
    form."""
    assert flops.total_training_flops(175e9, 300e9) == 6 * 175e9 * 300e9
    assert flops.total_training_flops(175e9, 300e9, recompute="full") == 8 * 175e9 * 300e9
    with pytest.raises(ValueError, match="recompute='selective'.*training_flops"):
        flops.total_training_flops(175e9, 300e9, recompute="selective")
    with pytest.raises(TypeError, match="recompute=True"):
        flops.time_to_train_s(300e9, 175e9, 1024, 140, recompute=True)


def test_palm_540b_needs_kv_channels():
    """Chowdhery et al. 2022, table 1: 540.35B parameters with 48 heads of 256 at d_model 18432 (A *
    D != H),
    multi-query attention and SwiGLU; our count of the PaLM preset (sequential rather than parallel
    layers, which have the same parameters up to one norm per layer) lands within 0.05%."""
    cfg = preset_config("palm-540b")
    assert cfg.head_dim == 256 and cfg.q_size == 12288 != cfg.hidden_size
    assert flops.parameter_count(cfg) == pytest.approx(540.35e9, rel=5e-4)
    per_token = flops.palm_flops_per_token(540.35e9, layers=118, heads=48, head_dim=256, seq=2048)
    attention = (
        flops.attention_flops(cfg, 1, 2048) * cfg.num_layers * 3 / 2048
    )  # per token, training
    assert pytest.approx(attention) == 12 * 118 * 48 * 256 * 2048
    assert per_token - 6 * 540.35e9 == pytest.approx(attention)


def test_recompute_and_hfu():
    cfg = preset_config("te-tutorial")
    model = flops.training_flops(cfg, 2, 2048)
    assert model == 3 * flops.forward_flops(cfg, 2, 2048)
    assert flops.training_flops(cfg, 2, 2048, recompute="full") == 4 * flops.forward_flops(
        cfg, 2, 2048
    )
    selective = flops.training_flops(cfg, 2, 2048, recompute="selective")
    assert selective - model == flops.attention_flops(cfg, 2, 2048)
    assert flops.mfu(model, 0.01, 989.4) < flops.mfu(selective, 0.01, 989.4)


def test_tokens_and_step_time_round_trip():
    assert flops.tokens_per_s(4, 2048, 0.5) == 16384
    assert flops.step_time_s(4, 2048, 16384) == 0.5


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: flops.layer_flops(preset_config("te-tutorial"), 0, 128), "batch=0"),
        (
            lambda: flops.training_flops(preset_config("te-tutorial"), 1, 8, recompute="half"),
            "recompute='half'",
        ),
        (lambda: flops.mfu(1e12, 0, 100), "step_time_s=0"),
        (lambda: flops.time_to_train_s(1e9, 1e9, 0, 100), "n_gpus=0"),
        (
            lambda: TransformerConfig(100, 400, 3),
            "num_attention_heads=3 must divide hidden_size=100",
        ),
        (lambda: TransformerConfig(96, 384, 12, num_gqa_groups=5), "num_gqa_groups=5 must divide"),
        (lambda: TransformerConfig(96, -1, 12), "ffn_hidden_size=-1"),
        (lambda: TransformerConfig(96, 384, 12, activation="relu"), "activation='relu'"),
        (lambda: preset_config("gpt-5"), "name='gpt-5': unknown preset"),
    ],
)
def test_bad_input_names_the_argument(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_fp8_friendly_sizes_and_vocab_padding():
    assert preset_config("te-tutorial").fp8_warnings() == []
    warnings = preset_config("gpt2-small").fp8_warnings()
    assert warnings == ["vocab_size=50257 is not divisible by 16"]
    assert (
        pad_vocab(50257, 64) == 50304
        and pad_vocab(50257, 128) == 50304
        and pad_vocab(128, 128) == 128
    )


shapes = st.builds(
    lambda a, d, g, f, layers: TransformerConfig(
        a * d, f * 16, a, num_gqa_groups=g(a), num_layers=layers
    ),
    st.integers(1, 16),
    st.sampled_from([8, 16, 64]),
    st.sampled_from([lambda a: None, lambda a: 1]),
    st.integers(1, 64),
    st.integers(1, 4),
)


@settings(max_examples=60, deadline=None)
@given(cfg=shapes, batch=st.integers(1, 8), seq=st.integers(1, 512))
def test_properties(cfg, batch, seq):
    assert flops.layer_flops(cfg, batch + 1, seq) > flops.layer_flops(cfg, batch, seq)
    assert flops.layer_flops(cfg, batch, seq + 1) > flops.layer_flops(cfg, batch, seq)
    assert flops.training_flops(cfg, batch, seq, recompute="full") > flops.training_flops(
        cfg, batch, seq
    )
    deeper = cfg.replace(num_layers=cfg.num_layers + 1)
    assert flops.parameter_count(deeper) > flops.parameter_count(cfg)
    assert flops.forward_flops(cfg, batch, seq, causal=True) <= flops.forward_flops(cfg, batch, seq)
    # the dense part of a layer is 2 FLOPs per parameter-weight per token
    dense = flops.layer_flops(cfg, batch, seq) - flops.attention_flops(cfg, batch, seq)
    bias_and_norms = sum(v for k, v in flops.layer_parameters(cfg).items() if "norm" in k) + (
        cfg.qkv_size + cfg.hidden_size + cfg.fc1_out + cfg.hidden_size
    )
    assert dense == 2 * batch * seq * (sum(flops.layer_parameters(cfg).values()) - bias_and_norms)
