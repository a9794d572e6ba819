"""The fused op's cache layouts with their bytes per token, as ``dcpcheck list layouts``
prints them: the MLA cache's at kv_lora_rank 512 and rope_dim 64 (the shape of every
preset; ``auto`` in bf16), then the indexer cache's formats (index head 128)."""

from __future__ import annotations

import torch

from dcpcheck.ops.fused_norm_rope.contract import (
    DS_MLA_NOPE_DIM,
    DS_MLA_ROPE_DIM,
    PRESETS,
    CacheLayout,
    IndexFormat,
    IndexScale,
    index_entry_bytes,
    mla_entry_bytes,
)

INDEX_HEAD_DIM = PRESETS["deepseek-v3.2"].index_head_dim
"""Every preset's indexer head: 128 fp8 values per token."""


def _layouts() -> dict[str, str]:
    layouts = {}
    for layout in CacheLayout:
        size = mla_entry_bytes(layout, DS_MLA_NOPE_DIM, DS_MLA_ROPE_DIM, torch.bfloat16)
        layouts[layout.value] = f"{size:4} bytes per token  MLA cache"
    index_bytes = index_entry_bytes(INDEX_HEAD_DIM)
    for fmt in (IndexFormat(s, scale) for s in (False, True) for scale in IndexScale):
        values = "16 x 16 tiles" if fmt.shuffled else "token-major"
        scale = "UE8M0 byte x4" if fmt.scale is IndexScale.MX else "fp32 scale"
        layouts[f"index:{fmt.name}"] = (
            f"{index_bytes:4} bytes per token  indexer cache (fp8 values {values}, {scale})"
        )
    return layouts


LAYOUTS: dict[str, str] = _layouts()
"""Each cache layout the op writes, by name, with its size and what it holds."""
