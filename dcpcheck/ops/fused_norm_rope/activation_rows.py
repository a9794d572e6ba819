"""How the op's activations lie in memory: each in rows of its own, or column slices of one row.

vLLM's callers never hand ``fused_norm_rope`` tensors of their own. ``q_c``, ``kv_c`` and
``k_pe`` are the ``split`` of one GEMM output ``[T, Q + KV + R]`` (``fused_qkv_a_proj``),
and ``index_k`` is the first ``I`` columns of the indexer's projection ``[T, I + H]``, its
``H`` per-head weights beside it (every release's ``deepseek_v32`` caller, and ROCm's). So
each input's row stride is the whole row's. The outputs the caller allocates are
``torch.empty_like`` of those inputs (``kv_c_out``, ``k_pe_out``, ``index_k_out``; and the
wrapper's own ``q_c_out``), which keeps a slice's strides where the slice counts as dense:
for one token a ``[1, W]`` slice does, so that output's row stride is the fused row's,
while for more tokens it is a compact ``[T, W]``.

A kernel that mixes an output's width with its row stride, or reads its inputs as compact,
is seen only on such buffers: a scenario's ``activation_rows = "fused"`` lays them out so.
Each output then lies in guarded rows as wide as its row stride (``case.GuardedOutput``),
so a write past its columns lands in bytes the guards check.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dcpcheck.ops.fused_norm_rope.contract import ModelPreset

ACTIVATION_ROWS = ("separate", "fused")
"""``separate``: every input and output is a compact tensor of its own; ``fused``: as vLLM's
callers lay them out (module docstring)."""

INDEXER_WEIGHT_COLUMNS = 64
"""Columns of per-head weights beside ``index_k`` in the indexer's projection: DeepSeek-V3.2's
indexer heads (``index_n_heads``), read by no kernel of this op."""

Group = tuple[tuple[tuple[str, str, int], ...], int]
"""One fused row: its (input field, output field, width) members in column order, and the
spare columns after them."""


def fused_groups(preset: ModelPreset) -> tuple[Group, ...]:
    """The fused rows of ``preset``'s activations: the A-projection's and the indexer's."""
    return (
        (
            (
                ("q_c", "q_out", preset.q_lora_rank),
                ("kv_c", "kv_out", preset.kv_lora_rank),
                ("k_pe", "kpe_out", preset.rope_dim),
            ),
            0,
        ),
        ((("index_k", "index_k_out", preset.index_head_dim),), INDEXER_WEIGHT_COLUMNS),
    )


def fuse_inputs(
    inputs: dict[str, torch.Tensor | None],
    preset: ModelPreset,
    spare_values: Callable[[int, int], torch.Tensor],
) -> dict[str, torch.Tensor]:
    """``inputs`` (by field, ``[T, W]`` each; ``None`` where absent) copied into their fused
    rows and returned as column slices of them. ``spare_values(T, columns)`` fills a row's
    spare columns (the indexer's weights), in the inputs' dtype."""
    fused = {}
    for members, spare in fused_groups(preset):
        parts = [inputs[name] for name, _, _ in members]
        if any(part is None for part in parts):
            continue
        first = parts[0]
        widths = [width for _, _, width in members]
        row = torch.empty(
            (first.shape[0], sum(widths) + spare), dtype=first.dtype, device=first.device
        )
        if spare:
            row[:, sum(widths) :] = spare_values(first.shape[0], spare).to(row)
        start = 0
        for (name, _, width), part in zip(members, parts, strict=True):
            fused[name] = row[:, start : start + width]
            fused[name].copy_(part)
            start += width
    return fused


def output_row_strides(preset: ModelPreset, tokens: int) -> dict[str, int]:
    """The row stride of each output (by ``FusedOpOutputs`` field) that ``torch.empty_like``
    of its fused input gives at ``tokens`` tokens: torch is asked, on a host tensor of the
    fused row's width (the meta device keeps no slice's strides, so it would answer
    differently) and of at most two rows, since whether a slice keeps its strides depends on
    whether it is dense, the same for every count of rows above one."""
    strides = {}
    for members, spare in fused_groups(preset):
        total = sum(width for _, _, width in members) + spare
        row = torch.empty((min(tokens, 2), total), dtype=torch.uint8)
        start = 0
        for _, output, width in members:
            strides[output] = torch.empty_like(row[:, start : start + width]).stride(0)
            start += width
    return strides
