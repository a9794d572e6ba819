"""The contract checks of docs/dcp-contract.md, each a small function returning a ``CheckResult``.

Per rank (after one launch): ``outputs`` (1), ``topk``, ``cache_owned`` (2, the written
entries), ``cache_foreign`` (2, nothing else in range changed), ``prefix_intact``,
``padding_inert`` (5), ``profiling_no_write`` (6), ``guard_bands`` (out-of-bounds
writes), ``inputs_unmodified``. Across runs: ``ranks_agree`` (3) and
``shards_reassemble`` (4).

Every finding names the check, the field, the rank, the first bad token and whether that
token is owned by, foreign to, or padding on that rank, and the largest error. Values
are compared on the device; only verdicts move to the host.

Without the oracle (``dcpcheck run --oracle off``): the two checks that compare with it,
``outputs`` and ``cache_owned``, are replaced by their oracle-free forms,
``check_outputs_written`` and ``check_cache_written``, which keep the check's name and say
what they compared with (``CheckResult.without_oracle``); the values themselves are then
judged only against the kernel's own DCP1 run, by ``ranks_agree`` and
``shards_reassemble``. Every other check compares with the initial bytes or the DCP1 run
already and stays as it is; only the naming of the token a stray write holds changes
source (``TokenEncodings``).

``cache_owned`` lives in ``entry_checks`` (each owned entry against the oracle's, part by
part). What the checks stand on lives beside them: ``cache_entries`` reads and cuts cache entries,
``comparison`` compares rows in steps of their stored format, and ``stray_writes`` scans
each cache for the writes no token owned, which ``stray_write_checks`` files here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

import reference
from dcpcheck.cases.dcp import FOREIGN, OWNED, PADDING
from dcpcheck.cases.verdicts import CheckResult, Finding
from dcpcheck.ops.fused_norm_rope import tolerances
from dcpcheck.ops.fused_norm_rope.cache_entries import expected_index_rows, index_rows
from dcpcheck.ops.fused_norm_rope.case import (
    POISON_BITS,
    TOPK_SENTINEL,
    Case,
    RankLaunch,
    holds_poison,
)
from dcpcheck.ops.fused_norm_rope.comparison import bits_equal, row_violations
from dcpcheck.ops.fused_norm_rope.input_snapshot import InputSnapshot
from dcpcheck.ops.fused_norm_rope.stray_writes import StrayWrite, collect_stray_writes

OWNERSHIP_NAMES = {OWNED: "owned", FOREIGN: "foreign", PADDING: "padding"}

OUTPUT_FIELDS = ("q_out", "kv_out", "kpe_out", "index_k_out")


NAN_UNWRITTEN = "NaN (unwritten)"
"""``Finding.max_error`` of a row that still holds the harness's NaN poison."""

NAN_COMPUTED = "NaN (computed)"
"""``Finding.max_error`` of a row the kernel wrote with a NaN of its own: a numeric bug,
not a skipped write (``case.POISON_BITS`` tells the two apart)."""

NAN_WRITTEN_ENTRY = "NaN (written: not a valid encoding)"
"""``Finding.max_error`` of a cache entry part whose bytes the kernel changed into
something that decodes as NaN (an fp8 NaN code, an MX word whose four bytes differ), as
opposed to one left as the seeded random fill (``NAN_UNWRITTEN``)."""

NAN_IN_DCP1 = "NaN in the DCP1 run"
"""``Finding.max_error`` of a finite row compared with a NaN row of the DCP1 run."""


def _describe_steps(steps: int, rows: torch.Tensor | None) -> str:
    """A row's error in steps; for a NaN (infinitely far), which NaN: the poison left
    unwritten, one the kernel computed, or (no NaN in ``rows``) one on the other side."""
    if steps != torch.iinfo(torch.int64).max:
        return f"{steps} steps"
    if rows is None or rows.dtype not in POISON_BITS or holds_poison(rows).any():
        return NAN_UNWRITTEN
    return NAN_COMPUTED if rows.isnan().any() else NAN_IN_DCP1


def row_finding(
    field: str,
    rank: int,
    detail: str,
    bad: torch.Tensor,
    tokens: torch.Tensor,
    steps: torch.Tensor,
    case: Case,
    max_error: str | None = None,
    rows: torch.Tensor | None = None,
) -> Finding:
    """A finding over token rows: ``bad`` masks ``tokens``; ``steps`` gives each row's
    error (reported as the maximum over bad rows unless ``max_error`` is given; ``rows``,
    the float rows judged, say which NaN a NaN is). ``detail`` may use ``{count}``."""
    idx = torch.nonzero(bad).flatten()
    token = int(tokens[idx[0]])
    if max_error is None:
        judged = None if rows is None else rows[idx.to(rows.device)]
        max_error = _describe_steps(int(steps[bad].max()), judged)
    return Finding(
        field=field,
        rank=rank,
        detail=detail.format(count=int(idx.numel())),
        token=token,
        ownership=OWNERSHIP_NAMES[int(case.mappings.ownership(rank)[token])],
        max_error=max_error,
        count=int(idx.numel()),
        tokens=tuple(tokens[idx].tolist()),
    )


