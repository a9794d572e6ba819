"""Which checks of a launched case may fail, decided over every rank at once.

The checks of ``checks`` and ``entry_checks`` walk rank by rank and field by field and
word each finding: a DCP4 case took about 3,000 small device operations with them alone
(about 1,500 with this pass first), each about 15 us of host time on a GPU, for well under
a millisecond of GPU work (``benchmarks/harness_overhead.py``). Nearly every case passes,
and a passing case needs one bit per check. So :func:`suspect_checks` evaluates each
check's own failure predicate once per field over all ranks stacked, on the device, and
copies one flag per check to the host in a single transfer; the runner then runs a
check's detailed function only when its flag is set, and that function alone words the
findings (``case_checks.check_case``).

A flag is the detailed check's predicate, never a looser one: the same comparison
functions (``comparison.element_violations``, bitwise equality, the changed-bytes count of
``stray_writes``), applied to rows stacked from every rank. On a GPU the outputs'
tolerances are counted by one Triton kernel per field instead (``tolerance_kernel``: at
65,536 tokens the torch form was a fifth of a case's GPU time), which
``tests/test_tolerance_kernel.py`` holds to ``tolerances.out_of_tolerance`` count for
count. Every comparison is row by row, so stacking rows changes no verdict; where a
detailed check looks only at owned or real rows, the stacked form reads every row and
masks the others out. So a check reported clean here has no finding in its detailed
form; ``tests/test_fused_checks.py`` runs both on every mutant and regression and asserts
the same results.

``case.build_case`` lays every rank's outputs and caches side by side in one tensor per
buffer, so stacking the cache storages and the guarded output storages is a view
(:func:`stacked`), and an output's rows are read from its guarded storage. The buffers of
real ranks' launches, gathered from other processes, are stacked by copy.
"""

from __future__ import annotations

import torch

import reference
from dcpcheck.ops.fused_norm_rope import stray_writes, tolerances
from dcpcheck.ops.fused_norm_rope.cache_entries import (
    expected_index_rows,
    index_entry_parts,
    index_rows,
    mla_entry_parts,
)
from dcpcheck.ops.fused_norm_rope.case import (
    OUTPUT_GUARD_BYTE,
    OUTPUT_GUARD_ROWS,
    TOPK_SENTINEL,
    Case,
)
from dcpcheck.ops.fused_norm_rope.checks import OUTPUT_FIELDS
from dcpcheck.ops.fused_norm_rope.comparison import part_element_violations
from dcpcheck.ops.fused_norm_rope.entry_checks import mla_part_slack
from dcpcheck.ops.fused_norm_rope.guarded_cache import GUARD_BLOCKS

STRAY = "stray_writes"
"""The flag of ``checks.stray_write_checks`` and the output guard rows together: any byte
changed outside what the step owns (a guard band, a prefix, a padding or foreign entry)."""

FLAGS = ("outputs", "topk", "cache_owned", STRAY, "ranks_agree", "shards_reassemble")
"""The flags :func:`suspect_checks` decides, by check name (``STRAY`` for the stray-write
checks). ``inputs_unmodified`` is decided at launch (``checks.input_changes``)."""


def stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(tensors)``, as a view when they already lie side by side in one
    storage (equal shapes and strides, each starting where the one before ends) - as
    ``case.build_case`` lays out every rank's buffers - else as a copy."""
    first = tensors[0]
    step = first.numel()
    adjacent = first.is_contiguous() and all(
        t.shape == first.shape
        and t.dtype == first.dtype
        and t.is_contiguous()
        and t.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        and t.storage_offset() == first.storage_offset() + i * step
        for i, t in enumerate(tensors)
    )
    if not adjacent:
        return torch.stack(tensors)
    return first.as_strided((len(tensors), *first.shape), (step, *first.stride()))


