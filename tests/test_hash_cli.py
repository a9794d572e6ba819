"""`dcpcheck hash`: full SHA256 digests on screen and in ``--json``, checked with hashlib.

The expected digests are recomputed here from the tokens the report lists, with the rule
it states (``hash_of``): token ids as little-endian int32, a request's steps in order, a
stream's requests concatenated in order. The first divergence of a broken kernel is found
here by scanning those tokens, not taken from the library.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import sys

import pytest

from dcpcheck.cli import main
from dcpcheck.cli.hashing import _rank_list
from tests.conftest import BACKEND

SMALL = ["--prompts", "2", "--steps", "3"]
"""Two requests of three tokens: enough for 64-hex digests and a divergence, fast on the
interpreter."""

HEX64 = re.compile(r"[0-9a-f]{64}")


def run_hash(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """``dcpcheck hash ARGS`` in this process: exit code, stdout, stderr."""
    monkeypatch.setattr(sys, "argv", ["dcpcheck", "hash", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    captured = capsys.readouterr()
    return exited.value.code, captured.out, captured.err


def sha256_int32(tokens: list[int]) -> str:
    return hashlib.sha256(b"".join(struct.pack("<i", t) for t in tokens)).hexdigest()


def assert_digests_are_sha256_of_tokens(doc: dict, prompts: int, steps: int) -> None:
    assert "little-endian int32" in doc["hash_of"]
    for stream in doc["digests"]:
        tokens = stream["tokens"]
        assert len(tokens) == prompts and all(len(row) == steps for row in tokens)
        assert HEX64.fullmatch(stream["stream"]), stream["stream"]
        assert stream["requests"] == [sha256_int32(row) for row in tokens]
        assert stream["stream"] == sha256_int32([t for row in tokens for t in row])


def test_hash_json_has_each_streams_full_sha256_and_tokens(monkeypatch, capsys, tmp_path):
    report = tmp_path / "out.json"
    code, out, _ = run_hash(monkeypatch, capsys, "--dcp", "1,4", *SMALL, "--json", str(report))
    assert code == 0
    doc = json.loads(report.read_text())
    assert [(s["dcp_size"], s["rank"]) for s in doc["digests"]] == [(1, 0)] + [
        (4, r) for r in range(4)
    ]
    assert_digests_are_sha256_of_tokens(doc, prompts=2, steps=3)
    digest = doc["digests"][0]["stream"]
    assert all(s["stream"] == digest and s["matches_dcp1"] for s in doc["digests"])
    assert doc["identical"] is True and doc["first_divergence"] is None and doc["error"] is None
    # The narrowest DCP1 margin over its rounding bound (below 1 here: these short streams
    # are not the default ones, whose every step clears its bound).
    assert doc["min_dcp1_margin_over_bound"] > 0
    assert (doc["kernel"], doc["model"]["prompts"], doc["model"]["steps"]) == ("default", 2, 3)
    # On screen: the full digest once, with every run that produced it.
    assert f"{digest}  DCP1 rank 0; DCP4 ranks 0-3" in out.splitlines()


def test_a_diverging_kernel_exits_1_and_its_json_records_the_first_divergence(
    monkeypatch, capsys, tmp_path
):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    # Seed 1: the DCP1 margin where DCP4 first diverges is wide (0.27), a genuine bug.
    args = ["--dcp", "1,4", "--kernel", "regress/pre-54908", *SMALL, "--seed", "1"]
    code, out, _ = run_hash(monkeypatch, capsys, *args, "--json", str(first))
    assert code == 1
    code, _, _ = run_hash(monkeypatch, capsys, *args, "--json", str(second))
    assert code == 1
    assert first.read_bytes() == second.read_bytes()  # deterministic: no times, same floats

    doc = json.loads(first.read_text())
    assert_digests_are_sha256_of_tokens(doc, prompts=2, steps=3)
    baseline, *others = doc["digests"]
    assert baseline["dcp_size"] == 1 and doc["identical"] is False
    # The earliest step at which any DCP4 rank left DCP1; ties to rank, then request.
    differences = [
        (step, s["rank"], request, s["tokens"][request][step])
        for s in others
        for request, row in enumerate(s["tokens"])
        for step, token in enumerate(row)
        if token != baseline["tokens"][request][step]
    ]
    step, rank, request, token = min(differences)
    divergence = doc["first_divergence"]
    assert (divergence["dcp_size"], divergence["rank"]) == (4, rank)
    assert (divergence["request"], divergence["step"], divergence["token"]) == (
        request,
        step,
        token,
    )
    assert divergence["baseline_token"] == baseline["tokens"][request][step]
    # pre-54908 leaves K rows unwritten (NaN) on foreign ranks: a DCP1 margin past its
    # rounding bound, NaN logits here, which strict JSON has no literal for.
    assert divergence["near_tie"] is False and divergence["margin"] is None
    assert divergence["finite"] is False
    assert divergence["baseline_margin"] > divergence["bound"] > 0
    assert "with non-finite logits): genuine divergence" in divergence["summary"]
    assert not any(s["matches_dcp1"] for s in others)
    differing = {s["stream"] for s in others}
    assert differing and baseline["stream"] not in differing
    for digest in differing:
        assert any(
            line.startswith(f"{digest}  DCP4") and line.endswith("(differs from DCP1)")
            for line in out.splitlines()
        ), out


def test_an_unwritable_json_path_is_exit_2_before_any_work(monkeypatch, capsys, tmp_path):
    missing = tmp_path / "no-such-dir" / "out.json"
    code, out, err = run_hash(monkeypatch, capsys, "--json", str(missing))
    assert code == 2 and "does not exist" in err and "token streams" not in out
    code, _, err = run_hash(monkeypatch, capsys, "--json", str(tmp_path))
    assert code == 2 and "is a directory" in err


def test_a_raising_kernel_replaces_an_earlier_report_with_its_error(monkeypatch, capsys, tmp_path):
    report = tmp_path / "out.json"
    report.write_text('{"identical": true}\n')  # a stale report a CI job might read
    kernel = "tests.kernels_under_test:raises"
    code, _, err = run_hash(
        monkeypatch, capsys, "--kernel", kernel, "--steps", "1", "--json", str(report)
    )
    assert code == 1 and "kernel exploded" in err
    doc = json.loads(report.read_text())
    assert doc["identical"] is False and doc["digests"] == []
    assert "RuntimeError: kernel exploded" in doc["error"]


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([0], "rank 0"),
        ([0, 1, 2, 3], "ranks 0-3"),
        ([3, 0, 2], "ranks 0, 2-3"),
        ([1, 3], "ranks 1, 3"),
    ],
)
def test_rank_lists_collapse_runs_of_ranks(ranks: list[int], text: str) -> None:
    assert _rank_list(ranks) == text


def test_a_dcp_size_the_merge_cannot_share_is_refused_before_any_work(monkeypatch, capsys):
    """``hash --dcp 1,3`` was refused only once the DCP1 streams were generated (10-17 s):
    it is exit 2 before any stage is loaded or any stream generated."""
    from dcpcheck.cli import hashing
    from dcpcheck.e2e import token_streams

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the DCP sizes were checked")

    monkeypatch.setattr(hashing, "chain_stages", no_work)
    monkeypatch.setattr(token_streams, "_generate", no_work)
    code, _, err = run_hash(monkeypatch, capsys, "--dcp", "1,3", *SMALL)
    assert code == 2, err
    heads = 8 if BACKEND.interpreted else 128  # the CPU's tiny model; DeepSeek-V3's widths
    assert err.strip().splitlines()[-1] == (
        "dcpcheck: error: the decode chain cannot run: merge: the reduce-scatter shares the "
        f"model's {heads} heads among the ranks; DCP 3 does not divide them"
    )


def test_comparing_streams_checks_every_size_before_the_dcp1_streams(monkeypatch, device):
    """The run's token-stream case asks ``compare_streams`` too: a size it cannot run is
    found before the DCP1 streams are generated."""
    from dcpcheck.e2e import token_streams
    from dcpcheck.ops.decode_stages import ChainError

    def no_work(*args, **kwargs):
        raise AssertionError("a stream was generated before the DCP sizes were checked")

    monkeypatch.setattr(token_streams, "_generate", no_work)
    config = token_streams.StreamConfig(prompts=2, max_prompt_length=8, steps=3)
    with pytest.raises(ChainError, match="DCP 6 does not divide them"):
        token_streams.compare_streams(lambda *args: None, config, [2, 6], device)
