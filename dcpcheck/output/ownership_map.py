"""Ownership maps: each case drawn as a tokens x ranks grid, coloured by who owns each
token's KV entry, with every field's verdict laid over it.

DCP bugs track ownership: a kernel that skips per-token work on slot ``-1`` leaves
exactly the *foreign* cells bad. Listed as findings that is a wall of lines; drawn as a
grid it is one picture, "foreign-token stripes": on every rank, the ``kv_out`` and
``kpe_out`` rows are red wherever the ownership row is amber, and fine where it is blue.

Each rank is a band of rows: the ownership row (blue owned, amber foreign, grey padding,
as ``SlotMappings.ownership`` codes them; the MLA cache's mapping, the one DCP shards),
then one row per field (``MAP_ROWS``; a cache finding such as ``mla_cache.kpe`` marks the
``mla_cache`` row), pale where nothing was found and red where some check found that
field bad for that token on that rank (``Finding.tokens``; a stray cache write marks the
token whose encoding it holds). Findings with no token (a modified input, a token-stream
divergence) are listed beside the map, not drawn.

Large batches keep the picture at most ``MAX_MAP_COLUMNS`` pixels wide by grouping
consecutive tokens per pixel column: the column's ownership colour is the mean of its
tokens' colours, and a field cell is red if *any* of its tokens is bad, so no failure is
averaged away. Per-token truth stays in the HTML for cases of up to
``TOKEN_TABLE_MAX_TOKENS`` tokens: a table cell per token and rank whose tooltip names the
token, its position, its ownership and every finding on it.

``write_report_dir`` writes ``index.html`` (self-contained: inline CSS, the maps embedded
as base64 PNG, nothing loaded from the network) and one ``<scenario>-dcp<N>.png`` per
case, each atomically. The same inputs give the same bytes (no timestamps).

To look at a report as a browser shows it (Debian's ``chromium`` package; the
networking flags keep it from reaching out, which fails on a closed network)::

    chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \\
        --disable-background-networking --disable-component-update --disable-sync \\
        --user-data-dir="$(mktemp -d)" --window-size=1400,1000 \\
        --screenshot=/tmp/ownership-map.png "file://$PWD/REPORT_DIR/index.html"
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from dcpcheck.files import write_atomic
from dcpcheck.harness.checks import OUTPUT_FIELDS, format_finding
from dcpcheck.harness.runner import CaseResult
from dcpcheck.spec.dcp import FOREIGN, OWNED, OWNERSHIP_NAMES, PADDING, slot_mappings
from dcpcheck.spec.scenario import Scenario

REPORT_HTML = "index.html"
"""The report page inside the report directory."""

Rgb = tuple[int, int, int]

OWNERSHIP_COLORS: dict[int, Rgb] = {
    OWNED: (49, 120, 181),  # blue
    FOREIGN: (242, 176, 53),  # amber: blue/amber stay apart for red-green colour blindness
    PADDING: (170, 170, 170),  # grey
}
"""Fill of an ownership cell, by ``SlotMappings.ownership`` code."""

BAD_COLOR: Rgb = (200, 16, 46)
"""A field cell where some check found the field bad (darker than amber, so a bad foreign
cell never reads as a merely foreign one)."""

FIELD_OK_WHITENESS = 0.7
"""A field cell with no finding is its ownership colour mixed with this much white: the
ownership pattern shows through every row, faint, so red stands out against it."""

BACKGROUND: Rgb = (255, 255, 255)
TEXT_COLOR: Rgb = (32, 32, 32)

MAX_MAP_COLUMNS = 1600
"""Widest map in pixel columns; larger batches group tokens per column (module docstring)."""

MAP_TARGET_WIDTH = 960
"""Small batches get cells this wide in all, up to ``MAX_CELL_WIDTH`` each."""

MAX_CELL_WIDTH = 28
GUTTER_MIN_CELL_WIDTH = 6
"""Cells at least this wide end in a one-pixel white gutter, so single tokens stay countable."""

# Pixel layout of a map PNG, top to bottom: header, token axis, rank bands, legend.
OWNERSHIP_ROW_HEIGHT = 18
FIELD_ROW_HEIGHT = 11
ROW_GAP = 1
RANK_GAP = 8
MARGIN = 12
LABEL_WIDTH = 112
HEADER_HEIGHT = 44
AXIS_HEIGHT = 16
LINE_HEIGHT = 17
MIN_TICK_SPACING = 48
"""Pixels between token-index labels above the map."""

UNPLACED_SHOWN = 6
"""Findings with no token listed under a map; the page lists every finding."""

TOKEN_TABLE_MAX_TOKENS = 64
"""Cases up to this many tokens also get a per-token HTML table with tooltips."""

MAP_ROWS = (*OUTPUT_FIELDS, "topk_indices", "mla_cache", "index_cache")
"""Field rows under each rank, in this order (``index_*`` rows only on indexer layers);
a finding's row is its field up to the first dot."""