def _byte_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``[..., W]`` as bytes, one row per leading index: ``[..., W * itemsize]``."""
    return x.contiguous().view(torch.uint8)


def _outputs_flag(
    case: Case, tokens: torch.Tensor, oracle: bool, rows_of: Case
) -> list[torch.Tensor]:
    """``check_outputs`` (or, oracle off, ``check_outputs_written``) of ``case``, over every
    rank of ``rows_of``: the case itself, or its DCP1 run where that holds the same bytes
    (``suspect_checks``). On a GPU each field's tolerance is one Triton kernel over the
    guarded storages (``tolerance_kernel``); elsewhere ``tolerances.out_of_tolerance``."""
    flags = []
    on_device = None  # ``tokens`` where the storages are, copied once for every field
    for field in OUTPUT_FIELDS:
        storages = _field_storages(rows_of, field)
        if storages is None:
            continue
        if not oracle:
            rows = storages[:, _token_rows(tokens)]
            flags.append(rows.isnan().any())  # poison or a computed NaN: either is a finding
            continue
        expected = getattr(case.expected, field)
        if expected is None:
            continue
        tolerance = tolerances.OUTPUT_TOLERANCES[field]
        if storages.is_cuda:
            from dcpcheck.ops.fused_norm_rope.tolerance_kernel import count_out_of_tolerance

            if on_device is None:
                on_device = tokens.to(storages.device)
            count = count_out_of_tolerance(
                storages, expected.to(storages.device), on_device, tolerance
            )
            flags.append(count > 0)
            continue
        rows = storages[:, _token_rows(tokens)]
        want = expected[tokens.to(expected.device)].repeat(rows.shape[0], 1)
        flags.append(tolerances.out_of_tolerance(rows.flatten(0, 1), want, tolerance).any())
    return flags


def launch_output_tolerances(case: Case) -> None:
    """Launch the outputs' tolerance kernels of ``case`` once, results dropped: what
    ``compile_ahead``'s dry pass calls, so that their binaries compile beside the kernel's
    (a dry launch only compiles)."""
    tokens = torch.arange(case.scenario.batch.num_tokens)
    _outputs_flag(case, tokens, oracle=True, rows_of=case)


def _field_storages(case: Case, field: str) -> torch.Tensor | None:
    """Every rank's output ``field`` ``[ranks, T, W]``, token ``t`` at row ``t``: a view
    of the guarded storages (each rank's output is a view of its own,
    ``RankLaunch.output_guards``, and they lie side by side), or None where the ranks
    were given no such output."""
    if field not in case.ranks[0].output_guards:
        return None
    guarded = [launch.output_guards[field] for launch in case.ranks]
    storage = stacked([output.storage for output in guarded])
    rows = slice(OUTPUT_GUARD_ROWS, storage.shape[1] - OUTPUT_GUARD_ROWS)
    return storage[:, rows, : guarded[0].width]


def _token_rows(tokens: torch.Tensor) -> slice | torch.Tensor:
    """``tokens`` (on the host, ascending) as an index: a slice where they are one run -
    every batch, since padding rows come last - so reading them is a view, not a gather."""
    if not tokens.numel():
        return slice(0, 0)
    first, last = int(tokens[0]), int(tokens[-1])
    if last - first + 1 == tokens.numel():
        return slice(first, last + 1)
    return tokens


def _topk_flag(case: Case, tokens: torch.Tensor) -> torch.Tensor:
    """``check_topk``: -1 on indexer layers, the sentinel untouched on shared ones."""
    want = -1 if case.scenario.has_indexer else TOPK_SENTINEL
    return (_field_storages(case, "topk_indices")[:, _token_rows(tokens)] != want).any()


def _ranks_agree_flag(case: Case, baseline: Case, tokens: torch.Tensor) -> torch.Tensor:
    """``check_ranks_agree``: every rank's rows bitwise equal to the DCP1 run's, compared
    as integers of the element's width (a NaN is its bits)."""
    flags = []
    index = _token_rows(tokens)
    for field in OUTPUT_FIELDS:
        storages = _field_storages(case, field)
        if storages is None:
            continue
        rows = tolerances.integer_view(storages[:, index])
        want = tolerances.integer_view(getattr(baseline.ranks[0].outputs, field)[index])
        flags.append((rows != want).any())
    return torch.stack(flags).any()


def _output_guards_flag(case: Case) -> torch.Tensor:
    """``case_checks.output_guard_findings``: a byte of any guard row, or of the columns
    beside an output in its own rows, no longer the guard byte."""
    flags = []
    for name in case.ranks[0].output_guards:
        guarded = [launch.output_guards[name] for launch in case.ranks]
        storage = _byte_rows(stacked([output.storage for output in guarded]))
        last = storage.shape[1] - OUTPUT_GUARD_ROWS
        guards = torch.cat([storage[:, :OUTPUT_GUARD_ROWS], storage[:, last:]], dim=1)
        width = guarded[0].width * guarded[0].storage.element_size()  # in bytes
        beside = storage[:, OUTPUT_GUARD_ROWS:last, width:]
        flags.append((guards != OUTPUT_GUARD_BYTE).any() | (beside != OUTPUT_GUARD_BYTE).any())
    return torch.stack(flags).any()


