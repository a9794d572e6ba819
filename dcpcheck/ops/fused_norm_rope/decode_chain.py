"""The fused op's stage in the tiny model's decode path (``dcpcheck.ops.decode_stages``): the
cache write of every layer, whose kernel is the one ``dcpcheck hash --kernel`` judges.

The model's layers have no indexer (a shared layer's call), so the kernel writes the MLA
cache alone; its top-k buffer is filled with -1 and never read.
"""

from __future__ import annotations

import torch

from dcpcheck.ops.decode_stages import CACHE_WRITE, CacheWrite, CacheWriteStage, Written
from dcpcheck.ops.fused_norm_rope.contract import (
    PRESETS,
    CacheLayout,
    FusedOpCaches,
    FusedOpInputs,
    FusedOpOutputs,
    Kernel,
)


def write(kernel: Kernel, step: CacheWrite) -> Written:
    """Run ``kernel`` on one rank's ``step``; its outputs start as NaN (``Written``)."""
    inputs = FusedOpInputs(
        q_c=step.q_c,
        q_weight=step.q_weight,
        kv_c=step.kv_c,
        kv_weight=step.kv_weight,
        k_pe=step.k_pe,
        positions=step.positions,
        cos_sin=step.cos_sin,
        eps=step.eps,
        block_size=step.block_size,
        cache_layout=CacheLayout(step.layout),
        mla_scale=step.mla_scale,
        slot_mapping=step.slot_mapping,
    )
    tokens, dtype, device = step.q_c.shape[0], step.q_c.dtype, step.q_c.device

    def poisoned(width: int) -> torch.Tensor:
        return torch.full((tokens, width), float("nan"), dtype=dtype, device=device)

    outputs = FusedOpOutputs(
        q_out=poisoned(step.q_c.shape[1]),
        kv_out=poisoned(step.kv_c.shape[1]),
        kpe_out=poisoned(step.k_pe.shape[1]),
        topk_indices=torch.full((tokens, step.topk), -1, dtype=torch.int32, device=device),
    )
    kernel(inputs, outputs, FusedOpCaches(mla=step.cache))
    return Written(outputs.q_out, outputs.kv_out, outputs.kpe_out)


STAGES = {CACHE_WRITE: CacheWriteStage(presets=PRESETS, write=write)}
"""The stage the op plays, by name (``dcpcheck.op_registry.DECODE_CHAIN``)."""
