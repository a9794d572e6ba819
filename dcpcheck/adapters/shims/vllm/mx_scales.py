"""Stand-in for the indexer cache's MX-packed scales (vLLM 0.33.0):
``mqa_logits_use_mx_scales`` (``vllm.utils.deep_gemm``) and ``pack_ue8m0_x4``
(``vllm.v1.attention.ops.common``).

**MX-packed indexer scales: off.** vLLM stores each indexer row's power-of-two scale as
packed UE8M0 exponent bytes instead of an fp32 only where its MQA-logits reader wants
them, which its own query answers true for on SM100-family GPUs alone. The H200
(SM90) and the CPU are not, so on every machine dcpcheck runs the release on, the answer
the release itself would give is False, and the kernel writes fp32 scales (the layout
the harness's oracle checks).

Because the switch is off, the kernel compiles no call to the packer; the stand-in packer
fails the compile outright if one ever is, instead of writing bytes nobody checks.
"""

from __future__ import annotations

import triton
import triton.language as tl


def mqa_logits_use_mx_scales() -> bool:
    """False: see the module docstring (true in vLLM only on SM100-family GPUs)."""
    return False


@triton.jit
def pack_ue8m0_x4(scale):
    tl.static_assert(
        False,
        "dcpcheck's stand-in: MX-packed indexer scales are off (mqa_logits_use_mx_scales)",
    )
    return scale
