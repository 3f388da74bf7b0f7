"""What every worker of chapter 08 shares: the job, the model, its data, a step."""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import fp8lab
from fp8lab.parallel.ranks import gather, rounds_on_ranks, write  # noqa: F401

ARGS, OUT = json.loads(sys.argv[1]), sys.argv[2]  # sizes; where rank 0 writes
CUDA = torch.cuda.is_available()
DTYPE = torch.bfloat16 if CUDA else torch.float32  # FP32 on CPUs: BF16 matmuls are slow


def start():
    """Join the job torchrun started: this rank's GPU, TE, then the process group."""
    local = int(os.environ["LOCAL_RANK"])
    if CUDA:
        torch.cuda.set_device(local)
    te, recipe = fp8lab.import_te()  # TE on a GPU, the CPU reference elsewhere
    device = torch.device("cuda", local) if CUDA else torch.device("cpu")
    backend = "nccl" if CUDA else "gloo"
    dist.init_process_group(backend, device_id=device if CUDA else None)
    return te, recipe, device


def build(te, device, seed=1234, layers=None, dtype=DTYPE, **parallel):
    """``layers`` (default L) te.TransformerLayers, the same weights for one seed."""
    torch.manual_seed(seed)
    H, F_, A = ARGS["H"], ARGS["F"], ARGS["A"]
    return torch.nn.Sequential(*[
        te.TransformerLayer(
            H, F_, A, layer_number=i + 1, hidden_dropout=0.0, attention_dropout=0.0,
            self_attn_mask_type="causal", fuse_qkv_params=True,
            qkv_weight_interleaved=False, params_dtype=dtype, device=device, **parallel)
        for i in range(layers or ARGS["L"])])


def data(device, batch, seq=None, seed=7):
    """Input and target of shape [S, B, H], the same on every rank for one seed."""
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (seq or ARGS["S"], batch, ARGS["H"])
    x = torch.randn(shape, generator=g, device=device)
    return x.to(DTYPE), torch.randn(shape, generator=g, device=device)


def adam(te, params, lr=1e-4):
    """TE's FusedAdam, keeping FP32 master weights beside the BF16 ones."""
    return te.optimizers.FusedAdam(
        params, lr=lr, master_weights=True, master_weight_dtype=torch.float32)


def step_fn(te, model, opt, x, target, fp8, after_backward=None, after_step=None):
    """One step: forward under te.autocast(**fp8), MSE loss, backward, update."""
    def step():
        with te.autocast(**fp8):
            out = model(x)
        loss = F.mse_loss(out.float(), target)
        loss.backward()
        if after_backward:
            after_backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if after_step:
            after_step()
        return loss
    return step


def peak_mib(device):
    """The most memory this rank's tensors held since the last reset (NaN on CPUs)."""
    return torch.cuda.max_memory_allocated(device) / 2**20 if CUDA else float("nan")


def relative_error(a, b):
    """||a - b|| / ||b|| in FP32."""
    a, b = a.detach().float(), b.detach().float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