def _real_tokens(case: Case) -> torch.Tensor:
    return torch.nonzero(case.mappings.owner >= 0).flatten()


def _real_output_rows(case: Case) -> Iterator[tuple[RankLaunch, str, torch.Tensor]]:
    """(launch, field, that output's rows of the real tokens) for every output each rank
    was given, in rank then ``OUTPUT_FIELDS`` order (the order findings are reported in)."""
    tokens = _real_tokens(case)
    for launch in case.ranks:
        for field in OUTPUT_FIELDS:
            actual = getattr(launch.outputs, field)
            if actual is not None:
                yield launch, field, actual[tokens.to(actual.device)]


def check_outputs(case: Case) -> CheckResult:
    """Contract 1: every output equals the oracle's on every real token, whatever its slot."""
    tokens = _real_tokens(case)
    findings = []
    for launch, field, rows in _real_output_rows(case):
        expected = getattr(case.expected, field)
        if expected is None:
            continue
        tolerance = tolerances.OUTPUT_TOLERANCES[field]
        bad, steps = row_violations(rows, expected[tokens.to(rows.device)], tolerance)
        if bad.any():
            findings.append(
                row_finding(
                    field,
                    launch.rank,
                    "{count} token row(s) differ from the oracle",
                    bad,
                    tokens,
                    steps,
                    case,
                    rows=rows,
                )
            )
    return CheckResult("outputs", tuple(findings))


OUTPUTS_WITHOUT_ORACLE = (
    "oracle off: every real token's row checked written (no NaN poison left); its values "
    "are compared bitwise with the DCP1 run by ranks_agree"
)


def check_outputs_written(case: Case) -> CheckResult:
    """Contract 1 without the oracle: every real token's output row was written, on every
    rank and at every DCP size, DCP1 included.

    The harness fills every float output with NaN before each launch (``case`` poisons
    them), and this op computes no NaN from the finite inputs it is given, so a real
    token's row that holds one was never written (or was computed from garbage). That is
    all a run's outputs can be judged on by themselves; whether the written values are
    right is then a comparison with the kernel's own DCP1 run, which
    ``check_ranks_agree`` makes bitwise. Together they catch both historical DCP bugs: the
    rows a rank skips for its foreign tokens are NaN on that rank, and differ from DCP1.
    """
    tokens = _real_tokens(case)
    findings = []
    for launch, field, rows in _real_output_rows(case):
        if not rows.is_floating_point():
            continue  # top-k: check_topk
        unwritten = holds_poison(rows).any(dim=1)
        computed = rows.isnan().any(dim=1) & ~unwritten
        for bad, detail, error in (
            (unwritten, "still hold the harness's NaN poison: never written", NAN_UNWRITTEN),
            (computed, "hold a NaN the kernel computed (from finite inputs)", NAN_COMPUTED),
        ):
            if bad.any():
                findings.append(
                    row_finding(
                        field,
                        launch.rank,
                        "{count} token row(s) " + detail,
                        bad.cpu(),
                        tokens,
                        torch.zeros(len(tokens), dtype=torch.int64),
                        case,
                        max_error=error,
                    )
                )
    return CheckResult("outputs", tuple(findings), without_oracle=OUTPUTS_WITHOUT_ORACLE)


def check_topk(case: Case) -> CheckResult:
    """Indexer layers fill every real row with -1; shared layers leave the buffer untouched."""
    tokens = _real_tokens(case)
    findings = []
    for launch in case.ranks:
        rows = launch.outputs.topk_indices[tokens.to(launch.outputs.topk_indices.device)]
        want = -1 if case.scenario.has_indexer else TOPK_SENTINEL
        bad = (rows != want).any(dim=1).cpu()  # a flag per row crosses, not the 2,048 indices
        if bad.any():
            steps = torch.zeros(len(tokens), dtype=torch.int64)
            what = "not filled with -1" if want == -1 else "written on a shared (no-indexer) layer"
            findings.append(
                row_finding(
                    "topk_indices",
                    launch.rank,
                    "{count} row(s) " + what,
                    bad,
                    tokens,
                    steps,
                    case,
                    max_error="-",
                )
            )
    return CheckResult("topk", tuple(findings))


