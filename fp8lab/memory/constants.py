"""Byte sizes, names of the choices and fitted constants of the memory model, each with its source.

Every number the estimator uses that is not arithmetic on the model's shape lives here, so a
reader can check each against the code or the measurement it comes from.
"""

from __future__ import annotations

__all__ = [
    "ADAMW_IMPLS",
    "BACKWARD_SCRATCH",
    "BLOCK_SCALE_BYTES_PER_ELEMENT",
    "BLOCK_SCALING_UNEXPLAINED_BYTES_PER_ELEMENT",
    "COMPUTE",
    "CUBLAS_WORKSPACE_HOPPER",
    "CUBLAS_WORKSPACE_OLDER",
    "CUDA_CONTEXT",
    "FP8_GATHERED_BYTES_PER_ELEMENT",
    "FP8_GEMMS_PER_LAYER",
    "FP8_META_SLOTS_PER_GEMM",
    "FSDP2_BUFFERS",
    "FSDP2_UNSHARDED_LAYERS",
    "GiB",
    "MASTER_INIT_BYTES_PER_PARAMETER",
    "MiB",
    "NORM_STATS_BYTES",
    "OFFLOAD_MIN_ELEMENTS",
    "OPTIMIZERS",
    "ORIGIN",
    "PRECISIONS",
    "WINDOWS",
    "ZERO_STAGES",
]

MiB = 2**20  # bytes in a mebibyte (torch.cuda reports bytes; the book shows MiB and GiB)
GiB = 2**30  # bytes in a gibibyte

# Compute precision: what the GEMMs of the transformer layers run in.
COMPUTE = ("fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-block")
# ``precision`` also takes the short names of earlier versions: "fp8-weights" is FP8 weights
# (quantized_model_init, FP32 master) with delayed scaling; alone, "bf16" and the FP8 recipes
# mean BF16 parameters with FP32 master weights (see resolve_precision).
PRECISIONS = (*COMPUTE, "fp8-weights")
# The optimizers modelled: torch.optim.AdamW (or TE's FusedAdam), torch.optim.SGD, none at all.
OPTIMIZERS = ("adamw", "sgd", "none")
# torch.optim.AdamW's three implementations (torch/optim/adam.py); on CUDA torch picks foreach.
ADAMW_IMPLS = ("foreach", "fused", "for-loop")
# Rajbhandari et al. 2020 (ZeRO), sec. 5: stage 0 (none) to 3 (parameters sharded too).
ZERO_STAGES = (0, 1, 2, 3)
# The steps a measured peak spans, above what was allocated before the model was built:
# "first-steps" from the build on, the first steps included (tools/memory_check and
# tools/layout_peaks_worker.py reset the peak counter before building the model); "steady" a
# step after warm-up steps (chapter 08's worker: fp8lab.speedometer.time_callable resets the
# counter after its warm-up calls), where nothing that happens once in the first steps counts.
WINDOWS = ("first-steps", "steady")

