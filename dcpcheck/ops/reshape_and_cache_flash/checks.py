"""The reshape-and-cache-flash op's contract, each check a small function over a launched
case that returns a ``CheckResult``:

* ``owned``: on each rank, every token its slot mapping gives a slot holds, at that slot,
  exactly the oracle's encoding of its key and value (``reference.reshape_and_cache_flash``),
  bit for bit: the write has no rounding of its own;
* ``stray``: every other byte of each rank's cache storage is as it was: nothing written
  for a token another rank stores or a padding row, nothing in a prefix's entries, in a
  block no table names, nor in the other of K and V where they share a tensor;
* ``reassembly``: the ranks' caches, read back position by position at the owner's slot
  (the position's owner and its local slot computed from the write side's definition, not
  from the rank's slot mapping), are the cache one rank storing everything (DCP1) holds;
* ``guard``: the inputs left as they were.

A finding names the cache (``key_cache``, ``value_cache``, ``cache``), the rank and the
tokens (batch rows) it concerns.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from dcpcheck.cases import op_checks
from dcpcheck.cases.op_checks import rows_finding
from dcpcheck.cases.verdicts import CheckResult, Finding
from dcpcheck.ops.reshape_and_cache_flash.case import (
    CacheWriteCase,
    empty_storage,
    launch_all,
    rank_slots,
)
from dcpcheck.ops.reshape_and_cache_flash.contract import CacheWriteInputs, CacheWriteKernel
from reference import reshape_and_cache_flash as oracle
from reference import slot_mapping as write_side

CHECKS = ("owned", "stray", "reassembly", "guard")
"""The checks of this module, in the order reports list them."""

INPUT_TENSORS = ("key", "value", "slot_mapping", "k_scale", "v_scale")
"""The tensors of a rank's inputs, which a launch must leave as they were."""

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def bits(storage: torch.Tensor) -> torch.Tensor:
    """``storage``'s elements as integers of their size (on the CPU): compared bit for bit."""
    return storage.cpu().view(_BITS[storage.element_size()])


def expected_storage(case: CacheWriteCase, inputs: CacheWriteInputs) -> torch.Tensor:
    """The oracle's cache storage of one rank after the write (poison elsewhere)."""
    before = empty_storage(case.batch, torch.device("cpu"))
    return oracle.write(
        before,
        case.batch.layout,
        inputs.key,
        inputs.value,
        inputs.slot_mapping,
        case.batch.kv_cache_dtype,
        inputs.k_scale,
        inputs.v_scale,
    )