class _CacheRows:
    """One cache of every rank read at the ranks' own slots for every token: the rows
    ``cache_owned`` and ``shards_reassemble`` compare, read in one gather (an unowned
    token reads slot 0 and is masked out), and the changed-bytes count of the stray-write
    scan over every rank's storage."""

    def __init__(self, case: Case, field: str) -> None:
        launches = case.ranks
        scenario = case.scenario
        self.field = field
        self.index_dim = scenario.model.index_head_dim
        self.format = scenario.index_format
        caches = [launch.mla if field == "mla_cache" else launch.index for launch in launches]
        self.storage = stacked([c.storage for c in caches])  # [R, blocks + 2G, B, E]
        self.initial = stacked([c.initial for c in caches])
        self.gap = self.gap_initial = None  # [R, blocks + 2G, gap bytes], where blocks lie apart
        if caches[0].gap.numel():
            self.gap = stacked([c.gap for c in caches])
            self.gap_initial = stacked([c.gap_initial for c in caches])
        ranks, blocks, block_size, _ = self.storage.shape
        self.entries_per_rank = blocks * block_size
        mapping = [
            launch.inputs.slot_mapping if field == "mla_cache" else launch.inputs.index_slot_mapping
            for launch in launches
        ]
        self.profiling = mapping[0] is None
        device = self.storage.device
        if self.profiling:
            self.slots = torch.full((ranks, scenario.batch.num_tokens), -1, device=device)
        else:
            self.slots = stacked([m.to(device) for m in mapping]).long()  # [R, T]
        self.owned = self.slots >= 0
        # Slot s of rank r is entry (r * (blocks + 2G) + G) * B + s of every rank's entries.
        rank_base = torch.arange(ranks, device=device).unsqueeze(1) * self.entries_per_rank
        self.entry = torch.where(
            self.owned, self.slots + rank_base + GUARD_BLOCKS * block_size, 0
        )  # [R, T]

    def read(self, cache: torch.Tensor, entries: torch.Tensor, decode: bool = True):
        """Rows ``[K, E]`` of ``cache`` (``[R * (blocks + 2G), B, E]``) at ``entries``."""
        if self.field == "mla_cache":
            return reference.read_mla_cache(cache, entries)
        return index_rows(cache, entries, self.index_dim, self.format, decode_scales=decode)

    def rows(self, decode: bool = True) -> torch.Tensor:
        """Every rank's entry of every token, ``[R * T, E]`` (rank-major)."""
        return self.read(self.storage.flatten(0, 1), self.entry.flatten(), decode)

    def initial_rows(self) -> torch.Tensor:
        return self.read(self.initial.flatten(0, 1), self.entry.flatten(), decode=False)

    def stray_flag(self) -> torch.Tensor:
        """Any changed entry that no slot of the rank's mapping explains, or any changed
        byte between blocks."""
        changed = stray_writes.changed_bytes_per_entry(
            self.storage.flatten(0, 1),
            self.initial.flatten(0, 1),
            self.field,
            self.index_dim,
            self.format,
        )
        explained = torch.zeros_like(changed, dtype=torch.int32)
        explained.index_add_(0, self.entry.flatten(), self.owned.flatten().to(torch.int32))
        stray = ((changed > 0) & (explained == 0)).any()
        return stray if self.gap is None else stray | (self.gap != self.gap_initial).any()


def _caches(case: Case) -> list[_CacheRows]:
    caches = [_CacheRows(case, "mla_cache")]
    if case.ranks[0].index is not None:
        caches.append(_CacheRows(case, "index_cache"))
    return caches