def _row_of(field: str) -> str:
    return field.split(".", 1)[0]


def _hex(color: Rgb) -> str:
    return "#{:02x}{:02x}{:02x}".format(*color)


def _whiten(color: Rgb, whiteness: float) -> Rgb:
    r, g, b = (round(c + (255 - c) * whiteness) for c in color)
    return r, g, b


@dataclass(frozen=True)
class CaseMap:
    """What one case's map shows: ownership and findings per (rank, token)."""

    result: CaseResult
    scenario: Scenario
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
        totals = {code: 0 for code in OWNERSHIP_COLORS}
        bad: dict[str, dict[int, int]] = {}
        for rank, codes in enumerate(self.ownership):
            for token, code in enumerate(codes):
                totals[code] += 1
                for row in self.bad_rows(rank, token):
                    counts = bad.setdefault(row, dict.fromkeys(OWNERSHIP_COLORS, 0))
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


def build_case_map(result: CaseResult, scenario: Scenario) -> CaseMap:
    """The map of ``result``, a run of ``scenario`` at ``result.dcp_size``."""
    dcp = result.dcp_size
    mappings = slot_mappings(scenario.batch, scenario.layout(dcp), scenario.block_tables(dcp))
    ownership = tuple(tuple(mappings.ownership(rank).tolist()) for rank in range(dcp))
    on_layer = {"index_k_out", "index_cache"} if scenario.has_indexer else set()
    rows = [r for r in MAP_ROWS if not r.startswith("index_") or r in on_layer]
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
        scenario=scenario,
        ownership=ownership,
        positions=tuple(mappings.positions.tolist()),
        rows=tuple(rows),
        marks={key: tuple(dict.fromkeys(found)) for key, found in marks.items()},
        unplaced=tuple(unplaced),
    )


@dataclass(frozen=True)
class Box:
    """A pixel rectangle, ``x1``/``y1`` exclusive."""

    x0: int
    y0: int
    x1: int
    y1: int

    @property
    def center(self) -> tuple[int, int]:
        return (self.x0 + self.x1) // 2, (self.y0 + self.y1) // 2


