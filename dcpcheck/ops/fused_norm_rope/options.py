"""The fused op's part of the option table (``dcpcheck.cases.options``): the values its
records name as ``Fill`` (the property search's profiles, the fp8_ds_mla tile-scale
rules), and how its options' values become the fields of its configs (a profile).
``dcpcheck.cli.options`` reads them through the op's package."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dcpcheck.ops.fused_norm_rope import search
from dcpcheck.ops.fused_norm_rope.contract import DsMlaScale

FILLS: dict[str, Any] = {
    "profile_names": tuple(search.PROFILES),
    "profiles": "; ".join(f"{p.name}: {p.description}" for p in search.PROFILES.values()),
    "ds_mla_scales": tuple(rule.value for rule in DsMlaScale),
}
"""What the records of the fused op's options name as ``Fill`` or ``{key}``."""

CONVERT: dict[str, Callable[[Any], Any]] = {
    "profile": lambda name: search.PROFILES[name or "ci"],
}
"""Each of its options whose config field holds another type than the option's value."""
