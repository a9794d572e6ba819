"""Ownership maps: the PNG shows ownership and each field's verdict where they are, the
HTML page is self-contained and holds per-token truth, files land atomically.

The reference case is the PR 54908 regression on one decode token under DCP4 (docs/dcp-contract.md):
rank 1 owns token 0, ranks 0, 2 and 3 see it as foreign and leave its ``kv_out`` and
``kpe_out`` rows unwritten. So on the map exactly the ``kv_out``/``kpe_out`` cells of the
three foreign ranks must be red, and the owner's must not.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
from PIL import Image

from dcpcheck.cases.dcp import Batch, Request
from dcpcheck.cases.verdicts import CaseResult, CheckResult, Finding, RunConfig
from dcpcheck.ops.fused_norm_rope.case_maps import case_map
from dcpcheck.ops.fused_norm_rope.kernels import load_kernel
from dcpcheck.ops.fused_norm_rope.runner import run_scenario
from dcpcheck.ops.fused_norm_rope.scenario import SCENARIOS, load_scenario
from dcpcheck.output import ownership_map
from dcpcheck.output.ownership_map import MapGeometry
from tests.conftest import BACKEND

write_report_dir = functools.partial(ownership_map.write_report_dir, case_map=case_map)
"""The report directory of fused-op cases, as ``run --report-dir`` writes it."""

OWNED_RGB = (49, 120, 181)
FOREIGN_RGB = (242, 176, 53)
PADDING_RGB = (170, 170, 170)
BAD_RGB = (200, 16, 46)
WHITE = (255, 255, 255)

INDEXER_LAYER_ROWS = (
    "q_out",
    "kv_out",
    "kpe_out",
    "index_k_out",
    "topk_indices",
    "mla_cache",
    "index_cache",
)
"""Field rows of an indexer layer's map, in the documented order."""

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def decode_single():
    return load_scenario(SCENARIOS / "decode-single-dcp4.toml")


@pytest.fixture(scope="module")
def pre_54908_result(decode_single) -> CaseResult:
    kernel = load_kernel("regress/pre-54908")
    config = RunConfig("regress/pre-54908", (4,))
    [result] = run_scenario(kernel, decode_single, config, BACKEND)
    assert result.status == "fail"
    return result


