"""Ownership maps: each case drawn as a tokens x ranks grid, coloured by who owns each
token's KV entry, with every field's verdict laid over it.

DCP bugs track ownership: a kernel that skips per-token work on slot ``-1`` leaves
exactly the *foreign* cells bad. Listed as findings that is a wall of lines; drawn as a
grid it is one picture, "foreign-token stripes": on every rank, the ``kv_out`` and
``kpe_out`` rows are red wherever the ownership row is amber, and fine where it is blue.

Each rank is a band of rows: the ownership row (blue owned, amber foreign, grey padding,
as ``SlotMappings.ownership`` codes them; the MLA cache's mapping, the one DCP shards),
then one row per field (the op's rows; a cache finding such as ``mla_cache.kpe`` marks the
``mla_cache`` row), pale where nothing was found and red where some check found that
field bad for that token on that rank (``Finding.tokens``; a stray cache write marks the
token whose encoding it holds). Findings with no token (a modified input, a token-stream
divergence) are listed beside the map, not drawn.

Large batches keep the picture at most ``MAX_MAP_COLUMNS`` pixels wide by grouping
consecutive tokens per pixel column: the column's ownership colour is the mean of its
tokens' colours, and a field cell is red if *any* of its tokens is bad, so no failure is
averaged away. Per-token truth stays in the HTML for cases of up to
``map_page.TOKEN_TABLE_MAX_TOKENS`` tokens: a table cell per token and rank whose tooltip
names the token, its position, its ownership and every finding on it.

``write_report_dir`` writes ``index.html`` (self-contained: inline CSS, the maps embedded
as base64 PNG, nothing loaded from the network) and one ``<scenario>-dcp<N>.png`` per
case, each atomically. The same inputs give the same bytes (no timestamps).

This module draws the maps and writes the report directory. What a map shows is
``dcpcheck.cases.case_map``, built by the op (``OpPackage.case_map``); the page around
the maps is ``dcpcheck.output.map_page``; the colours both use are
``dcpcheck.output.map_colors``.

To look at a report as a browser shows it (Debian's ``chromium`` package; the
networking flags keep it from reaching out, which fails on a closed network)::

    chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \\
        --disable-background-networking --disable-component-update --disable-sync \\
        --user-data-dir="$(mktemp -d)" --window-size=1400,1000 \\
        --screenshot=/tmp/ownership-map.png "file://$PWD/REPORT_DIR/index.html"
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from dcpcheck.cases.case_map import CaseMap, case_label, verdict_label
from dcpcheck.cases.dcp import FOREIGN, OWNED, PADDING
from dcpcheck.cases.verdicts import CaseResult
from dcpcheck.files import write_atomic
from dcpcheck.output.map_colors import (
    BACKGROUND,
    BAD_COLOR,
    FIELD_OK_WHITENESS,
    OWNERSHIP_COLORS,
    TEXT_COLOR,
    Rgb,
)
from dcpcheck.output.map_page import render_html

REPORT_HTML = "index.html"
"""The report page inside the report directory."""

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


def _whiten(color: Rgb, whiteness: float) -> Rgb:
    r, g, b = (round(c + (255 - c) * whiteness) for c in color)
    return r, g, b


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
    line = case.layout
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
    verdict_color = BAD_COLOR if case.result.failed else TEXT_COLOR
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


def png_name(result: CaseResult) -> str:
    """File name of a case's map (scenario names are file-name safe: ``NAME_PATTERN``)."""
    return _png_name(result.scenario, result.dcp_size)


def _png_name(scenario: str, dcp_size: int) -> str:
    return f"{scenario}-dcp{dcp_size}.png"


def report_files(out_dir: Path, cases: Iterable[tuple[str, int]]) -> list[Path]:
    """The files :func:`write_report_dir` writes into ``out_dir`` for ``cases`` (scenario
    name, DCP size), known before they run: the page, and each case's map."""
    return [out_dir / REPORT_HTML, *(out_dir / _png_name(name, size) for name, size in cases)]


def write_report_dir(
    results: list[CaseResult],
    scenarios: Sequence[Any],  # the op's, each with its ``name``
    out_dir: Path,
    *,
    kernel_name: str,
    case_map: Callable[[CaseResult, Any], CaseMap],
) -> list[Path]:
    """Write the ownership-map report of a run into ``out_dir`` (created if missing);
    ``case_map`` is the op's (``OpPackage.case_map``) of a result and its scenario.

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
        case = case_map(result, scenario)
        png = render_map_png(case, kernel_name)
        path = out_dir / png_name(result)
        write_atomic(path, png)
        pngs.append(path)
        cases.append((result, case, png))
    page = out_dir / REPORT_HTML
    write_atomic(page, render_html(cases, kernel_name=kernel_name))
    return [page, *pngs]
