"""The names of memory's parts: one vocabulary for the estimator, the measurements and the prose.

:mod:`fp8lab.memory` builds its tree and timeline under these names, :mod:`fp8lab.training`
counts what a live model holds under the same ones, and the chapters compare the two by name.
Keeping the names here, apart from the estimator, lets the training loop use them without
importing the estimator (so tuning the estimator changes nothing the training code depends on).
A misspelt constant raises ``AttributeError``; a misspelt string would silently miss.
"""

from __future__ import annotations

__all__ = ["CACHE_WORKSPACES", "Part", "Saved"]

# What fp8lab.training.training_state_bytes counts beside the training state: the FP8 weight
# copies TE modules keep between steps when ``is_first_microbatch`` is used.
CACHE_WORKSPACES = "FP8 weight caches (is_first_microbatch)"


class Part:
    """Names of the tree's parts (a misspelt constant raises, a misspelt string would not)."""

    TRAINING_STATE = "training state"
    PARAMETERS = "parameters"
    GRADIENTS = "gradients"
    MASTER_WEIGHTS = "master weights"
    OPTIMIZER_STATES = "optimizer states"
    FP8_EXTRAS = "TE FP8 extras"
    SCALING_STATE = "scales and amax histories"
    FP8_WEIGHT_COPIES = "FP8 weight copies (saved for backward)"
    AUTOCAST_COPIES = "BF16 weight copies (torch.autocast)"
    ACTIVATIONS = "activations"
    CHECKPOINTS = "layer inputs (checkpoints)"
    RECOMPUTED_LAYER = "one layer, recomputed"
    OUTPUT_AND_GRADIENT = "output and its gradient"
    HEAD_INPUTS = "final norm and LM-head inputs"
    LOGITS = "logits and loss"
    HELD_LOGITS = "logits (held until backward returns)"
    LOG_PROBS = "log-probabilities (saved by cross-entropy)"
    LOSS_COPIES = "FP32 copies of the logits (loss forward)"
    LOSS_GRADIENTS = "two logit gradients (cross-entropy backward)"
    TEMPORARIES = "temporaries"
    COMM_BUFFERS = "communication buffers"
    DDP_BUCKETS = "DDP gradient buckets"
    DDP_OLD_BUCKETS = "DDP buckets of the first step (before the rebuild)"
    SP_GATHERED = "all-gathered tensors (sequence parallel backward)"
    FSDP2_REDUCE_SCATTER = "FSDP2 reduce-scatter input (previous layer)"
    INPUT_BATCH = "input batch and FP32 target (held by the caller)"
    OPTIMIZER_TEMPORARIES = "optimizer step temporaries"
    CUBLAS_WORKSPACE = "TE cuBLAS workspace"
    CUDA_CONTEXT = "CUDA context (outside max_memory_allocated)"


class Saved:
    """Names of the tensors one TE ``TransformerLayer`` saves for its backward."""

    ATTN_NORM_INPUT = "attention norm input"
    QKV_INPUT = "qkv input (norm output)"
    QKV_INPUT_FP8_ROWWISE = "qkv input (FP8 row-wise copy)"
    QKV = "q, k, v"
    ATTN_OUTPUT = "attention output"
    ATTN_DROPOUT_MASK = "attention-output dropout mask"
    PROJ_INPUT_FP8 = "proj input (FP8 copy)"
    SCORES = "softmax, dropout mask and output (S x S)"
    MLP_NORM_INPUT = "mlp norm input"
    FC1_INPUT = "fc1 input (norm output)"
    FC1_OUTPUT = "fc1 output (pre-activation)"
    FC2_INPUT = "fc2 input (activation output)"
    MLP_DROPOUT_MASK = "mlp dropout mask"
