"""Row normalizations of the fused op (docs/fused-norm-rope.md), in fp32.

Inputs of any float dtype are upcast to fp32 first and nothing is rounded here: the op
rounds its fp32 pipeline exactly once, on store, and that rounding belongs to the caller.

The inverse root is ``1 / sqrt(.)``, two correctly rounded IEEE operations, rather than
``torch.rsqrt``: CUDA's rsqrt is approximate (up to 2 fp32 ulps), so the oracle would
give different bits on the GPU than on the CPU. Written this way it is the same on both.
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last axis, in fp32.

    The mean of squares is over the row (no centering): this is the RMSNorm applied to
    ``q_c`` and ``kv_c``.
    """
    x32 = x.float()
    mean_square = x32.square().mean(dim=-1, keepdim=True)
    return x32 * (1.0 / torch.sqrt(mean_square + eps)) * weight.float()


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """``(x - mean) * rsqrt(var + eps) * weight + bias`` over the last axis, in fp32.

    ``var`` is the biased variance (divided by the row width, not width - 1), as in
    ``torch.nn.functional.layer_norm``; this is the indexer key's LayerNorm.
    """
    x32 = x.float()
    centered = x32 - x32.mean(dim=-1, keepdim=True)
    variance = centered.square().mean(dim=-1, keepdim=True)
    return centered * (1.0 / torch.sqrt(variance + eps)) * weight.float() + bias.float()
