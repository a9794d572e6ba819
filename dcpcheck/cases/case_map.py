"""What one case's ownership map shows, apart from how it is drawn: per rank and token,
the ownership code and the (check, field) pairs some finding marks there.

``dcpcheck.output.ownership_map`` draws this as a PNG and ``dcpcheck.output.map_page``
as HTML; both read the same ``CaseMap``, built once per case by ``build_case_map``. What
is the op's own (its slot mappings, its field rows, how its scenario's layout reads) the
op gives: its package's ``case_maps`` module (``OpPackage.case_map``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dcpcheck.cases.dcp import FOREIGN, OWNED, OWNERSHIP_NAMES, PADDING, SlotMappings
from dcpcheck.cases.verdicts import CaseResult, format_finding


def _row_of(field: str) -> str:
    return field.split(".", 1)[0]


@dataclass(frozen=True)
class CaseMap:
    """What one case's map shows: ownership and findings per (rank, token)."""

    result: CaseResult
    description: str  # the scenario's
    layout: str  # its batch and cache layout in words, under the map
    ownership: tuple[tuple[int, ...], ...]  # [rank][token] OWNED / FOREIGN / PADDING
    positions: tuple[int, ...]
    rows: tuple[str, ...]  # field rows under each rank's ownership row
    marks: dict[tuple[int, int], tuple[tuple[str, str], ...]]  # (rank, token) -> (check, field)
    unplaced: tuple[str, ...]  # finding lines with no (rank, token) to draw them at

    @property
    def num_ranks(self) -> int:
        return len(self.ownership)

    @property
    def num_tokens(self) -> int:
        return len(self.positions)

    def bad_rows(self, rank: int, token: int) -> set[str]:
        return {_row_of(field) for _, field in self.marks.get((rank, token), ())}

    def ownership_tally(self) -> list[str]:
        """Per field row found bad anywhere: its bad cells out of all cells of each
        ownership class, e.g. ``kv_out: bad on 3 of 3 foreign, 0 of 1 owned cells``.

        The per-token stripes blur once a pixel column holds several tokens; these counts
        say whether a bug tracks ownership at any batch size.
        """
        totals = {code: 0 for code in (OWNED, FOREIGN, PADDING)}
        bad: dict[str, dict[int, int]] = {}
        for rank, codes in enumerate(self.ownership):
            for token, code in enumerate(codes):
                totals[code] += 1
                for row in self.bad_rows(rank, token):
                    counts = bad.setdefault(row, dict.fromkeys(totals, 0))
                    counts[code] += 1
        lines = []
        for row in self.rows:
            if row in bad:
                parts = [
                    f"{bad[row][code]} of {total} {OWNERSHIP_NAMES[code]}"
                    for code, total in totals.items()
                    if total
                ]
                lines.append(f"{row}: bad on {', '.join(parts)} cells")
        return lines


def build_case_map(
    result: CaseResult,
    mappings: SlotMappings,
    rows: Sequence[str],
    description: str,
    layout: str,
) -> CaseMap:
    """The map of ``result``, a case whose ranks' slot mappings are ``mappings``: the
    op's field ``rows`` under each rank, in order, then the row of any other field a
    finding names (a finding's row is its field up to the first dot)."""
    ownership = tuple(tuple(mappings.ownership(rank).tolist()) for rank in range(result.dcp_size))
    rows = list(rows)
    marks: dict[tuple[int, int], list[tuple[str, str]]] = {}
    unplaced = []
    for check in result.checks:
        for finding in check.findings:
            tokens = finding.tokens or (() if finding.token is None else (finding.token,))
            if finding.rank is None or not tokens:
                unplaced.append(format_finding(check.check, finding))
                continue
            if _row_of(finding.field) not in rows:
                rows.append(_row_of(finding.field))
            for token in tokens:
                marks.setdefault((finding.rank, token), []).append((check.check, finding.field))
    return CaseMap(
        result=result,
        description=description,
        layout=layout,
        ownership=ownership,
        positions=tuple(mappings.positions.tolist()),
        rows=tuple(rows),
        marks={key: tuple(dict.fromkeys(found)) for key, found in marks.items()},
        unplaced=tuple(unplaced),
    )


def verdict_label(result: CaseResult) -> str:
    return result.status.upper()


def case_label(result: CaseResult) -> str:
    return f"{result.scenario}[dcp{result.dcp_size}]"
