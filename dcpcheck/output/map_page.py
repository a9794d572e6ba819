"""The HTML page of an ownership-map report (``index.html``): a summary table, the legend,
then per case its map (the PNG, embedded as base64), the per-token table, the bad cells by
ownership, its findings and its replay command.

Self-contained (inline CSS, nothing loaded from the network) and deterministic, like the
maps it embeds. It exists apart from the PNG drawing in ``dcpcheck.output.ownership_map``,
which writes the page next to the maps: the page is text and markup, the map is pixels.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence

from dcpcheck.cases.case_map import CaseMap, case_label, verdict_label
from dcpcheck.cases.dcp import FOREIGN, OWNED, OWNERSHIP_NAMES, PADDING
from dcpcheck.cases.verdicts import CaseResult, format_finding
from dcpcheck.output.map_colors import BAD_COLOR, OWNERSHIP_COLORS, TEXT_COLOR, Rgb

TOKEN_TABLE_MAX_TOKENS = 64
"""Cases up to this many tokens also get a per-token HTML table with tooltips."""


def _hex(color: Rgb) -> str:
    return "#{:02x}{:02x}{:02x}".format(*color)


_CSS = f"""
body {{ font-family: system-ui, sans-serif; margin: 24px; color: {_hex(TEXT_COLOR)}; }}
h1 {{ font-size: 20px; margin: 0 0 4px; }}
h2 {{ font-size: 16px; margin: 28px 0 6px; }}
.verdict {{ color: {_hex(BAD_COLOR)}; }} .verdict.pass {{ color: #1b7a32; }}
.legend span.sw {{ display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 12px;
  vertical-align: -1px; border: 1px solid #0003; }}
table.summary {{ border-collapse: collapse; margin: 12px 0; }}
table.summary td, table.summary th {{ border-bottom: 1px solid #ddd; padding: 2px 10px;
  text-align: left; }}
img.map {{ display: block; margin: 8px 0; image-rendering: pixelated; }}
table.tokens {{ border-collapse: collapse; font-size: 11px; margin: 8px 0; }}
table.tokens th, table.tokens td {{ border: 1px solid #fff; min-width: 18px; height: 18px;
  padding: 0 2px; text-align: center; }}
table.tokens th {{ font-weight: normal; color: #555; }}
td.owned {{ background: {_hex(OWNERSHIP_COLORS[OWNED])}; color: #fff; }}
td.foreign {{ background: {_hex(OWNERSHIP_COLORS[FOREIGN])}; }}
td.padding {{ background: {_hex(OWNERSHIP_COLORS[PADDING])}; }}
td.bad {{ box-shadow: inset 0 0 0 3px {_hex(BAD_COLOR)}; font-weight: bold; }}
ul.findings {{ font-family: ui-monospace, monospace; font-size: 12px; padding-left: 18px; }}
code.replay {{ background: #f3f3f3; padding: 2px 6px; }}
"""


def _legend_html() -> str:
    items = [
        (OWNERSHIP_COLORS[OWNED], "owned"),
        (OWNERSHIP_COLORS[FOREIGN], "foreign"),
        (OWNERSHIP_COLORS[PADDING], "padding"),
        (BAD_COLOR, "field found bad for that token on that rank"),
    ]
    swatches = "".join(
        f'<span class="sw" style="background:{_hex(color)}"></span>{html.escape(name)}'
        for color, name in items
    )
    return (
        f'<p class="legend">{swatches}</p><p>Each rank is a band: its ownership row, then one '
        "row per field (pale: no finding; red: a check found the field bad there).</p>"
    )


def _token_table_html(case: CaseMap) -> str:
    """One cell per token and rank; the tooltip holds everything known about it."""
    header = "".join(f"<th>{t}</th>" for t in range(case.num_tokens))
    positions = "".join(f"<th>{p}</th>" for p in case.positions)
    rows = [
        f"<tr><th>token</th>{header}</tr>",
        f"<tr><th>position</th>{positions}</tr>",
    ]
    for rank in range(case.num_ranks):
        cells = []
        for token in range(case.num_tokens):
            own = OWNERSHIP_NAMES[case.ownership[rank][token]]
            marks = case.marks.get((rank, token), ())
            found = ", ".join(f"{check}: {field}" for check, field in marks)
            tip = f"token {token} (position {case.positions[token]}) on rank {rank}: {own}; "
            tip += f"bad: {found}" if marks else "no finding"
            css = f"{own} bad" if marks else own
            text = f"&#x2717;{len({field for _, field in marks})}" if marks else ""
            cells.append(f'<td class="{css}" title="{html.escape(tip)}">{text}</td>')
        rows.append(f"<tr><th>rank {rank}</th>{''.join(cells)}</tr>")
    return f'<table class="tokens">{"".join(rows)}</table>'


def _findings_html(result: CaseResult) -> str:
    lines = [format_finding(c.check, f) for c in result.failed_checks for f in c.findings]
    if result.error:
        lines.insert(0, result.error)
    if not lines:
        return ""
    return '<ul class="findings">' + "".join(f"<li>{html.escape(x)}</li>" for x in lines) + "</ul>"


def _not_applicable_html(result: CaseResult) -> str:
    skipped = [f"{c.check} ({c.skipped})" for c in result.checks if c.skipped is not None]
    if not skipped:
        return ""
    return f"<p>Not applicable: {html.escape('; '.join(skipped))}</p>"


def _verdict_html(result: CaseResult, tag: str) -> str:
    """The verdict in red, or green for a pass (any other status is a failure: a kernel
    error, a crashed or timed-out worker)."""
    css = f"verdict {result.status}"
    return f'<{tag} class="{html.escape(css)}">{html.escape(verdict_label(result))}</{tag}>'


def _case_anchor(result: CaseResult) -> str:
    return f"case-{result.scenario}-dcp{result.dcp_size}"


def _case_html(result: CaseResult, case: CaseMap | None, png: bytes | None) -> str:
    parts = [
        f'<section id="{html.escape(_case_anchor(result))}">',
        f"<h2>{html.escape(case_label(result))} {_verdict_html(result, 'span')}</h2>",
    ]
    if case is not None:
        parts.append(f"<p>{html.escape(case.description)}</p>")
    if png is not None:
        encoded = base64.b64encode(png).decode("ascii")
        alt = f"ownership map of {case_label(result)}"
        parts.append(
            f'<img class="map" alt="{html.escape(alt)}" src="data:image/png;base64,{encoded}">'
        )
    else:
        parts.append("<p>No ownership map: this case is not a scenario run.</p>")
    if case is not None and case.num_tokens <= TOKEN_TABLE_MAX_TOKENS:
        parts.append(_token_table_html(case))
    if case is not None and case.ownership_tally():
        tally = "".join(f"<li>{html.escape(line)}</li>" for line in case.ownership_tally())
        parts.append(f"<p>Bad cells by ownership:</p><ul>{tally}</ul>")
    parts += [
        _findings_html(result),
        _not_applicable_html(result),
        f'<p>replay: <code class="replay">{html.escape(result.replay)}</code></p>',
        "</section>",
    ]
    return "\n".join(p for p in parts if p)


def render_html(
    cases: Sequence[tuple[CaseResult, CaseMap | None, bytes | None]], *, kernel_name: str
) -> str:
    """The report page: summary table, legend, then each case's map and findings."""
    counts: dict[str, int] = {}
    for result, _, _ in cases:
        counts[result.status] = counts.get(result.status, 0) + 1
    totals = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    summary_rows = "".join(
        f'<tr><td><a href="#{html.escape(_case_anchor(r))}">{html.escape(case_label(r))}</a></td>'
        f"{_verdict_html(r, 'td')}"
        f"<td>{html.escape(', '.join(c.check for c in r.failed_checks) or (r.error or ''))}</td>"
        "</tr>"
        for r, _, _ in cases
    )
    title = f"dcpcheck ownership maps: {kernel_name}"
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{html.escape(title)}</title>",
            f"<style>{_CSS}</style></head><body>",
            f"<h1>{html.escape(title)}</h1>",
            f"<p>{len(cases)} case(s): {html.escape(totals)}</p>",
            _legend_html(),
            '<table class="summary"><tr><th>case</th><th>verdict</th><th>failed</th></tr>',
            summary_rows,
            "</table>",
            *(_case_html(*case) for case in cases),
            "</body></html>",
            "",
        ]
    )