@dataclass(frozen=True)
class TokenEncodings:
    """Each token's cache entry bytes (padding rows included), to recognise which token a
    stray write holds: ``[T, E]`` for the MLA cache, ``[T, I + 4]`` indexer rows (values,
    then the scale's bytes), ``None`` on shared layers.

    Recognising a token only names it in the finding and decides whether a stray write is
    filed under ``padding_inert`` or ``cache_foreign``; that it is a failure rests on the
    initial bytes alone (``stray_writes``).
    """

    mla: torch.Tensor
    index: torch.Tensor | None

    @staticmethod
    def from_oracle(case: Case) -> TokenEncodings:
        """The oracle's encodings of every token."""
        index = None
        if case.index_mappings is not None:
            index = expected_index_rows(case, _real_and_padding(case))
        return TokenEncodings(case.expected.mla_entries, index)

    @staticmethod
    def from_dcp1_run(case: Case, baseline: Case) -> TokenEncodings:
        """The kernel's own encodings, for judging without the oracle (``--oracle off``):
        each real token's entry as the DCP1 run wrote it (every real token owns a slot at
        DCP1), so a stray copy of it is recognised byte for byte whatever encoding the
        kernel uses.

        Padding rows own no slot in any run, so no run holds their encoding: for them
        (and for a profiling call, which writes nothing) this keeps the oracle's. A kernel
        whose encoding the oracle does not know then has a stray padding write filed
        under ``cache_foreign`` instead of ``padding_inert``: a failure either way.
        """
        encodings = TokenEncodings.from_oracle(case)
        if baseline.scenario.profiling:
            return encodings
        real = _real_tokens(case)
        base = baseline.ranks[0]
        mla = encodings.mla.clone()
        slots = baseline.mappings.per_rank[0][real].to(base.mla.view.device)
        mla[real.to(mla.device)] = reference.read_mla_cache(base.mla.view, slots)
        index = encodings.index
        if index is not None:
            index = index.clone()
            slots = baseline.index_mappings.per_rank[0][real].to(base.index.view.device)
            index_dim = case.scenario.model.index_head_dim
            fmt = case.scenario.index_format
            index[real.to(index.device)] = index_rows(base.index.view, slots, index_dim, fmt)
        return TokenEncodings(mla, index)


def _real_and_padding(case: Case) -> torch.Tensor:
    return torch.arange(case.scenario.batch.num_tokens, device=case.expected.q_out.device)


def _stray_finding(case: Case, w: StrayWrite) -> Finding:
    own = None
    if w.token is not None:
        own = OWNERSHIP_NAMES[int(case.mappings.ownership(w.rank)[w.token])]
    who = f", holds token {w.token}'s encoding" if w.token is not None else ""
    return Finding(
        w.cache,
        w.rank,
        f"entry {w.slot} ({w.where}) changed: {w.bytes_changed} byte(s){who}",
        w.token,
        own,
        f"{w.bytes_changed} bytes",
    )


def stray_write_checks(
    case: Case,
    encodings: TokenEncodings | None = None,
    writes: list[StrayWrite] | None = None,
) -> list[CheckResult]:
    """Contract 2b, 5, 6 and out-of-bounds writes, from one scan of every cache byte.

    Each stray write goes to exactly one check: a guard band if outside the cache;
    ``profiling_no_write`` on a profiling call; ``prefix_intact`` on a cached-prefix
    entry; ``padding_inert`` if it holds a padding row's encoding (``encodings``, default
    the oracle's); else ``cache_foreign``. ``writes``: the stray writes when already known
    (``[]`` where ``fused_checks`` saw none), instead of the scan.
    """
    buckets: dict[str, list[Finding]] = {
        "guard_bands": [],
        "prefix_intact": [],
        "padding_inert": [],
        "cache_foreign": [],
    }
    profiling = case.scenario.profiling
    if profiling:
        buckets = {"guard_bands": [], "profiling_no_write": []}
    if writes is None:
        encodings = encodings or TokenEncodings.from_oracle(case)
        writes = collect_stray_writes(case, encodings.mla, encodings.index)
    for w in writes:
        if w.where.startswith("guard"):
            bucket = "guard_bands"
        elif profiling:
            bucket = "profiling_no_write"
        elif w.where == "prefix":
            bucket = "prefix_intact"
        elif w.token is not None and int(case.mappings.owner[w.token]) < 0:
            bucket = "padding_inert"
        else:
            bucket = "cache_foreign"
        buckets[bucket].append(_stray_finding(case, w))
    results = [CheckResult(name, tuple(found)) for name, found in buckets.items()]
    if not profiling and int(case.mappings.owner.lt(0).sum()) == 0:
        results = [
            r
            if r.check != "padding_inert" or r.findings
            else CheckResult("padding_inert", skipped="no padding rows in this batch")
            for r in results
        ]
    return results