@pytest.fixture(scope="module")
def report_dir(pre_54908_result, decode_single, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    streams = CaseResult("token-streams", 4, "pass", replay="dcpcheck hash --dcp 1,4")
    write_report_dir(
        [pre_54908_result, streams], [decode_single], out, kernel_name="regress/pre-54908"
    )
    return out


def _runs(image: Image.Image, x: int, y0: int, y1: int) -> list[tuple[tuple[int, ...], int]]:
    """(colour, height) of each run of one colour down column ``x``, white runs dropped."""
    runs: list[tuple[tuple[int, ...], int]] = []
    for y in range(y0, y1):
        pixel = image.getpixel((x, y))[:3]
        if runs and runs[-1][0] == pixel:
            runs[-1] = (pixel, runs[-1][1] + 1)
        else:
            runs.append((pixel, 1))
    return [(color, height) for color, height in runs if color != WHITE]


def _map_colors(image: Image.Image, geometry: MapGeometry) -> set[tuple[int, ...]]:
    """The colours inside the map's area (the header and legend use the same colours)."""
    area = (geometry.left, geometry.top, geometry.left + geometry.map_width, geometry.map_bottom)
    return {color for _, color in image.crop(area).getcolors(1 << 16)}


def test_pre_54908_map_marks_exactly_the_foreign_kv_and_kpe_cells(report_dir):
    image = Image.open(report_dir / "decode-single-dcp4-dcp4.png").convert("RGB")
    geometry = MapGeometry(num_tokens=1, num_ranks=4, rows=INDEXER_LAYER_ROWS)
    assert image.width >= geometry.left + geometry.map_width
    assert image.height > geometry.map_bottom

    x = geometry.cell(0, 0).center[0]
    runs = _runs(image, x, geometry.top, geometry.map_bottom)
    assert len(runs) == 4 * (1 + len(INDEXER_LAYER_ROWS))  # per rank: ownership + 7 fields
    for rank in range(4):
        band = runs[rank * 8 : rank * 8 + 8]
        ownership_color, ownership_height = band[0]
        assert ownership_color == (OWNED_RGB if rank == 1 else FOREIGN_RGB)
        assert ownership_height == ownership_map.OWNERSHIP_ROW_HEIGHT
        for row, (color, height) in zip(INDEXER_LAYER_ROWS, band[1:], strict=True):
            assert height == ownership_map.FIELD_ROW_HEIGHT
            bad = rank != 1 and row in ("kv_out", "kpe_out")
            assert (color == BAD_RGB) == bad, (rank, row, color)
            if not bad:  # pale tint of the ownership colour: lighter in every channel
                assert all(c >= o for c, o in zip(color, ownership_color, strict=True))


def test_pixel_at_a_cell_is_its_ownership_or_verdict(report_dir):
    image = Image.open(report_dir / "decode-single-dcp4-dcp4.png").convert("RGB")
    geometry = MapGeometry(num_tokens=1, num_ranks=4, rows=INDEXER_LAYER_ROWS)
    assert image.getpixel(geometry.cell(2, 0).center) == FOREIGN_RGB
    assert image.getpixel(geometry.cell(1, 0).center) == OWNED_RGB
    assert image.getpixel(geometry.cell(3, 0, "kpe_out").center) == BAD_RGB
    assert image.getpixel(geometry.cell(3, 0, "q_out").center) != BAD_RGB


def test_html_is_self_contained_and_holds_per_token_truth(report_dir):
    page = (report_dir / "index.html").read_text(encoding="utf-8")
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"<(script|link|iframe)\b", page)
    assert re.findall(r'src="([^"]*)"', page) and all(
        src.startswith("data:image/png;base64,") for src in re.findall(r'src="([^"]*)"', page)
    )
    # the embedded map is the PNG file written beside the page
    [embedded] = re.findall(r'src="data:image/png;base64,([^"]*)"', page)
    assert base64.b64decode(embedded) == (report_dir / "decode-single-dcp4-dcp4.png").read_bytes()
    # per-token tooltips, verdict, findings, tally and replay
    assert (
        'title="token 0 (position 37) on rank 0: foreign; bad: outputs: kv_out, '
        'outputs: kpe_out, ranks_agree: kv_out, ranks_agree: kpe_out"' in page
    )
    assert 'title="token 0 (position 37) on rank 1: owned; no finding"' in page
    assert "kv_out: bad on 0 of 1 owned, 3 of 3 foreign cells" in page
    assert (
        "outputs: kv_out on rank 0, first bad token 0 (foreign), max error NaN (unwritten)" in page
    )
    assert "dcpcheck run --scenario decode-single-dcp4 --dcp 4 --kernel regress/pre-54908" in page
    assert '<span class="verdict fail">FAIL</span>' in page


def test_writes_page_then_one_png_per_scenario_case(report_dir):
    files = sorted(p.name for p in report_dir.iterdir())
    assert files == ["decode-single-dcp4-dcp4.png", "index.html"]  # no temporary files left
    page = (report_dir / "index.html").read_text(encoding="utf-8")
    assert "token-streams[dcp4]" in page  # a result without a scenario: listed, no map
    assert "No ownership map" in page


def test_return_value_lists_written_files(pre_54908_result, decode_single, tmp_path):
    written = write_report_dir(
        [pre_54908_result], [decode_single], tmp_path / "new" / "dir", kernel_name="k"
    )
    assert written == [
        tmp_path / "new/dir/index.html",
        tmp_path / "new/dir/decode-single-dcp4-dcp4.png",
    ]
    assert all(path.is_file() for path in written)
    assert Image.open(written[1]).format == "PNG"


def test_same_results_give_the_same_bytes(pre_54908_result, decode_single, tmp_path):
    first = write_report_dir([pre_54908_result], [decode_single], tmp_path / "a", kernel_name="k")
    second = write_report_dir([pre_54908_result], [decode_single], tmp_path / "b", kernel_name="k")
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]


