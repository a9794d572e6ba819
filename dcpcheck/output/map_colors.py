"""The palette of the ownership maps: one set of colours for the PNG and the HTML page.

It exists on its own because both renderings code ownership and verdicts with the same
colours (``dcpcheck.output.ownership_map`` draws them, ``dcpcheck.output.map_page`` fills
its legend, table cells and CSS with them), so a map and the page around it always agree.
"""

from __future__ import annotations

from dcpcheck.cases.dcp import FOREIGN, OWNED, PADDING

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