def entry_elements(case: CacheWriteCase, slots: torch.Tensor, kind: str) -> torch.Tensor:
    """The flat storage indices of the ``kind`` (``key``/``value``) entry of each of
    ``slots`` (``[len(slots), kv_heads * head_size]``)."""
    batch = case.batch
    storage = empty_storage(batch, torch.device("cpu"))
    index = torch.arange(storage.numel(), dtype=torch.int64).view(storage.shape)
    views = oracle.kv_views(
        index, batch.layout, batch.kv_heads, batch.head_size, storage.element_size()
    )
    cache = views[0] if kind == "key" else views[1]
    table = oracle.entries(cache, batch.layout, kind)
    slots = slots.cpu().to(torch.int64)
    found = table[slots // batch.block_size, slots % batch.block_size]
    return found.reshape(len(slots), batch.kv_heads * batch.head_size)


def check_owned(case: CacheWriteCase) -> CheckResult:
    """Each rank's own tokens hold the oracle's entries (module docstring)."""
    findings = []
    for rank, inputs in enumerate(case.ranks):
        slots = inputs.slot_mapping.cpu()
        rows = (slots >= 0).nonzero().flatten()
        if not len(rows):
            continue
        got, want = (
            bits(case.storages[rank]).flatten(),
            bits(expected_storage(case, inputs)).flatten(),
        )
        for kind in ("key", "value"):
            at = entry_elements(case, slots[rows], kind)
            bad = rows[(got[at] != want[at]).any(dim=1)].tolist()
            if bad:
                unwritten = bool(
                    (bits(empty_storage(case.batch, torch.device("cpu"))).flatten()[at] == got[at])
                    .all(dim=1)
                    .any()
                )
                detail = "{count} token(s) of the rank hold another entry than the oracle's"
                if unwritten:
                    detail += " (some never written)"
                findings.append(rows_finding(f"{kind}_cache", rank, bad, detail))
    return CheckResult("owned", tuple(findings))


def check_stray(case: CacheWriteCase) -> CheckResult:
    """Nothing of any rank's cache changed but its own tokens' entries (module docstring)."""
    findings = []
    for rank, inputs in enumerate(case.ranks):
        slots = inputs.slot_mapping.cpu()
        own = slots[slots >= 0]
        outside = torch.ones(case.storages[rank].numel(), dtype=torch.bool)
        for kind in ("key", "value"):
            outside[entry_elements(case, own, kind).flatten()] = False
        got = bits(case.storages[rank]).flatten()
        poison = bits(empty_storage(case.batch, torch.device("cpu"))).flatten()
        written = int((outside & (got != poison)).sum())
        if written:
            foreign = (slots < 0).nonzero().flatten().tolist()
            detail = (
                f"{written} element(s) written outside the rank's own tokens' entries "
                f"({len(foreign)} token(s) of the step have no slot on this rank)"
            )
            findings.append(
                Finding(field="cache", rank=rank, detail=detail, count=written,
                        tokens=tuple(foreign))
            )  # fmt: skip
    return CheckResult("stray", tuple(findings))


def owners(case: CacheWriteCase) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's owner and its slot there (``-1`` for padding), from the write side's
    definition: the position's place in its virtual block of ``block_size * dcp_size``
    positions, dealt in runs of ``interleave``."""
    batch, size = case.batch, case.dcp_size
    real = case.positions >= 0
    pos = case.positions.clamp(min=0)
    virtual = batch.block_size * size
    offset = pos % virtual
    owner = write_side.owner_of(offset, size, batch.interleave)
    local = (offset // (size * batch.interleave)) * batch.interleave + offset % batch.interleave
    table = case.block_table.to(torch.int64)
    block = table[case.requests.clamp(min=0), pos // virtual] if len(table) else pos
    slot = block * batch.block_size + local
    return torch.where(real, owner, -1), torch.where(real, slot, -1)


def check_reassembly(case: CacheWriteCase) -> CheckResult:
    """The ranks' caches read back at the owners' slots are the DCP1 cache (module
    docstring)."""
    owner, slot = owners(case)
    rows = (owner >= 0).nonzero().flatten()
    if not len(rows):
        return CheckResult("reassembly")
    one = rank_slots(case.batch, case.block_table, 1, 0)
    dcp1 = replace(case, dcp_size=1, ranks=(replace(case.ranks[0], slot_mapping=one),))
    want = bits(expected_storage(dcp1, dcp1.ranks[0])).flatten()
    bad: set[int] = set()
    for kind in ("key", "value"):
        want_at = want[entry_elements(case, one[rows], kind)]
        for rank in range(case.dcp_size):
            mine = (owner[rows] == rank).nonzero().flatten()
            if not len(mine):
                continue
            got = bits(case.storages[rank]).flatten()[entry_elements(case, slot[rows][mine], kind)]
            differs = (got != want_at[mine]).any(dim=1)
            bad.update(rows[mine][differs].tolist())
    if not bad:
        return CheckResult("reassembly")
    detail = "{count} token(s) read back from their owner differ from the DCP1 cache"
    return CheckResult("reassembly", (rows_finding("cache", None, sorted(bad), detail),))


def check_guard(case: CacheWriteCase, before: tuple[CacheWriteInputs, ...]) -> CheckResult:
    """Every input as it was (``before``: copies)."""
    findings = []
    for rank, (inputs, kept) in enumerate(zip(case.ranks, before, strict=True)):
        findings.extend(op_checks.modified_inputs(rank, inputs, kept, INPUT_TENSORS))
    return CheckResult("guard", tuple(findings))


def check_launched(
    case: CacheWriteCase, before: tuple[CacheWriteInputs, ...]
) -> tuple[CheckResult, ...]:
    """Every check of the op on a launched case, in the order reports list them."""
    return (check_owned(case), check_stray(case), check_reassembly(case), check_guard(case, before))


LAUNCH_CHECKS: op_checks.LaunchChecks[CacheWriteKernel, CacheWriteCase] = op_checks.LaunchChecks(
    CHECKS, INPUT_TENSORS, launch_all, check_launched
)
"""How a case of the op is judged (``op_checks.LaunchChecks``)."""

snapshot = LAUNCH_CHECKS.snapshot
judge = LAUNCH_CHECKS.judge
skipped = LAUNCH_CHECKS.skipped