def test_interrupted_write_leaves_previous_report_whole(
    pre_54908_result, decode_single, tmp_path, monkeypatch
):
    write_report_dir([pre_54908_result], [decode_single], tmp_path, kernel_name="first")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def fail_rename(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail_rename)
    with pytest.raises(OSError, match="disk full"):
        write_report_dir([pre_54908_result], [decode_single], tmp_path, kernel_name="second")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_large_batch_groups_tokens_per_column_without_hiding_a_bad_token(tmp_path):
    small = load_scenario(SCENARIOS / "decode-single-dcp4.toml")
    big = dataclasses.replace(
        small, name="big", batch=Batch((Request(prefix=10, new=4000),)), source=None
    )
    bad_token = 2001
    finding = Finding(
        "kv_out", 0, "1 token row(s) differ", bad_token, "foreign", "3 ulp", 1, (2001,)
    )
    result = CaseResult("big", 4, "fail", [CheckResult("outputs", (finding,))], replay="r")
    [page, png] = write_report_dir([result], [big], tmp_path, kernel_name="k")

    image = Image.open(png).convert("RGB")
    geometry = MapGeometry(num_tokens=4000, num_ranks=4, rows=INDEXER_LAYER_ROWS)
    assert geometry.tokens_per_column == 3  # ceil(4000 / 1600)
    assert geometry.num_columns <= ownership_map.MAX_MAP_COLUMNS
    assert image.width <= geometry.left + ownership_map.MAX_MAP_COLUMNS + ownership_map.MARGIN
    column = bad_token // 3
    assert image.getpixel(geometry.cell(0, column, "kv_out").center) == BAD_RGB
    for neighbour in (column - 1, column + 1):
        assert image.getpixel(geometry.cell(0, neighbour, "kv_out").center) != BAD_RGB
    assert image.getpixel(geometry.cell(1, column, "kv_out").center) != BAD_RGB
    text = page.read_text(encoding="utf-8")
    assert '<table class="tokens">' not in text  # per-token tables only for small cases
    assert "kv_out: bad on 0 of 4000 owned, 1 of 12000 foreign cells" in text


def test_error_case_shows_ownership_and_the_kernel_error(decode_single, tmp_path):
    result = CaseResult(
        "decode-single-dcp4", 4, "error", error="rank 0: RuntimeError: boom", replay="r"
    )
    [page, png] = write_report_dir([result], [decode_single], tmp_path, kernel_name="k")
    text = page.read_text(encoding="utf-8")
    assert (
        "rank 0: RuntimeError: boom" in text and '<span class="verdict error">ERROR</span>' in text
    )
    image = Image.open(png).convert("RGB")
    map_colors = _map_colors(image, MapGeometry(num_tokens=1, num_ranks=4, rows=INDEXER_LAYER_ROWS))
    assert OWNED_RGB in map_colors and FOREIGN_RGB in map_colors
    assert BAD_RGB not in map_colors


def test_padding_rows_are_grey(tmp_path):
    scenario = load_scenario(SCENARIOS / "mixed-prefill-decode-padding.toml")
    result = CaseResult(scenario.name, 2, "pass", replay="r")
    [_, png] = write_report_dir([result], [scenario], tmp_path, kernel_name="k")
    image = Image.open(png).convert("RGB")
    tokens = scenario.batch.num_tokens
    geometry = MapGeometry(num_tokens=tokens, num_ranks=2, rows=INDEXER_LAYER_ROWS)
    for rank in range(2):
        assert image.getpixel(geometry.cell(rank, tokens - 1).center) == PADDING_RGB


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium")
def test_report_renders_in_headless_chromium(report_dir, tmp_path):
    screenshot = tmp_path / "screenshot.png"
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}",
        f"--screenshot={screenshot}",
        "--window-size=1400,2000",
        (report_dir / "index.html").as_uri(),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    image = Image.open(screenshot).convert("RGB")
    assert image.size == (1400, 2000)
    colors = image.getcolors(maxcolors=1 << 20)
    assert len(colors) >= 16  # text, swatches, map: not a blank page

    def shown(target: tuple[int, int, int]) -> bool:
        return any(
            max(abs(a - b) for a, b in zip(color, target, strict=True)) <= 6 for _, color in colors
        )

    assert shown(FOREIGN_RGB) and shown(OWNED_RGB) and shown(BAD_RGB)


def test_findings_with_no_token_are_listed_not_drawn_and_bounded(decode_single, tmp_path):
    def report(count: int) -> tuple[Image.Image, str]:
        findings = tuple(
            Finding("mla_cache", 0, f"entry {i} (guard after) changed: 3 byte(s)")
            for i in range(count)
        )
        result = CaseResult(
            decode_single.name, 4, "fail", [CheckResult("guard_bands", findings)], replay="r"
        )
        [page, png] = write_report_dir(
            [result], [decode_single], tmp_path / str(count), kernel_name="k"
        )
        return Image.open(png).convert("RGB"), page.read_text(encoding="utf-8")

    few, few_page = report(ownership_map.UNPLACED_SHOWN + 1)
    many, many_page = report(100)
    geometry = MapGeometry(num_tokens=1, num_ranks=4, rows=INDEXER_LAYER_ROWS)
    assert BAD_RGB not in _map_colors(few, geometry)
    assert many.size == few.size  # the PNG lists a few; the page lists all
    assert many_page.count("guard_bands: mla_cache on rank 0: entry") == 100
    assert few_page.count("guard_bands: mla_cache on rank 0: entry") == 7
