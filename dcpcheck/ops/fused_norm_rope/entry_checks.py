"""Contract 2a, ``cache_owned``: each entry a rank owns holds its token's encoding.

Compared part by part (``cache_entries.EntryPart``: an MLA entry's values, RoPE part and
scales; an indexer row's values and scale) in steps of each part's stored format, with
the oracle's encoding (``check_cache_owned``) or, without the oracle, only as written at
all (``check_cache_written``). A part that decodes as NaN is told apart: still the seeded
random fill (unwritten) or bytes the kernel wrote that are no valid encoding.
"""

from __future__ import annotations

import dataclasses

import torch

import reference
from dcpcheck.cases.verdicts import CheckResult, Finding
from dcpcheck.ops.fused_norm_rope.cache_entries import (
    OwnedEntries,
    expected_index_rows,
    owned_entries,
)
from dcpcheck.ops.fused_norm_rope.case import Case
from dcpcheck.ops.fused_norm_rope.checks import NAN_UNWRITTEN, NAN_WRITTEN_ENTRY, row_finding
from dcpcheck.ops.fused_norm_rope.comparison import bits_equal, nvfp4_scale_slack, part_violations
from dcpcheck.ops.fused_norm_rope.contract import CacheLayout, DsMlaScale


def _compare_entries(
    case: Case,
    owned: OwnedEntries,
    actual: torch.Tensor,
    expected: torch.Tensor,
    slack: dict[str, torch.Tensor] | None = None,
) -> list[Finding]:
    """Findings of ``owned``'s entries ``actual`` against the oracle's ``expected``, part by
    part. A part infinitely far (a NaN) is told apart by the entries' bytes as stored after
    and before the launch (``OwnedEntries.stored_rows``, read only then): still the random
    fill is unwritten, changed bytes are a written NaN."""
    findings = []
    for part in owned.parts:
        bad, steps = part_violations(actual, expected, part, (slack or {}).get(part.name))
        if bad.any():
            max_error = None
            infinite = bad & (steps == torch.iinfo(torch.int64).max)
            if infinite.any():  # the worst is a NaN: say which rows' NaN it is
                span = slice(part.start, part.stop)
                rows = infinite.to(actual.device)
                after, before = owned.stored_rows()
                untouched = bits_equal(after[rows, span], before[rows, span])
                max_error = NAN_UNWRITTEN if bool(untouched.all()) else NAN_WRITTEN_ENTRY
            findings.append(
                row_finding(
                    f"{owned.field}.{part.name}",
                    owned.launch.rank,
                    "{count} owned entr(y/ies) differ from the oracle's encoding",
                    bad,
                    owned.tokens,
                    steps,
                    case,
                    max_error=max_error,
                )
            )
    return findings


