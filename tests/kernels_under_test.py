"""Purpose-built kernels for testing the harness itself.

``oracle_kernel`` follows the kernel protocol using the PyTorch oracle, so harness tests
run fast on the CPU without Triton's interpreter. Each broken kernel wraps it and
violates exactly one contract item, the way a real kernel bug would.
"""

from __future__ import annotations

import dataclasses
import math
import random

import torch

import reference
from dcpcheck.ops.fused_norm_rope.case import oracle_for
from dcpcheck.ops.fused_norm_rope.contract import (
    DS_MLA_NOPE_DIM,
    DS_MLA_TILE,
    CacheLayout,
    FusedOpCaches,
    FusedOpInputs,
    FusedOpOutputs,
)
from dcpcheck.ops.lse_combine.contract import AttentionInputs, CombineInputs, Merged
from dcpcheck.ops.slot_mapping.contract import LocalSeqLensInputs, Routines, SlotMappingInputs
from reference import lse_combine, slot_mapping


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
        caches.mla,
        caches.index,
        inputs.slot_mapping,
        inputs.index_slot_mapping,
        ref,
        index_shuffled=inputs.index_format.shuffled,
        index_scale_format=inputs.index_format.scale.value,
    )
    caches.mla.copy_(mla)
    if caches.index is not None:
        caches.index.copy_(index)


def _as_if_contiguous(cache: torch.Tensor) -> torch.Tensor:
    """``cache`` addressed as a kernel that ignores ``stride(0)`` addresses it: block ``b``
    at ``b * block_size * entry`` bytes from the start."""
    _, block_size, entry = cache.shape
    return cache.as_strided(cache.shape, (block_size * entry, entry, 1))


def mla_blocks_as_if_contiguous(inputs, outputs, caches) -> None:
    oracle_kernel(inputs, outputs, dataclasses.replace(caches, mla=_as_if_contiguous(caches.mla)))


def index_blocks_as_if_contiguous(inputs, outputs, caches) -> None:
    index = None if caches.index is None else _as_if_contiguous(caches.index)
    oracle_kernel(inputs, outputs, dataclasses.replace(caches, index=index))


def writes_between_blocks(inputs, outputs, caches) -> None:
    """Correct, and where the MLA cache's blocks lie apart, one byte flipped in the gap
    after its first block."""
    oracle_kernel(inputs, outputs, caches)
    blocks, block_size, entry = caches.mla.shape
    rows = caches.mla.as_strided((blocks, caches.mla.stride(0)), (caches.mla.stride(0), 1))
    if rows.shape[1] > block_size * entry:
        rows[0, block_size * entry] ^= 0xFF


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
    """Rank-dependent result within tolerance: the rank that owns token 0 of a split launch
    (more foreign rows than the scenario's 2 padding rows) nudges one q value by 1 ulp.

    In test_checks' scenario (interleave 1) that is rank 1 of DCP4; the DCP1 launch owns
    every real token and is left alone, and the same launch always does the same.
    """
    oracle_kernel(inputs, outputs, caches)
    slots = inputs.slot_mapping
    if slots is not None and slots[0] >= 0 and int((slots < 0).sum()) > 2:
        bits = outputs.q_out[0, :1].view(torch.int16)
        bits.add_(1)


def flaky_q_out(inputs, outputs, caches) -> None:
    """Not deterministic: every other call nudges one q value by 1 ulp (the same launch
    leaves different bytes on its first and second run)."""
    oracle_kernel(inputs, outputs, caches)
    _calls["count"] += 1
    if _calls["count"] % 2 == 0:
        bits = outputs.q_out[0, :1].view(torch.int16)
        bits.add_(1)


class OneInTen:
    """A flaky kernel: about one call in ten moves one ``q_out`` element by one
    ulp. Its draws come from its own generator, seeded per try, so a test's tries are
    repeatable while the kernel stays as unpredictable to dcpcheck as a real race."""

    def __init__(self, seed: int | None) -> None:
        self.draws = random.Random(seed)  # None: seeded by the OS, a new sequence per process

    def __call__(self, inputs, outputs, caches) -> None:
        oracle_kernel(inputs, outputs, caches)
        if self.draws.random() < 0.1 and outputs.q_out.numel():
            outputs.q_out.view(-1)[:1].view(torch.int16).add_(1)


one_in_ten = OneInTen(None)
"""The same kernel as ``--kernel tests.kernels_under_test:one_in_ten`` takes it: its
nudges differ in every process (``benchmarks/one_in_ten_tries.sh``)."""


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


def _owned_entry_rows(inputs: FusedOpInputs, caches: FusedOpCaches) -> torch.Tensor:
    """Flat indices, into ``caches.mla`` viewed as ``[slots, E]``, of the entries this launch
    owns (none on a profiling call)."""
    if inputs.slot_mapping is None:
        return torch.empty(0, dtype=torch.int64)
    return inputs.slot_mapping[inputs.slot_mapping >= 0].long()