def _cache_owned_flag(
    case: Case, cache: _CacheRows, rows: torch.Tensor, owned: torch.Tensor, oracle: bool
) -> list[torch.Tensor]:
    """``check_cache_owned`` (oracle off: ``check_cache_written``) of one cache: ``rows``
    ``[K, E]`` are every rank's entry of every token, rank-major (``_CacheRows.rows``), or
    one entry per token (``suspect_checks``: the DCP1 run's), and ``owned`` ``[K]`` masks
    the ones judged."""
    s, p = case.scenario, case.scenario.model
    ranks = rows.shape[0] // s.batch.num_tokens
    if cache.field == "mla_cache":
        parts = mla_entry_parts(s.cache_layout, p.kv_lora_rank, p.rope_dim, s.torch_dtype)
        expected = case.expected.mla_entries
        slack = mla_part_slack(s.cache_layout, case.expected.kv_fp32.repeat(ranks, 1))
    else:
        parts = index_entry_parts(p.index_head_dim)
        tokens = torch.arange(s.batch.num_tokens, device=case.expected.index_values.device)
        expected, slack = expected_index_rows(case, tokens), {}
    flags = []
    if not oracle:  # a part still equal to the random fill, as stored (scales undecoded)
        stored, initial = cache.rows(decode=False), cache.initial_rows()
        for part in parts:
            span = slice(part.start, part.stop)
            unwritten = (stored[:, span] == initial[:, span]).all(dim=1)
            flags.append((unwritten & owned).any())
        return flags
    expected = expected.repeat(ranks, 1).to(rows.device)
    for part in parts:
        bad, _ = part_element_violations(rows, expected, part, slack.get(part.name))
        flags.append((bad.any(dim=1) & owned).any())
    return flags


def _shards_flag(
    case: Case, baseline: Case, cache: _CacheRows, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``check_shards_reassemble`` of one cache: each real token's entry on its owner equals
    its DCP1 entry byte for byte. Also returns the DCP1 entries ``[T, E]`` it compared with
    (a padding row's is slot 0's, never judged)."""
    base = baseline.ranks[0]
    if cache.field == "mla_cache":
        base_cache, base_slots = base.mla.view, baseline.mappings.per_rank[0]
    else:
        base_cache, base_slots = base.index.view, baseline.index_mappings.per_rank[0]
    real = (case.mappings.owner >= 0).to(rows.device)
    base_slots = base_slots.to(base_cache.device)
    want = cache.read(base_cache, torch.where(real, base_slots, 0), decode=True)
    ranks = cache.slots.shape[0]
    differs = (rows != want.repeat(ranks, 1)).any(dim=1)
    return (differs & cache.owned.flatten() & real.repeat(ranks)).any(), want


def suspect_checks(case: Case, baseline: Case, oracle: bool = True) -> dict[str, bool]:
    """For each check of :data:`FLAGS` that applies to ``case``, whether it may fail: its
    predicate holds somewhere on some rank. One that may not has no finding. A check that
    does not apply (``ranks_agree`` at DCP1, a profiling call's ``cache_owned``) is left
    out: its detailed form says why it is skipped.

    At DCPn, rows that are byte for byte the DCP1 run's get the DCP1 run's verdict, so
    they are judged once, not once per rank: where ``ranks_agree`` is clear every rank's
    outputs are the DCP1 outputs, and where ``shards_reassemble`` is clear (oracle on, the
    entries compared as decoded) every owned entry is its token's DCP1 entry, and every
    real token is owned on some rank. Each costs one device-to-host copy of its flag and
    saves all but one rank's tolerance arithmetic, most of a large case's GPU time.
    """
    tokens = torch.nonzero(case.mappings.owner >= 0).flatten()
    flags: dict[str, list[torch.Tensor]] = {name: [] for name in FLAGS}
    flags["topk"] = [_topk_flag(case, tokens)]
    flags[STRAY] = [_output_guards_flag(case)]
    multi_rank = case.dcp_size > 1
    outputs_of = case
    if multi_rank:
        agree = _ranks_agree_flag(case, baseline, tokens)
        flags["ranks_agree"] = [agree]
        if not bool(agree):
            outputs_of = baseline
    flags["outputs"] = _outputs_flag(case, tokens, oracle, outputs_of)
    for cache in _caches(case):
        flags[STRAY].append(cache.stray_flag())
        if cache.profiling:
            continue  # no entry owned: cache_owned and shards_reassemble are skipped
        rows, owned = cache.rows(), cache.owned.flatten()
        if multi_rank:
            shards, dcp1_rows = _shards_flag(case, baseline, cache, rows)
            flags["shards_reassemble"].append(shards)
            if oracle and not bool(shards):
                rows, owned = dcp1_rows, cache.owned.any(dim=0)
        flags["cache_owned"] += _cache_owned_flag(case, cache, rows, owned, oracle)
    names = [name for name, found in flags.items() if found]
    raised = torch.stack([torch.stack(flags[name]).any() for name in names]).tolist()
    return dict(zip(names, raised, strict=True))
