"""Read agrees with write, end to end: the bytes a sparse attention reads on each rank for
each token it picks are the bytes that token's owner wrote for it.

One case of the fused op (a scenario of ``scenarios/fused-norm-rope/``, at one DCP size)
is built and its kernel (the writer) launched on every rank, so every rank's MLA cache
holds what that kernel wrote for the tokens it owns, beside the cached prefix the harness
wrote there.
Then every new token of the batch is a query row that picks up to ``topk`` positions of
its request it can see (its own included), drawn from the seed; each rank's remap kernel
(the reader) turns the picks into its slots with the rank's block table, packed or in
place, and the attention's reads are played: with counts, the first ``count`` entries of
each row (what a kernel that takes the counts reads), else every entry that is not ``-1``.
Each slot read is traced back through the rank's block table to the position it holds
(``checks``' ``partition`` does the same), which must be a pick of the row, and the entry
there must be that token's: for a prefix token the one the harness wrote
(``case.prefix_mla_entries``), for a new token the oracle's encoding
(``reference.FusedReference.mla_entries``) within the fused op's tolerance of an owned
entry (``entry_checks``: the writer's rounding may differ by a step, another token's
entry differs by far more). Every pick must be read on some rank. So a reader that looks
in the wrong place and a writer that wrote an owned token somewhere else both fail, on
the rows whose picks they moved.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import torch

from dcpcheck.cases import op_checks
from dcpcheck.cases.dcp import NO_OWNER
from dcpcheck.cases.verdicts import CheckResult, Finding
from dcpcheck.ops import op_cases
from dcpcheck.ops.fused_norm_rope import runner as fused_runner
from dcpcheck.ops.fused_norm_rope.cache_entries import mla_entry_parts
from dcpcheck.ops.fused_norm_rope.case import Case, build_case, prefix_mla_entries
from dcpcheck.ops.fused_norm_rope.comparison import part_violations
from dcpcheck.ops.fused_norm_rope.entry_checks import mla_part_slack
from dcpcheck.ops.fused_norm_rope.scenario import Scenario
from dcpcheck.ops.sparse_topk_remap.checks import ReadBack
from dcpcheck.ops.sparse_topk_remap.contract import NO_SLOT, RemapInputs, RemapKernel

CHECK = "read_write"


def _tables(case: Case) -> torch.Tensor:
    """The case's block tables as one ``[requests, width]`` int32 matrix (-1 past a
    request's own blocks, which no pick of the request reaches, and which is no block: a
    slot is traced back to the one column that holds its block)."""
    tables = case.scenario.block_tables(case.dcp_size)
    width = max(len(table) for table in tables)
    return torch.tensor([list(t) + [-1] * (width - len(t)) for t in tables], dtype=torch.int32)


def _picks(case: Case, topk: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each real new token's request and picks (module docstring): ``[rows]`` and
    ``[rows, topk]`` int32, ``-1`` past what the token can see."""
    mappings = case.mappings
    real = (mappings.owner != NO_OWNER).nonzero().flatten().tolist()
    shuffle = random.Random(seed)
    requests, picks = [], []
    for token in real:
        seen = int(mappings.positions[token]) + 1
        chosen = shuffle.sample(range(seen), min(seen, topk))
        picks.append(chosen + [NO_SLOT] * (topk - len(chosen)))
        requests.append(int(mappings.request_index[token]))
    return torch.tensor(requests, dtype=torch.int32), torch.tensor(picks, dtype=torch.int32)


def _written(case: Case) -> tuple[dict[tuple[int, int], int], torch.Tensor, torch.Tensor]:
    """The entry each token of the batch must hold and its unrounded KV, as rows of two
    tensors (``[tokens, entry bytes]`` uint8, ``[tokens, kv]`` fp32), and the row of each
    token by (request, position): the prefix first, then the new tokens."""
    mappings, act = case.mappings, case.activations
    prefix = (mappings.prefix_request_index.tolist(), mappings.prefix_positions.tolist())
    keys = list(zip(*prefix, strict=True))
    entries = [prefix_mla_entries(case.scenario, act).cpu()]
    kv = [act.prefix_kv.float().cpu()]
    new = (mappings.owner != NO_OWNER).nonzero().flatten()
    keys += list(
        zip(mappings.request_index[new].tolist(), mappings.positions[new].tolist(), strict=True)
    )
    entries.append(case.expected.mla_entries.cpu()[new])
    kv.append(case.expected.kv_fp32.cpu()[new])
    row_of = {(int(r), int(p)): row for row, (r, p) in enumerate(keys)}
    return row_of, torch.cat(entries), torch.cat(kv)


def _wrong_entries(
    scenario: Scenario, actual: torch.Tensor, expected: torch.Tensor, kv_fp32: torch.Tensor
) -> torch.Tensor:
    """Which of the read entries ``actual`` (``[K, E]``) are not ``expected`` within the
    fused op's tolerance of an owned entry, part by part (``[K]`` bool)."""
    preset = scenario.model
    parts = mla_entry_parts(
        scenario.cache_layout, preset.kv_lora_rank, preset.rope_dim, scenario.torch_dtype
    )
    slack = mla_part_slack(scenario.cache_layout, kv_fp32)
    wrong = torch.zeros(actual.shape[0], dtype=torch.bool)
    for part in parts:
        bad, _ = part_violations(actual, expected, part, slack.get(part.name))
        wrong |= bad.cpu()
    return wrong


def _finding(rank: int | None, rows: list[int], detail: str) -> Finding:
    """A finding in the MLA cache over ``rows`` (any order, repeats), ``detail`` after
    their count."""
    return op_checks.rows_finding("mla_cache", rank, sorted(set(rows)), "{count} row(s) " + detail)