def _doubled_scales(entries: torch.Tensor) -> torch.Tensor:
    """fp8_ds_mla entries ``[K, E]`` re-encoded with every tile scale doubled and the NoPE
    values halved to match (``value * scale`` unchanged up to fp8 rounding)."""
    entries = entries.clone()
    scales_end = DS_MLA_NOPE_DIM + 4 * (DS_MLA_NOPE_DIM // DS_MLA_TILE)
    nope = entries[:, :DS_MLA_NOPE_DIM].contiguous().view(torch.float8_e4m3fn).float()
    scales = entries[:, DS_MLA_NOPE_DIM:scales_end].contiguous().view(torch.float32)
    entries[:, :DS_MLA_NOPE_DIM] = (nope / 2).to(torch.float8_e4m3fn).view(torch.uint8)
    entries[:, DS_MLA_NOPE_DIM:scales_end] = (scales * 2).view(torch.uint8)
    return entries


def doubles_ds_mla_scales(inputs, outputs, caches) -> None:
    """A different but self-consistent fp8_ds_mla encoding, as a new cache-scale rule would
    be (``_doubled_scales``). Deterministic and ownership-blind, so it agrees with its own
    DCP1 run everywhere, yet no oracle variant writes it."""
    oracle_kernel(inputs, outputs, caches)
    rows = _owned_entry_rows(inputs, caches)
    flat = caches.mla.view(-1, caches.mla.shape[2])
    flat[rows] = _doubled_scales(flat[rows])


OUTPUT_SHIFT_ULPS = 2
"""How far ``shifts_q_out`` moves every q_out value: past the oracle's 1-ulp tolerance."""


def shifts_q_out(inputs, outputs, caches) -> None:
    """Outputs consistently off the oracle by ``OUTPUT_SHIFT_ULPS`` on every rank and row (a
    different rounding or epsilon, say): identical across ranks and DCP sizes."""
    oracle_kernel(inputs, outputs, caches)
    bits = outputs.q_out.view(torch.int16)
    bits.add_(OUTPUT_SHIFT_ULPS)


def doubles_ds_mla_scales_and_writes_foreign(inputs, outputs, caches) -> None:
    """``doubles_ds_mla_scales`` plus the foreign write of ``writes_foreign_token``, in the
    kernel's own encoding: the oracle's encodings do not recognise the entry it writes,
    the kernel's DCP1 run does."""
    doubles_ds_mla_scales(inputs, outputs, caches)
    token = _first_foreign(inputs)
    if token is None or inputs.q_c.shape[0] < 2:
        return
    slot = _unused_slot(inputs, caches, torch.empty(0, dtype=torch.int64))
    entry = _doubled_scales(oracle_for(inputs).mla_entries[token : token + 1])
    caches.mla.view(-1, caches.mla.shape[2])[slot] = entry[0]


def skips_q_out_row_zero(inputs, outputs, caches) -> None:
    """Leaves q_out's first row unwritten on every launch, DCP1 included: the ranks agree
    (every rank's row is the same poison), so only the poison itself shows it."""
    saved = outputs.q_out[0].clone()
    oracle_kernel(inputs, outputs, caches)
    outputs.q_out[0] = saved


def skips_first_owned_entry(inputs, outputs, caches) -> None:
    """Leaves the first entry it owns as it found it (an off-by-one in the store loop),
    on every launch, DCP1 included."""
    rows = _owned_entry_rows(inputs, caches)
    if not len(rows):
        oracle_kernel(inputs, outputs, caches)
        return
    flat = caches.mla.view(-1, caches.mla.shape[2])
    saved = flat[rows[0]].clone()
    oracle_kernel(inputs, outputs, caches)
    flat[rows[0]] = saved


class NoFp4Here:
    """An adapter whose kernel cannot run nvfp4_ds_mla cases on this machine (as vLLM's
    releases cannot on an H200): those cases are ``not_applicable``, the rest run."""

    name = "no-fp4-here"
    REASON = "not applicable on this GPU: no e2m1 conversion instruction"

    def __call__(self, inputs, outputs, caches) -> None:
        assert inputs.cache_layout is not CacheLayout.NVFP4_DS_MLA, "launched anyway"
        oracle_kernel(inputs, outputs, caches)

    def limitations(self, inputs):
        return ()

    def not_applicable(self, inputs):
        return self.REASON if inputs.cache_layout is CacheLayout.NVFP4_DS_MLA else None


no_fp4_here = NoFp4Here()


def zeroes_every_output(inputs, outputs, caches) -> None:
    """Correct caches, every output row written as zeros (``q_out`` included): the same
    wrong answer at every DCP size, which only the oracle can see."""
    oracle_kernel(inputs, outputs, caches)
    for out in (outputs.q_out, outputs.kv_out, outputs.kpe_out, outputs.index_k_out):
        if out is not None:
            out.zero_()


# -- the decode chain's other stages, in torch ---------------------------------------------


def torch_attention(inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode attention protocol (``contract.AttentionInputs``) in fp32 torch ops, every
    row at once: what the token-stream tests about the fused op run instead of the
    project's Triton attention, which the interpreter runs a hundred times slower. An empty
    shard gives zeros and an LSE of -inf."""
    blocks, page, width = inputs.kv_cache.shape
    local = torch.arange(inputs.block_table.shape[1] * page, device=inputs.q.device)
    pages = inputs.block_table.long().clamp(min=0)[:, local // page]
    entries = inputs.kv_cache.reshape(blocks * page, width).float()[pages * page + local % page]
    seen = local[None, :] < inputs.seq_lens.long()[:, None]
    entries = torch.where(seen[..., None], entries, 0.0)  # unread entries may hold NaN
    logits = torch.einsum("bhl,bnl->bhn", inputs.q.float(), entries) * inputs.scale
    logits = logits.masked_fill(~seen[:, None, :], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    weights = torch.exp(logits - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("bhn,bnr->bhr", weights, entries[..., : inputs.kv_lora_rank])
    return out, lse


def torch_merge(inputs: CombineInputs) -> Merged:
    """The merge protocol (``contract.CombineInputs``) over the group's all-gather: the
    oracle's merge (``reference.lse_combine.merge``) of the ranks' partials, an empty
    shard's (by the lengths, or by a non-finite LSE) given no weight, the rank's heads
    returned."""
    lse = inputs.partial_lse.float()
    if inputs.seq_lens is not None:
        lse = lse.masked_fill((inputs.seq_lens == 0)[:, None], float("-inf"))
    lse = torch.where(torch.isfinite(lse), lse, float("-inf"))
    if not inputs.base_e:
        lse = lse * math.log(2)
    group = inputs.group
    outs = group.all_gather(inputs.partial_out.unsqueeze(0), dim=0)
    merged, _ = lse_combine.merge(outs, group.all_gather(lse.unsqueeze(0), dim=0))
    share = merged.shape[1] // group.world_size
    heads = slice(group.rank_in_group * share, (group.rank_in_group + 1) * share)
    return Merged(merged[:, heads].to(inputs.partial_out.dtype))


def torch_slot_mappings(inputs: SlotMappingInputs, slot_mappings: torch.Tensor) -> None:
    """The slot-mapping protocol (``contract.SlotMappingInputs``) by its definition,
    ``reference.slot_mapping``, on the host: every row of every group at once."""
    if inputs.kernel_block_sizes:
        raise ValueError("torch_slot_mappings takes no kernel block sizes")
    slot_mappings.copy_(
        slot_mapping.slot_mappings(
            inputs.query_start_loc, inputs.positions, inputs.idx_mapping, inputs.block_tables,
            list(inputs.block_sizes), list(inputs.sharded), inputs.dcp_size, inputs.dcp_rank,
            inputs.interleave, slot_mappings.shape[1],
        )
    )  # fmt: skip


def torch_local_seq_lens(inputs: LocalSeqLensInputs, local_seq_lens: torch.Tensor) -> None:
    """The local lengths protocol by ``reference.slot_mapping.local_seq_lens``."""
    local_seq_lens.copy_(
        slot_mapping.local_seq_lens(
            inputs.seq_lens, inputs.dcp_size, inputs.dcp_rank, inputs.interleave
        )
    )


def fast_stages():
    """``torch_slot_mappings``, ``torch_attention`` and ``torch_merge``: the decode chain
    at the speed of torch (the interpreter runs the project's Triton stages a hundred
    times slower), for tests whose subject is the cache write's stage."""
    from dcpcheck.e2e.chain import Stages
    from dcpcheck.ops.decode_stages import Stage

    here = "tests.kernels_under_test"
    return Stages(
        slot_mapping=Stage(
            "slot-mapping", f"{here}:torch_slot_mappings",
            Routines(torch_slot_mappings, torch_local_seq_lens),
        ),
        attention=Stage("attention", f"{here}:torch_attention", torch_attention),
        merge=Stage("merge", f"{here}:torch_merge", torch_merge),
    )  # fmt: skip


def writes_kv_out_across_its_row_stride(inputs, outputs, caches) -> None:
    """Correct, then ``kv_out``'s first row stored again ``stride(0)`` elements wide: a
    kernel that takes an output's row stride for its width. Where the rows are compact the
    two agree and nothing more is written."""
    oracle_kernel(inputs, outputs, caches)
    kv = outputs.kv_out
    row = kv.as_strided((kv.stride(0),), (1,))
    row[kv.shape[1] :] = 0


def reads_kv_c_as_compact(inputs, outputs, caches) -> None:
    """``kv_c`` read as if its rows were ``kv_lora_rank`` apart: a kernel that ignores an
    input's row stride. Right only where the input is compact (or one row)."""
    kv = inputs.kv_c
    compact = kv.as_strided(kv.shape, (kv.shape[1], 1))
    oracle_kernel(dataclasses.replace(inputs, kv_c=compact), outputs, caches)
