"""The oracle: a pure-PyTorch reference of the fused MLA norm + RoPE + cache-write op.

Written from the math of DESIGN §2, never from a kernel, and importing only torch, so that
it shares no code (and no bug) with the kernels it judges. All math is fp32; outputs are
rounded once, to nearest even; cache encodings start from the fp32 values.
"""

from reference.cache_layouts import (
    DS_MLA_ENTRY_BYTES,
    LAYOUT_AUTO,
    LAYOUT_FP8,
    LAYOUT_FP8_DS_MLA,
    decode_index_entries,
    decode_mla_entries,
    encode_index_entries,
    encode_mla_entries,
)
from reference.fused_op import FusedReference, expected_caches, fused_norm_rope
from reference.norms import layer_norm, rms_norm
from reference.paged_cache import (
    read_index_cache,
    read_mla_cache,
    write_index_cache,
    write_mla_cache,
)
from reference.quant import (
    FP8_E4M3_MAX,
    ds_mla_tile_scale,
    fp8_e4m3_bytes,
    fp8_e4m3_values,
    ue8m0_scale,
)
from reference.rope import cos_sin_table, rope_interleaved, rope_neox

__all__ = [
    "DS_MLA_ENTRY_BYTES",
    "FP8_E4M3_MAX",
    "LAYOUT_AUTO",
    "LAYOUT_FP8",
    "LAYOUT_FP8_DS_MLA",
    "FusedReference",
    "cos_sin_table",
    "decode_index_entries",
    "decode_mla_entries",
    "ds_mla_tile_scale",
    "encode_index_entries",
    "encode_mla_entries",
    "expected_caches",
    "fp8_e4m3_bytes",
    "fp8_e4m3_values",
    "fused_norm_rope",
    "layer_norm",
    "read_index_cache",
    "read_mla_cache",
    "rms_norm",
    "rope_interleaved",
    "rope_neox",
    "ue8m0_scale",
    "write_index_cache",
    "write_mla_cache",
]