def _reads(inputs: RemapInputs, out: torch.Tensor, counts: torch.Tensor | None):
    """The (row, column, slot) the attention reads (module docstring), and the rows that read
    a ``-1`` inside their count: by the count only for packed rows, as counts mean a prefix
    only there."""
    out = out.cpu().to(torch.int64)
    if counts is None or not inputs.compact:
        read = out >= 0
        holes = torch.zeros(out.shape[0], dtype=torch.bool)
    else:
        columns = torch.arange(out.shape[1]).unsqueeze(0)
        read = columns < counts.cpu().to(torch.int64).unsqueeze(1)
        holes = (read & (out < 0)).any(dim=1)
        read &= out >= 0
    at = read.nonzero()
    return at[:, 0], at[:, 1], out[at[:, 0], at[:, 1]], holes


@dataclass(frozen=True)
class _Picked:
    """What the rows picked and what each picked token's entry must be."""

    requests: torch.Tensor  # [rows] int32
    picks: torch.Tensor  # [rows, topk] int32
    row_of: dict[tuple[int, int], int]  # (request, position) -> row of ``written``
    written: torch.Tensor  # [tokens, entry bytes] uint8
    kv_fp32: torch.Tensor  # [tokens, kv] fp32

    @functools.cached_property
    def sets(self) -> list[set[int]]:
        return [{p for p in row if p >= 0} for row in self.picks.tolist()]


def _rank_findings(
    scenario: Scenario,
    picked: _Picked,
    inputs: RemapInputs,
    out: torch.Tensor,
    counts: torch.Tensor | None,
    entries: torch.Tensor,
    read: list[dict[int, int]],
) -> list[Finding]:
    """One rank's reads judged (module docstring); every read counted in ``read``."""
    rank, sets = inputs.dcp_rank, picked.sets
    rows, columns, slots, holes = _reads(inputs, out, counts)
    findings = []
    if holes.any():
        findings.append(
            _finding(rank, holes.nonzero().flatten().tolist(), "read a -1 inside their count")
        )
    stray, keys, at = [], [], []
    back, picks, requests = ReadBack.of(inputs), picked.picks.tolist(), picked.requests.tolist()
    reads = zip(rows.tolist(), columns.tolist(), slots.tolist(), strict=True)
    for index, (row, column, slot) in enumerate(reads):
        [position] = back.slots(row, [slot])
        # in place, a column's slot is its own pick's
        allowed = sets[row] if inputs.compact else {picks[row][column]}
        if position is None or position not in allowed or slot >= entries.shape[0]:
            stray.append(row)
            continue
        read[row][position] = read[row].get(position, 0) + 1
        keys.append(picked.row_of[(requests[row], position)])
        at.append(index)
    if stray:
        findings.append(_finding(rank, stray, "read a slot that holds no pick of theirs"))
    if keys:
        tokens = torch.tensor(keys, dtype=torch.int64)
        actual = entries[slots[at]]
        wrong = _wrong_entries(scenario, actual, picked.written[tokens], picked.kv_fp32[tokens])
        if wrong.any():
            detail = "read an entry that is not their pick's"
            findings.append(_finding(rank, rows[at][wrong].tolist(), detail))
    return findings


def read_agrees_with_write(
    reader: RemapKernel,
    writer: object,
    scenario: Scenario,
    dcp_size: int,
    device: torch.device,
    topk: int = 128,
    seed: int = 0,
    compact: bool = False,
    count_valid: bool = False,
) -> CheckResult:
    """The check of the module docstring on ``scenario`` at ``dcp_size``: ``writer`` (a
    kernel of the fused op) writes, ``reader`` (one of this op) reads, packed or in place,
    with counts or without. A reader that cannot be asked this is reported skipped with its
    reason; a kernel that raises propagates as a ``KernelError``."""
    case = build_case(scenario, dcp_size, device)
    requests, picks = _picks(case, topk, seed)
    table = _tables(case).to(device)
    ranks = [
        RemapInputs(
            req_id=requests.to(device),
            block_table=table,
            token_indices=picks.to(device),
            block_size=scenario.block_size,
            dcp_size=dcp_size,
            dcp_rank=launch.rank,
            interleave=scenario.interleave,
            compact=compact,
            count_valid=count_valid,
        )
        for launch in case.ranks
    ]
    reason = op_cases.not_applicable(reader, ranks)
    if reason:
        return CheckResult(CHECK, skipped=reason)
    fused_runner.launch_all(writer, case)  # type: ignore[arg-type]
    reader = op_cases.raising(reader)
    picked = _Picked(requests, picks, *_written(case))
    read: list[dict[int, int]] = [{} for _ in range(picks.shape[0])]  # position -> reads
    findings = []
    for launch, inputs in zip(case.ranks, ranks, strict=True):
        out = torch.full(picks.shape, NO_SLOT, dtype=torch.int32, device=device)
        counts = (
            torch.zeros(picks.shape[0], dtype=torch.int32, device=device) if count_valid else None
        )
        reader(inputs, out, counts)
        entries = launch.mla.view.cpu().reshape(-1, launch.mla.view.shape[-1])
        findings += _rank_findings(scenario, picked, inputs, out, counts, entries, read)
    sets = picked.sets
    unread = [row for row, wanted in enumerate(sets) if wanted - read[row].keys()]
    if unread:
        findings.append(_finding(None, unread, "have a pick no rank reads"))
    twice = [row for row in range(len(sets)) if any(n > 1 for n in read[row].values())]
    if twice:  # the picks are distinct: attention would weigh such a token twice
        findings.append(_finding(None, twice, "read a pick more than once"))
    return CheckResult(CHECK, tuple(findings))