@dataclass(frozen=True)
class MapGeometry:
    """Where each cell of a case's map lies in its PNG."""

    num_tokens: int
    num_ranks: int
    rows: tuple[str, ...]

    @property
    def tokens_per_column(self) -> int:
        return max(1, math.ceil(self.num_tokens / MAX_MAP_COLUMNS))

    @property
    def num_columns(self) -> int:
        return math.ceil(self.num_tokens / self.tokens_per_column)

    @property
    def cell_width(self) -> int:
        return min(MAX_CELL_WIDTH, max(1, MAP_TARGET_WIDTH // self.num_columns))

    @property
    def gutter(self) -> int:
        return 1 if self.cell_width >= GUTTER_MIN_CELL_WIDTH else 0

    @property
    def left(self) -> int:
        return MARGIN + LABEL_WIDTH

    @property
    def top(self) -> int:
        return MARGIN + HEADER_HEIGHT + AXIS_HEIGHT

    @property
    def map_width(self) -> int:
        return self.num_columns * self.cell_width

    @property
    def rank_height(self) -> int:
        return OWNERSHIP_ROW_HEIGHT + ROW_GAP + len(self.rows) * (FIELD_ROW_HEIGHT + ROW_GAP)

    @property
    def map_bottom(self) -> int:
        return self.top + self.num_ranks * (self.rank_height + RANK_GAP)

    def column(self, token: int) -> int:
        return token // self.tokens_per_column

    def column_tokens(self, column: int) -> range:
        start = column * self.tokens_per_column
        return range(start, min(self.num_tokens, start + self.tokens_per_column))

    def _row_top(self, rank: int, row: str | None) -> int:
        top = self.top + rank * (self.rank_height + RANK_GAP)
        if row is None:
            return top
        row_pitch = FIELD_ROW_HEIGHT + ROW_GAP
        return top + OWNERSHIP_ROW_HEIGHT + ROW_GAP + self.rows.index(row) * row_pitch

    def cell(self, rank: int, column: int, row: str | None = None) -> Box:
        """The ownership cell (``row=None``) or field cell of one column on one rank,
        without its gutter."""
        x0 = self.left + column * self.cell_width
        y0 = self._row_top(rank, row)
        height = OWNERSHIP_ROW_HEIGHT if row is None else FIELD_ROW_HEIGHT
        return Box(x0, y0, x0 + self.cell_width - self.gutter, y0 + height)


def _mean_color(colors: Sequence[Rgb]) -> Rgb:
    r, g, b = (round(sum(c[i] for c in colors) / len(colors)) for i in range(3))
    return r, g, b


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """Pillow's bundled font (no system font needed), at ``size`` when FreeType is there."""
    return ImageFont.load_default(size=size)


def verdict_label(result: CaseResult) -> str:
    return result.status.upper()


def case_label(result: CaseResult) -> str:
    return f"{result.scenario}[dcp{result.dcp_size}]"


def _summary_lines(case: CaseMap, kernel_name: str) -> list[str]:
    r = case.result
    if r.error:
        detail = r.error
    elif r.failed_checks:
        detail = "failed: " + ", ".join(c.check for c in r.failed_checks)
    else:
        ran = [c for c in r.checks if c.skipped is None]
        detail = f"{len(ran)} checks passed, {len(r.checks) - len(ran)} not applicable"
    return [f"{case_label(r)}  {verdict_label(r)}  ({kernel_name})", detail]


def _layout_line(case: CaseMap, geometry: MapGeometry) -> str:
    s, batch = case.scenario, case.scenario.batch
    line = (
        f"{batch.num_real_tokens} token(s) + {batch.padding} padding, block_size "
        f"{s.block_size}, interleave {s.interleave}, {s.cache_layout.value} cache"
    )
    if geometry.tokens_per_column > 1:
        line += f"; {geometry.tokens_per_column} tokens per pixel column"
    return line


def _strip(colors: Sequence[Rgb], geometry: MapGeometry, height: int) -> Image.Image:
    """One map row: a colour per column, ``cell_width`` pixels each (gutter white)."""
    pixels: list[Rgb] = []
    for color in colors:
        pixels += [color] * (geometry.cell_width - geometry.gutter) + [BACKGROUND] * geometry.gutter
    row = Image.new("RGB", (len(pixels), 1))
    row.putdata(pixels)
    return row.resize((len(pixels), height), Image.Resampling.NEAREST)


def _tick_step(geometry: MapGeometry) -> int:
    """Tokens between axis labels: the smallest of 1, 2, 5, 10, 20, 50, ... that keeps
    labels ``MIN_TICK_SPACING`` pixels apart."""
    pixels_per_token = geometry.cell_width / geometry.tokens_per_column
    magnitude = 1
    while True:
        for step in (magnitude, 2 * magnitude, 5 * magnitude):
            if step * pixels_per_token >= MIN_TICK_SPACING:
                return step
        magnitude *= 10


def render_map_png(case: CaseMap, kernel_name: str) -> bytes:
    """The PNG of one case: header, token axis, one band per rank, legend, replay."""
    geometry = MapGeometry(case.num_tokens, case.num_ranks, case.rows)
    title_font, font, small = _font(15), _font(12), _font(10)
    header = _summary_lines(case, kernel_name)
    unplaced = list(case.unplaced[:UNPLACED_SHOWN])
    if len(case.unplaced) > UNPLACED_SHOWN:
        hidden = len(case.unplaced) - UNPLACED_SHOWN
        unplaced.append(f"... and {hidden} more finding(s) with no token (all in {REPORT_HTML})")
    footer = [*case.ownership_tally(), f"replay: {case.result.replay}", *unplaced]
    text_width = max(
        int(font.getlength(line)) for line in [*header, *footer, _layout_line(case, geometry)]
    )
    legend_height = LINE_HEIGHT * (2 + len(footer))
    width = max(geometry.left + geometry.map_width, MARGIN + text_width, 640) + MARGIN
    height = geometry.map_bottom + legend_height + MARGIN
    image = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(image)

    draw.text((MARGIN, MARGIN), header[0], fill=TEXT_COLOR, font=title_font)
    verdict_color = TEXT_COLOR if case.result.status == "pass" else BAD_COLOR
    draw.text((MARGIN, MARGIN + 20), header[1], fill=verdict_color, font=font)
    draw.text((MARGIN, geometry.top - AXIS_HEIGHT), "token", fill=TEXT_COLOR, font=small)
    step = _tick_step(geometry)
    for token in range(0, case.num_tokens, step):
        x = geometry.left + round(token * geometry.cell_width / geometry.tokens_per_column)
        draw.text((x, geometry.top - AXIS_HEIGHT), str(token), fill=TEXT_COLOR, font=small)

    columns = range(geometry.num_columns)
    for rank in range(case.num_ranks):
        owner_colors = [
            _mean_color(
                [OWNERSHIP_COLORS[case.ownership[rank][t]] for t in geometry.column_tokens(c)]
            )
            for c in columns
        ]
        bad = [
            set().union(*(case.bad_rows(rank, t) for t in geometry.column_tokens(c)))
            for c in columns
        ]
        box = geometry.cell(rank, 0)
        image.paste(_strip(owner_colors, geometry, OWNERSHIP_ROW_HEIGHT), (box.x0, box.y0))
        draw.text((MARGIN, box.y0 + 2), f"rank {rank}", fill=TEXT_COLOR, font=font)
        for row in case.rows:
            colors = [
                BAD_COLOR if row in bad[c] else _whiten(owner_colors[c], FIELD_OK_WHITENESS)
                for c in columns
            ]
            box = geometry.cell(rank, 0, row)
            image.paste(_strip(colors, geometry, FIELD_ROW_HEIGHT), (box.x0, box.y0))
            draw.text((MARGIN + 12, box.y0 - 1), row, fill=TEXT_COLOR, font=small)

    y = geometry.map_bottom
    x = MARGIN
    legend = [
        (OWNERSHIP_COLORS[OWNED], "owned"),
        (OWNERSHIP_COLORS[FOREIGN], "foreign"),
        (OWNERSHIP_COLORS[PADDING], "padding"),
        (_whiten(OWNERSHIP_COLORS[OWNED], FIELD_OK_WHITENESS), "field: no finding"),
        (BAD_COLOR, "field: bad"),
    ]
    for color, name in legend:
        draw.rectangle((x, y + 2, x + 11, y + 13), fill=color)
        draw.text((x + 16, y), name, fill=TEXT_COLOR, font=font)
        x += 16 + int(font.getlength(name)) + 18
    draw.text((MARGIN, y + LINE_HEIGHT), _layout_line(case, geometry), fill=TEXT_COLOR, font=font)
    for i, line in enumerate(footer):
        draw.text((MARGIN, y + LINE_HEIGHT * (2 + i)), line, fill=TEXT_COLOR, font=font)

    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------
# HTML

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
        parts.append(f"<p>{html.escape(case.scenario.description)}</p>")
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


def png_name(result: CaseResult) -> str:
    """File name of a case's map (scenario names are file-name safe: ``NAME_PATTERN``)."""
    return f"{result.scenario}-dcp{result.dcp_size}.png"


def write_report_dir(
    results: list[CaseResult],
    scenarios: Sequence[Scenario],
    out_dir: Path,
    *,
    kernel_name: str,
) -> list[Path]:
    """Write the ownership-map report of a run into ``out_dir`` (created if missing).

    Returns the paths written: ``index.html`` first, then one PNG per result whose
    scenario is among ``scenarios`` (a result without one, such as the token-stream
    check, appears in the page without a map).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    by_name = {s.name: s for s in scenarios}
    cases: list[tuple[CaseResult, CaseMap | None, bytes | None]] = []
    pngs: list[Path] = []
    for result in results:
        scenario = by_name.get(result.scenario)
        if scenario is None:
            cases.append((result, None, None))
            continue
        case = build_case_map(result, scenario)
        png = render_map_png(case, kernel_name)
        path = out_dir / png_name(result)
        write_atomic(path, png)
        pngs.append(path)
        cases.append((result, case, png))
    page = out_dir / REPORT_HTML
    write_atomic(page, render_html(cases, kernel_name=kernel_name))
    return [page, *pngs]