def mla_part_slack(layout: CacheLayout, kv_fp32: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-element extra steps some MLA entry parts may be off by, from the oracle's
    unrounded KV ``[K, 512]`` of the entries' tokens: an nvfp4_ds_mla scale next to an
    e4m3 rounding midpoint (``tolerances.NVFP4_SCALE``); none for other layouts."""
    if layout is CacheLayout.NVFP4_DS_MLA:
        return {"scales": nvfp4_scale_slack(kv_fp32)}
    return {}


def other_scale_rule_note(case: Case, owned: OwnedEntries, actual: torch.Tensor) -> str | None:
    """Where an fp8_ds_mla case's stored tile scales are wrong by the rule it demands but
    follow the other rule in every owned entry, what to say: the kernel most likely writes
    that rule (vLLM changed it in 0.31.0), which ``--ds-mla-scale`` names; None otherwise.
    Only the scales part is compared, within its own tolerance: the NoPE bytes of a tile
    follow its scale, so they are wrong by the demanded rule too and say nothing more."""
    if case.scenario.cache_layout is not CacheLayout.FP8_DS_MLA:
        return None
    demanded = case.ranks[0].inputs.ds_mla_scale
    other = DsMlaScale.POW2 if demanded is DsMlaScale.AMAX else DsMlaScale.AMAX
    tokens = owned.tokens.to(case.expected.kv_fp32.device)
    expected = reference.encode_mla_entries(
        case.expected.kv_fp32[tokens],
        case.expected.kpe_fp32[tokens],
        CacheLayout.FP8_DS_MLA.value,
        case.scenario.torch_dtype,
        None,
        ds_mla_scale=other.value,
    ).to(actual.device)
    [scales] = [part for part in owned.parts if part.name == "scales"]
    bad, _ = part_violations(actual, expected, scales)
    if bad.any():
        return None
    return (
        f"the stored scales follow the {other.value} rule in every owned entry: if the "
        f"kernel writes that rule, judge it with --ds-mla-scale {other.value}"
    )


def check_cache_owned(case: Case) -> CheckResult:
    """Contract 2a: each entry this rank owns holds the oracle's encoding of its token; an
    fp8_ds_mla scales finding says when the scales follow the other tile-scale rule
    (:func:`other_scale_rule_note`)."""
    if case.scenario.profiling:
        return CheckResult("cache_owned", skipped="profiling call: no entry is owned")
    findings = []
    for owned in owned_entries(case):
        actual = owned.rows()
        tokens = owned.tokens.to(actual.device)
        slack = None
        if owned.field == "mla_cache":
            expected = case.expected.mla_entries[tokens]
            slack = mla_part_slack(case.scenario.cache_layout, case.expected.kv_fp32[tokens])
        else:
            expected = expected_index_rows(case, tokens)
        found = _compare_entries(case, owned, actual, expected, slack)
        scales = f"{owned.field}.scales"
        if any(f.field == scales for f in found):
            note = other_scale_rule_note(case, owned, actual)
            if note is not None:
                found = [
                    dataclasses.replace(f, detail=f"{f.detail}; {note}") if f.field == scales else f
                    for f in found
                ]
        findings += found
    return CheckResult("cache_owned", tuple(findings))


CACHE_OWNED_WITHOUT_ORACLE = (
    "oracle off: every owned entry checked written (no part left as the seeded random "
    "fill); its bytes are compared with the DCP1 run's entry by shards_reassemble"
)


def check_cache_written(case: Case) -> CheckResult:
    """Contract 2a without the oracle: each entry this rank owns was written, at every DCP
    size, DCP1 included.

    Caches start as seeded random bytes, so an owned entry part (``mla_entry_parts``,
    ``index_entry_parts``) that still equals them byte for byte was not written. A correct
    part of ``b`` bytes equals the random fill by chance with odds ``2^-8b``; the smallest
    part, an indexer row's 4-byte scale, gives 2^-32 (2.3e-10) per entry. The fill is
    seeded, so such a coincidence would repeat on every run of that case rather than
    flake. The written bytes are then judged against the kernel's own DCP1 run by
    ``check_shards_reassemble``, which also catches a part written only in places: the
    fill of a DCPn cache differs from the DCP1 one.
    """
    if case.scenario.profiling:
        return CheckResult(
            "cache_owned",
            skipped="profiling call: no entry is owned",
            without_oracle=CACHE_OWNED_WITHOUT_ORACLE,
        )
    findings = []
    for owned in owned_entries(case):
        actual, initial = owned.stored_rows()
        for part in owned.parts:
            span = slice(part.start, part.stop)
            bad = bits_equal(actual[:, span], initial[:, span]).cpu()
            if bad.any():
                findings.append(
                    row_finding(
                        f"{owned.field}.{part.name}",
                        owned.launch.rank,
                        "{count} owned entr(y/ies) still hold the seeded random fill: "
                        "never written",
                        bad,
                        owned.tokens,
                        torch.zeros(len(owned.tokens), dtype=torch.int64),
                        case,
                        max_error="unwritten",
                    )
                )
    return CheckResult("cache_owned", tuple(findings), without_oracle=CACHE_OWNED_WITHOUT_ORACLE)
