"""Stand-in for the indexer cache's MX-packed scales (vLLM 0.33.0):
``mqa_logits_use_mx_scales`` (``vllm.utils.deep_gemm``) and ``pack_ue8m0_x4``
(``vllm.v1.attention.ops.common``).

vLLM stores each indexer row's power-of-two scale as its UE8M0 exponent byte in all four
scale bytes instead of as an fp32 where its MQA-logits reader wants that, and asks
``mqa_logits_use_mx_scales()`` (in vLLM: true on SM100-family GPUs only) whether it does.
The question is about the reader, not about what the writer can do: the kernel's MX path
is integer arithmetic that runs anywhere. So here the answer is the case's: the vLLM
adapter sets :data:`MX_SCALES_WANTED` while it calls a release for a case whose indexer
format is MX (``contract.IndexScale.MX``), and it is False otherwise, as vLLM's own
answer is on the H200 and the CPU.

``pack_ue8m0_x4`` is written here from the format's definition (a power-of-two fp32's
biased exponent field is its UE8M0 byte; the word holds it four times).
"""

from __future__ import annotations

import triton
import triton.language as tl

from dcpcheck.adapters.shims.vllm.mx_switch import MX_SCALES_WANTED


def mqa_logits_use_mx_scales() -> bool:
    """The case's answer (:data:`MX_SCALES_WANTED`; module docstring)."""
    return MX_SCALES_WANTED.get()


@triton.jit
def pack_ue8m0_x4(scale):
    """A power-of-two fp32 ``scale`` as the int32 word holding its UE8M0 byte four times."""
    exponent = (scale.to(tl.int32, bitcast=True) >> 23) & 0xFF
    return exponent | (exponent << 8) | (exponent << 16) | (exponent << 24)
