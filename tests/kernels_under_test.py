"""Purpose-built kernels for testing the harness itself.

``oracle_kernel`` follows the kernel protocol using the PyTorch oracle, so harness tests
run fast on the CPU without Triton's interpreter. Each broken kernel wraps it and
violates exactly one contract item, the way a real kernel bug would.
"""

from __future__ import annotations

import torch

import reference
from dcpcheck.case import oracle_for
from dcpcheck.contract import FusedOpCaches, FusedOpInputs, FusedOpOutputs


def oracle_kernel(inputs: FusedOpInputs, outputs: FusedOpOutputs, caches: FusedOpCaches) -> None:
    """A correct kernel built from the oracle."""
    ref = oracle_for(inputs)
    outputs.q_out.copy_(ref.q_out)
    outputs.kv_out.copy_(ref.kv_out)
    outputs.kpe_out.copy_(ref.kpe_out)
    if inputs.index_k is not None:
        outputs.index_k_out.copy_(ref.index_k_out)
        outputs.topk_indices.fill_(-1)
    mla, index = reference.expected_caches(
        caches.mla, caches.index, inputs.slot_mapping, inputs.index_slot_mapping, ref
    )
    caches.mla.copy_(mla)
    if caches.index is not None:
        caches.index.copy_(index)


def _first_foreign(inputs: FusedOpInputs) -> int | None:
    if inputs.slot_mapping is None:
        return None
    foreign = torch.nonzero(inputs.slot_mapping < 0).flatten()
    return int(foreign[0]) if len(foreign) else None


def _unused_slot(inputs: FusedOpInputs, caches: FusedOpCaches, avoid: torch.Tensor) -> int:
    """The last slot of the cache that no token of this launch and no prefix entry uses."""
    used = set(inputs.slot_mapping.tolist()) | set(avoid.tolist())
    total = caches.mla.shape[0] * caches.mla.shape[1]
    return next(s for s in range(total - 1, -1, -1) if s not in used)


def writes_foreign_token(inputs, outputs, caches) -> None:
    """Ownership test missing: a token without a local slot is written to a free slot."""
    oracle_kernel(inputs, outputs, caches)
    token = _first_foreign(inputs)
    if token is None or inputs.q_c.shape[0] < 2:
        return
    # the block's last free slot (prefix slots are never free in the scenarios used)
    slot = _unused_slot(inputs, caches, torch.empty(0, dtype=torch.int64))
    entries = oracle_for(inputs).mla_entries[token : token + 1]
    caches.mla.view(-1, caches.mla.shape[2])[slot] = entries[0]


def writes_guard_block(inputs, outputs, caches) -> None:
    """Off-by-one past the end: one byte after the cache's last entry."""
    oracle_kernel(inputs, outputs, caches)
    past_end = torch.as_strided(
        caches.mla, (1,), (1,), caches.mla.storage_offset() + caches.mla.numel()
    )
    past_end.add_(1)


_calls = {"count": 0}


def one_rank_differs(inputs, outputs, caches) -> None:
    """Rank-dependent result within tolerance: the 3rd launch nudges one q value by 1 ulp.

    Launch order is the DCP1 baseline, then ranks 0..n-1, so this hits rank 1 of DCPn.
    """
    oracle_kernel(inputs, outputs, caches)
    _calls["count"] += 1
    if _calls["count"] == 3:
        bits = outputs.q_out[0, :1].view(torch.int16)
        bits.add_(1)


def reset_call_count() -> None:
    _calls["count"] = 0


def writes_padding_row(inputs, outputs, caches) -> None:
    """Padding rows (the last rows, slot -1 on every rank) written to a free slot."""
    oracle_kernel(inputs, outputs, caches)
    if inputs.slot_mapping is None:
        return
    token = inputs.q_c.shape[0] - 1
    slot = _unused_slot(inputs, caches, torch.empty(0, dtype=torch.int64))
    caches.mla.view(-1, caches.mla.shape[2])[slot] = oracle_for(inputs).mla_entries[token]


def overwrites_prefix(inputs, outputs, caches) -> None:
    """Rewrites slot 0, a cached-prefix entry in the scenarios used, with new data."""
    oracle_kernel(inputs, outputs, caches)
    caches.mla.view(-1, caches.mla.shape[2])[0] = oracle_for(inputs).mla_entries[0]


def modifies_input(inputs, outputs, caches) -> None:
    """Normalizes kv_c in place (a fused kernel reusing its input as scratch)."""
    oracle_kernel(inputs, outputs, caches)
    inputs.kv_c[0].zero_()


def skips_foreign_kv(inputs, outputs, caches) -> None:
    """The PR-54908 flaw in Python: kv/kpe outputs left unwritten without a local slot."""
    kv_before, kpe_before = outputs.kv_out.clone(), outputs.kpe_out.clone()
    oracle_kernel(inputs, outputs, caches)
    if inputs.slot_mapping is not None:
        foreign = inputs.slot_mapping < 0
        outputs.kv_out[foreign] = kv_before[foreign]
        outputs.kpe_out[foreign] = kpe_before[foreign]


def raises(inputs, outputs, caches) -> None:
    raise RuntimeError("kernel exploded")
