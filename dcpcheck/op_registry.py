"""Every op dcpcheck judges, by the name ``--op``, scenario files (``op = "..."``) and
reports use. A scenario file without an ``op`` key is the fused op's."""

from __future__ import annotations

FUSED_NORM_ROPE = "fused-norm-rope"
SLOT_MAPPING = "slot-mapping"

OPS: dict[str, str] = {
    FUSED_NORM_ROPE: "fused MLA norm + RoPE + cache write (docs/fused-norm-rope.md)",
    SLOT_MAPPING: "per-rank slot mappings of every cache group (docs/dcp-contract.md)",
}
"""Name -> what the op is, as ``dcpcheck list ops`` prints it."""