# TE 2.20, cpp_extensions/gemm.py, get_cublas_workspace_size_bytes(): 32 MiB plus 1 KiB of
# alignment and scales on Hopper and newer, 4 MiB on older GPUs. Allocated once per process by
# the first te.Linear's reset_parameters (module/linear.py, _prealloc_cublas_workspace): this is
# why a first FP8 te.Linear(4096, 4096) under quantized_model_init shows 4 bytes/parameter right
# after init (2 of FP8 data and transpose, 2 = 32 MiB / 4096^2 of workspace).
CUBLAS_WORKSPACE_HOPPER = 32 * MiB + 1024
CUBLAS_WORKSPACE_OLDER = 4 * MiB
# The CUDA context and kernels' code: about 0.5 GiB on an H200 with torch 2.11 (nvidia-smi's used
# memory minus max_memory_allocated after a warm-up); outside max_memory_allocated.
CUDA_CONTEXT = 512 * MiB
# Scratch that the backward of TE modules holds beyond the tensors modelled here (autograd's sums
# of branch gradients, norm and GEMM helper buffers): measured on an H200 with TE 2.20.2, where
# the peaks of stacks of te.TransformerLayer sat 20-28 MiB above the modelled tensors.
BACKWARD_SCRATCH = 24 * MiB
# Delayed-scaling bookkeeping per FP8 GEMM of a TE module: five FP32 slots (scale, scale_inv and
# amax of input, weight and output-gradient metas; TE 2.20 quantization.py) with an amax history.
FP8_META_SLOTS_PER_GEMM = 5
FP8_GEMMS_PER_LAYER = 4  # QKV, attention output, FC1, FC2 (te.TransformerLayer's GEMMs)
# An FP8 tensor all-gathered for a backward GEMM under sequence parallelism (TE 2.20
# distributed.py, _all_gather_fp8): the row-wise FP8 data is gathered (1 byte per element) and,
# where a column-wise copy is needed and the GPU has no non-TN FP8 GEMM (Hopper), its transpose is
# made after the gather (1 more byte), as it is for the gathered norm output that FC1's and QKV's
# weight gradients read (module/layernorm_mlp.py, layernorm_linear.py: update_usage(columnwise)).
FP8_GATHERED_BYTES_PER_ELEMENT = 2
# Float8BlockScaling (TE 2.20 tensor/float8_blockwise_tensor.py): activations and gradients are
# scaled per 1 x 128 block with one FP32 scale, 4/128 bytes per element on top of the FP8 byte.
BLOCK_SCALE_BYTES_PER_ELEMENT = 4 / 128
# What complete steps under Float8BlockScaling hold beyond the modelled FP8 copies and scales, per
# element of a saved GEMM input: fitted on the tune matrix only (tools/memory_check; 0.611 and
# 0.605 B for its two block-scaling configurations, peaks measured on an H200 with TE 2.20.2).
# Which tensor it is was not isolated; the held-out matrix checks the fit.
BLOCK_SCALING_UNEXPLAINED_BYTES_PER_ELEMENT = 0.61
# FP32 mean and rstd per token of a LayerNorm (rstd alone for RMSNorm): PyTorch's and TE's norms.
NORM_STATS_BYTES = {"LayerNorm": 8, "RMSNorm": 4}
# FusedAdam.initialize_state (TE 2.20 optimizers/fused_adam.py) builds each master weight from a
# dequantized (2 bytes) or cloned parameter, then an FP32 copy (4): 6 bytes/parameter of one
# parameter at a time, while the previous parameters' states already exist.
MASTER_INIT_BYTES_PER_PARAMETER = 6
# FSDP2 (torch/distributed/fsdp/_fully_shard): with reshard_after_forward=True a layer is
# all-gathered (a full-size copy of its parameters) when it runs, and the next one is prefetched
# while it does: two unsharded layers at once, plus, in the backward, the running layer's full
# unsharded gradient before its reduce-scatter. The root module (embeddings, final norm, head)
# is not resharded after the forward: its full parameters stay from the forward to the backward.
FSDP2_UNSHARDED_LAYERS = 2
FSDP2_BUFFERS = "FSDP2 all-gathered weights and gradient"  # the part's name in an estimate
# TE 2.20 cpu_offload.py, OffloadableLayerState._check_if_offload: a saved tensor moves to host
# memory only from 256 Ki elements on; parameters and weight copies never (mark_not_offload).
OFFLOAD_MIN_ELEMENTS = 256 * 1024

# Where each number above comes from: read from a source (TE's or PyTorch's code, a paper),
# measured directly on a GPU, or fitted to measured peaks of whole steps. Chapter 07 shows this
# table, generated from this module, so that no constant of the estimator goes unstated.
ORIGIN = {
    "CUBLAS_WORKSPACE_HOPPER": "source: TE 2.20 cpp_extensions/gemm.py",
    "CUBLAS_WORKSPACE_OLDER": "source: TE 2.20 cpp_extensions/gemm.py",
    "CUDA_CONTEXT": "measured: nvidia-smi against max_memory_allocated, H200",
    "BACKWARD_SCRATCH": "fitted: peaks of stacks of te.TransformerLayer, H200",
    "FP8_META_SLOTS_PER_GEMM": "source: TE 2.20 quantization.py",
    "FP8_GEMMS_PER_LAYER": "source: te.TransformerLayer's GEMMs",
    "FP8_GATHERED_BYTES_PER_ELEMENT": "source: TE 2.20 distributed.py (_all_gather_fp8)",
    "BLOCK_SCALE_BYTES_PER_ELEMENT": "source: TE 2.20 float8_blockwise_tensor.py",
    "BLOCK_SCALING_UNEXPLAINED_BYTES_PER_ELEMENT": "fitted: the tune matrix, H200",
    "NORM_STATS_BYTES": "source: PyTorch's and TE's norms",
    "FSDP2_UNSHARDED_LAYERS": "source: torch.distributed.fsdp (fully_shard prefetch)",
    "OFFLOAD_MIN_ELEMENTS": "source: TE 2.20 cpu_offload.py",
    "MASTER_INIT_BYTES_PER_PARAMETER": "source: TE 2.20 optimizers/fused_adam.py",
}
