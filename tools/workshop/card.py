"""The decision card: one take-home page of rules, each at the strength of its chapter's data.

Its lines link to the chapters that measure them. The two lines whose strength depends on a
result are computed from the committed outputs, never typed: what FP8 did to chapter 04's
memory-bound (8-token) GEMMs, and what FP8 attention did to chapter 03's causal layer. A
re-stamped chapter rewrites them (``python -m tools.workshop_pages write``).
"""

from __future__ import annotations

import re

from fp8lab.workshop.outputs import reading
from tools.workshop import notebooks

GEMMS_8 = ("gemm_8_qkv", "gemm_8_attention_output", "gemm_8_fc1", "gemm_8_fc2")
_FLOOR = re.compile(r"session floor ([\d.]+%)")


def _verdict(text: str) -> str:
    """The verdict word of a protocol phrase ("faster", "slower", "tied", "not resolved")."""
    for word in ("not resolved", "faster", "slower", "tied"):
        if text.startswith(word) or text.split(" ", 1)[-1].startswith(word):
            return word
    return "not resolved"


def memory_bound_line() -> str:
    """Chapter 04's 8-token GEMMs, FP8 against BF16, at the protocol's verdicts."""
    texts = [notebooks.glued_text("04", name, "the decision card") for name in GEMMS_8]
    words = [_verdict(t) for t in texts]
    ratios = [reading(t).value for t in texts]
    floors = sorted({m.group(1) for t in texts for m in _FLOOR.finditer(t)})
    floor = f"session floor {', '.join(floors)}" if floors else "no session floor glued"
    span = f"{min(ratios):.2f}–{max(ratios):.2f}×"
    if set(words) == {"faster"}:
        said = f"FP8 was faster for all {len(texts)} ({span} on kernel time; {floor})"
    else:
        counts = ", ".join(f"{words.count(w)} {w}" for w in dict.fromkeys(words))
        said = f"FP8 against BF16: {counts} ({span} on kernel time; {floor})"
    return (
        "- Count FLOPs and MFU against the peak of the dtype the GEMMs run in. Left of the "
        "FP8 ridge point FP8 can still pay, on bytes rather than FLOPs: of chapter 04's "
        f"memory-bound weight GEMMs at 8 tokens, {said}, their inputs already in FP8 (no "
        "cast in the time). → "
        "{doc}`chapter 04 <../notebooks/04_performance_math>`"
    )


def attention_line() -> str:
    """Chapter 03's causal layer: its input-gradient error without and with FP8 attention."""
    gemms = notebooks.glued_text("03", "acc_layer_fp8_grad", "the decision card")
    both = notebooks.glued_text("03", "acc_layer_fp8_attn_grad", "the decision card")
    change = "raised" if reading(both).value > reading(gemms).value else "did not raise"
    return (
        "- Attention: which backend ran (TE's log), and FP8 attention's error before its "
        "speed. A causal mask does not make it free: in chapter 03's causal layer, FP8 "
        f"attention {change} the input gradient's difference from BF16 from {gemms} (FP8 "
        f"GEMMs only) to {both}. Without a mask one scaling update makes its error several "
        "times larger (chapter 05 measures it). No dropout under FP8 attention on TE "
        "2.20.2. → {doc}`chapter 03 <../notebooks/03_pytorch_to_te>`, "
        "{doc}`chapter 05 <../notebooks/05_attention_backends>`"
    )


_TOP = """\
# Decision card: when FP8 pays

One page to take home. Each line is a rule the book measures; the link goes to the chapter
that measures it, with the numbers of its last GPU run.

**Can this machine do FP8?**

- The GPU has compute capability 8.9 or newer, and `make doctor` (or
  `python -m fp8lab.doctor`) reads `ok` on FP8, on one cuDNN and on both smoke tests. →
  {doc}`setup`, {doc}`../book/gpu-box`
- Measure your GPU's BF16 and FP8 GEMM ceilings before anything else: their ratio at your
  layer's shapes is the most a GEMM-bound layer can gain. →
  {doc}`chapter 00 <../notebooks/00_your_gpu>`

**Will it pay here?**

- The GEMMs are most of the step (profile it) and large: below some hidden size, FP8's
  casts and launches cost more than its GEMMs save. →
  {doc}`chapter 03 <../notebooks/03_pytorch_to_te>`
"""
_MIDDLE = """\
- Time the whole training step, both precisions in the same run, alternating rounds, and
  against a strong BF16 baseline (compiled, the fastest attention kernel, the same mask and
  dropout). → {doc}`chapter 03 <../notebooks/03_pytorch_to_te>`,
  {doc}`chapter 09 <../notebooks/09_end_to_end>`

**Which recipe?**

- Delayed scaling: cheapest, TE's default; an outlier saturates on the step it appears. →
  {doc}`chapter 02 <../notebooks/02_scaling_recipes>`
- Current scaling: adapts every step, at the cost of an extra amax pass. →
  {doc}`chapter 02 <../notebooks/02_scaling_recipes>`
- Block scaling: one scale per block, the best gradient signal-to-noise measured; slower
  on Hopper. → {doc}`chapter 02 <../notebooks/02_scaling_recipes>`
- E4M3 holds precision, E5M2 range; a scale per tensor moves each into range. →
  {doc}`chapter 01 <../notebooks/01_fp8_formats>`

**What to check before trusting a run**

- Accuracy: FP8's final loss against BF16's seed-to-seed band, paired over seeds, never
  against one BF16 run. → {doc}`chapter 02 <../notebooks/02_scaling_recipes>`,
  {doc}`chapter 09 <../notebooks/09_end_to_end>`
"""
_BOTTOM = """\
- Shapes: FP8 GEMMs need dimensions divisible by 16; pad vocabularies and features. →
  {doc}`chapter 03 <../notebooks/03_pytorch_to_te>`,
  {doc}`chapter 04 <../notebooks/04_performance_math>`
- Memory: FP8 weights save memory only where master weights and moments live elsewhere;
  FP8 autocast adds weight copies. → {doc}`chapter 06 <../notebooks/06_fp8_weights>`,
  {doc}`chapter 07 <../notebooks/07_memory>`
- Several GPUs: FP8 shortens compute but not the gradients DDP moves, which leaves less
  compute to hide them; measure both precisions' efficiency against a named baseline, and
  hide the traffic with more work per GPU and overlap. →
  {doc}`chapter 08 <../notebooks/08_parallelism>`
"""


def card_page() -> str:
    """The decision card's text, its two data-dependent lines computed."""
    from tools.workshop.pages import HEADER

    return (HEADER + _TOP + memory_bound_line() + "\n" + _MIDDLE + attention_line() + "\n"
            + _BOTTOM)