def input_changes(launch: RankLaunch, before: InputSnapshot) -> list[Finding]:
    """Inputs (slot mappings included) that one rank's launch modified, bitwise: one
    comparison of every input at once, and the details (first row, count) only for an
    input that changed."""
    if before.unchanged():
        return []
    findings = []
    for name in before.spans:
        after, original = getattr(launch.inputs, name), before.original(name)
        rows = after.reshape(after.shape[0], -1) if after.dim() else after.reshape(1, 1)
        same = bits_equal(rows, original.reshape(rows.shape)).cpu()
        if bool(same.all()):
            continue
        findings.append(
            Finding(
                name,
                launch.rank,
                f"input modified (first row {int(torch.nonzero(~same).flatten()[0])})",
                count=int((~same).sum()),
            )
        )
    return findings


def check_inputs_unmodified(changes: list[Finding]) -> CheckResult:
    """The kernel must only read its inputs (the runner restores them after each launch,
    so one rank's scribble cannot leak into the next rank's run)."""
    return CheckResult("inputs_unmodified", tuple(changes))


def check_ranks_agree(case: Case, baseline: Case) -> CheckResult:
    """Contract 3: outputs bitwise identical across ranks and equal to the DCP1 run."""
    if case.dcp_size == 1:
        return CheckResult("ranks_agree", skipped="DCP1 is the baseline")
    tokens = _real_tokens(case)
    findings = []
    reference_launch = baseline.ranks[0]
    for launch in case.ranks:
        for field in OUTPUT_FIELDS:
            actual = getattr(launch.outputs, field)
            if actual is None:
                continue
            want = getattr(reference_launch.outputs, field)
            dev = tokens.to(actual.device)
            same = bits_equal(actual[dev], want[dev]).cpu()
            if not same.all():
                bad = ~same
                steps = tolerances.ulp_distance(actual[dev], want[dev]).amax(dim=1).cpu()
                findings.append(
                    row_finding(
                        field,
                        launch.rank,
                        "{count} row(s) differ bitwise from the DCP1 run",
                        bad,
                        tokens,
                        steps,
                        case,
                        rows=actual[dev] if actual.is_floating_point() else None,
                    )
                )
    return CheckResult("ranks_agree", tuple(findings))


def check_shards_reassemble(case: Case, baseline: Case) -> CheckResult:
    """Contract 4: each token's entry read from its owner rank equals, byte for byte,
    the DCP1 cache entry of that token (replicated indexer: every rank's entry does)."""
    if case.dcp_size == 1:
        return CheckResult("shards_reassemble", skipped="DCP1 is the baseline")
    if case.scenario.profiling:
        return CheckResult("shards_reassemble", skipped="profiling call writes no cache")
    findings = []
    tokens = _real_tokens(case)
    base = baseline.ranks[0]
    findings += _reassemble(
        case,
        tokens,
        "mla_cache",
        base.mla.view,
        baseline.mappings.per_rank[0],
        case.mappings,
        lambda r: case.ranks[r].mla.view,
        read=reference.read_mla_cache,
    )
    if case.index_mappings is not None:
        index_dim = case.scenario.model.index_head_dim

        def read_index(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
            return index_rows(cache, slots, index_dim, case.scenario.index_format)

        findings += _reassemble(
            case,
            tokens,
            "index_cache",
            base.index.view,
            baseline.index_mappings.per_rank[0],
            case.index_mappings,
            lambda r: case.ranks[r].index.view,
            read=read_index,
        )
    return CheckResult("shards_reassemble", tuple(findings))


def _reassemble(case, tokens, field, base_cache, base_slots, mappings, cache_of, read):
    findings = []
    for rank in range(case.dcp_size):
        slots = mappings.per_rank[rank][tokens]
        mine = tokens[slots >= 0]
        if not len(mine):
            continue
        actual = read(cache_of(rank), mappings.per_rank[rank][mine].to(base_cache.device))
        want = read(base_cache, base_slots[mine].to(base_cache.device))
        same = (actual == want).all(dim=1).cpu()
        if not same.all():
            bad = ~same
            bytes_off = (actual != want).sum(dim=1).cpu()
            findings.append(
                row_finding(
                    field,
                    rank,
                    "{count} entr(y/ies) differ from the DCP1 cache entry",
                    bad,
                    mine,
                    bytes_off,
                    case,
                    max_error=f"{int(bytes_off.max())} bytes",
                )
            )
    return findings
