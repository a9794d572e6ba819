"""Released vLLM kernels as test subjects (dcpcheck.kernels.releases), and every release from 0.28.0
to 0.33.0 judged right on the CPU, with 0.25.0 - 0.26.0 where their file lay.

The ground truth of each release comes from reading its ``vllm/models/deepseek_v32/common/
kernels.py`` (README, "vLLM's released kernels"):

* 0.25.0 - 0.28.0: the kernel returns before any per-token work on a row whose slot is
  negative, so Q is skipped on every token another rank owns (the PR-50005 bug); K has no
  output. 0.25.0 - 0.26.0 keep it at ``deepseek_v32/nvidia/kernels.py``.
* 0.29.0: Q fixed; the KV/k_pe outputs still skipped on foreign rows (the PR-54908 bug);
  the indexer cache addressed by its shape, so a cache whose blocks lie apart, which its
  callers may pass, is written into the wrong bytes. 0.25.0 - 0.28.0 address both caches
  so, but their callers never pass such a cache (``block_gaps``).
* 0.30.0 - 0.33.0: fixed. The file still returns from the indexer program on a negative
  MLA slot before it reads the indexer slot, so with the indexer's own mapping
  *replicated* (every rank stores every token) foreign tokens' indexer entries are never
  written: the file named by its path fails that case. No caller of 0.30.0 - 0.34.0
  passes such a mapping (``indexer_groups``), so as ``vllm==X`` the case is not applicable
  under DCP, with the lines that show it.

The releases are fetched as ``--kernel vllm==X`` fetches them (pip, then the cache outside
the checkout), so a second run reads the cache. Where the package registry cannot be
reached and a release is not cached, its tests skip with that reason.
"""

from __future__ import annotations

import base64
import builtins
import dataclasses
import errno
import functools
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dcpcheck.cases.verdicts import CaseResult, RunConfig
from dcpcheck.cli import cli
from dcpcheck.kernels import release_lock, releases
from dcpcheck.kernels.loading import KernelLoadError, KernelSpecError
from dcpcheck.op_registry import OPS, SLOT_MAPPING
from dcpcheck.ops.fused_norm_rope import block_gaps, indexer_groups
from dcpcheck.ops.fused_norm_rope.contract import DsMlaScale
from dcpcheck.ops.fused_norm_rope.kernels import judged_files, load_kernel
from dcpcheck.ops.fused_norm_rope.runner import run_scenario
from dcpcheck.ops.fused_norm_rope.scenario import load_scenarios
from dcpcheck.ops.fused_norm_rope.vllm import VllmFusedNormRope
from tests.conftest import BACKEND, registry_problem


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


# -- the release spec and its cache, offline -------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("vllm==0.29.0", releases.ReleaseSpec("0.29.0")),
        ("vllm==0.33.0:fused_q", releases.ReleaseSpec("0.33.0", "fused_q")),
        ("vllm==0.30.0rc1", releases.ReleaseSpec("0.30.0rc1")),
        ("vllm==0.30", releases.ReleaseSpec("0.30.0")),  # as pip compares versions
        ("vllm==0.30.0.0", releases.ReleaseSpec("0.30.0")),
        ("vllm==00.030.0", releases.ReleaseSpec("0.30.0")),
        ("vllm==0.9.0.1", releases.ReleaseSpec("0.9.0.1")),  # a published four-part one
        ("vllm==0.6.1.post2", releases.ReleaseSpec("0.6.1.post2")),
        ("vllm>=0.29", None),
        ("vllm==", None),
        ("mypkg.kernels:fused_norm_rope", None),
        ("default", None),
    ],
)
def test_a_release_is_named_vllm_equals_version(spec, expected):
    assert releases.parse_spec(spec) == expected


@pytest.mark.parametrize("spec", ["vllm==0.3O.0", "vllm==latest", "vllm==0.30.0-1", "vllm==.1"])
def test_a_release_spec_that_is_no_version_is_refused_as_written(spec):
    with pytest.raises(releases.MalformedVersion, match="is not a version"):
        releases.parse_spec(spec)
    with pytest.raises(KernelSpecError, match="is not a version"):
        load_kernel(spec)


def test_versions_order_as_pip_orders_them():
    published = ["0.10.1.1", "0.9.0", "0.10.1", "0.10.0", "0.10.1rc1", "0.10.1.post1"]
    ordered = sorted(published, key=releases.version_key)
    assert ordered == ["0.9.0", "0.10.0", "0.10.1rc1", "0.10.1", "0.10.1.post1", "0.10.1.1"]


NO_LOCK = release_lock.Lock(releases.PACKAGE, releases.KEPT_MEMBERS, {})
"""A lock file that knows no release."""


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    """An empty release cache, and a lock file that knows no release: the fake wheels
    below stand for releases the lock does not know, checked against their RECORD alone
    (tests/test_release_lock.py checks the lock)."""
    monkeypatch.setenv("DCPCHECK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(release_lock, "shipped", lambda: NO_LOCK)
    return tmp_path / "cache"


def _record_line(member: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{member},sha256={digest},{len(data)}\n"


def _fake_download(
    member_bytes: bytes | None,
    calls: list[str],
    recorded: bytes | None = None,
    others: tuple[str, ...] = (),
):
    """A stand-in for pip: writes a wheel holding the kernel file (or not) and a RECORD
    giving the SHA256 of ``recorded`` for it (default: of the file itself), and the
    members ``others`` (another op's files) with their own."""

    def download(version: str, into: Path) -> Path:
        calls.append(version)
        wheel = into / f"vllm-{version}-cp38-abi3-manylinux1_x86_64.whl"
        record = "vllm/__init__.py,,\n"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("vllm/__init__.py", "")
            if member_bytes is not None:
                archive.writestr(releases.KERNEL_MEMBER, member_bytes)
                stated = member_bytes if recorded is None else recorded
                record += _record_line(releases.KERNEL_MEMBER, stated)
            for other in others:
                archive.writestr(other, f"# {other}\n")
                record += _record_line(other, f"# {other}\n".encode())
            archive.writestr(f"vllm-{version}.dist-info/RECORD", record)
        return wheel

    return download


def _kernel_file(version: str) -> Path:
    return releases.release_dir(version) / releases.KERNEL_MEMBER


def test_fetch_keeps_only_the_kernel_file_and_reads_the_cache_afterwards(cache_dir, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(releases, "_download_wheel", _fake_download(b"# kernel\n", calls))
    first = releases.fetch("0.29.0")
    second = releases.fetch("0.29.0")
    assert first == second
    assert first.path == cache_dir / "releases" / "vllm" / "0.29.0" / releases.KERNEL_MEMBER
    assert first.path.read_bytes() == b"# kernel\n"
    assert first.sha256 == hashlib.sha256(b"# kernel\n").hexdigest()
    assert calls == ["0.29.0"]  # the second fetch is the cache
    folder = releases.release_dir("0.29.0")
    kept = sorted(p.relative_to(folder).as_posix() for p in cache_dir.rglob("*") if p.is_file())
    assert kept == ["source.json", releases.KERNEL_MEMBER]
    assert not list(cache_dir.rglob("*.whl"))  # the wheel is deleted
    record = json.loads((folder / "source.json").read_text())
    assert record["files"] == {releases.KERNEL_MEMBER: first.sha256}


def test_a_wheel_whose_file_differs_from_its_record_is_refused_and_leaves_nothing(
    cache_dir, monkeypatch
):
    download = _fake_download(b"# kernel\n", [], recorded=b"# another kernel\n")
    monkeypatch.setattr(releases, "_download_wheel", download)
    with pytest.raises(releases.ReleaseError, match="does not match its RECORD"):
        releases.fetch("0.29.0")
    assert not releases.release_dir("0.29.0").exists()
    assert not [p for p in cache_dir.rglob("*") if p.is_file()]


@pytest.fixture
def cached_release(cache_dir, monkeypatch) -> Path:
    """Release 0.29.0 fetched (a vLLM-shaped fixture file), then the network taken away."""
    fixture = Path(__file__).parent / "fixtures" / "vllm_separate_outputs_api.py"
    monkeypatch.setattr(releases, "_download_wheel", _fake_download(fixture.read_bytes(), []))
    path = releases.fetch("0.29.0").path

    def offline(version, into):
        raise AssertionError("no download may be attempted for a cached release")

    monkeypatch.setattr(releases, "_download_wheel", offline)
    return path


def test_a_cached_release_loads_offline(cached_release):
    kernel = load_kernel("vllm==0.29.0")
    assert isinstance(kernel, VllmFusedNormRope)
    assert kernel.name == "vllm==0.29.0"
    assert kernel.ds_mla_scale is None  # the fixture computes no fp8_ds_mla tile scale


TAMPERED = "dcpcheck_tests_tampered_file_ran"


def _changed(path: Path) -> None:
    """Code appended to the cached file: it marks ``builtins`` if the file is ever run."""
    marker = f"\nimport builtins\nbuiltins.{TAMPERED} = True\n"
    path.write_bytes(path.read_bytes() + marker.encode())


def _unrecorded(path: Path) -> None:
    path.parents[4].joinpath("source.json").unlink()


def _unlisted(path: Path) -> None:
    path.parents[4].joinpath("source.json").write_text('{"files": {}}')


def _missing(path: Path) -> None:
    path.unlink()


def _no_record_format(path: Path) -> None:
    """The layout of a cache that kept the file beside a record without the wheel's hashes."""
    folder = path.parents[4]
    folder.joinpath("kernels.py").write_bytes(path.read_bytes())
    folder.joinpath("source.json").write_text('{"sha256": "x", "member": "y"}')


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (_changed, "differs from"),
        (_unrecorded, "cached without a record"),
        (_unlisted, "cached without a record"),
        (_missing, "missing from the release cache"),
        (_no_record_format, "gives no file's SHA256 from its wheel's RECORD"),
    ],
)
def test_a_cache_that_cannot_be_trusted_is_refused_before_any_import(cached_release, damage, words):
    damage(cached_release)
    with pytest.raises(KernelSpecError) as raised:
        load_kernel("vllm==0.29.0")
    message = str(raised.value)
    assert words in message and "\n" not in message
    assert message.endswith("dcpcheck fetch --refresh vllm==0.29.0") or "not a folder" in message
    assert not hasattr(builtins, TAMPERED)  # nothing of the file ran


def test_a_source_record_that_is_a_fifo_is_refused_not_read(cached_release):
    """A FIFO as ``source.json`` hung every command that read it (a read waits for a
    writer): it is a cache fault, one line, exit 2, and never opened. The command runs in
    its own process, so a read that blocks ends in the timeout rather than the suite."""
    record = cached_release.parents[4] / "source.json"
    record.unlink()
    os.mkfifo(record)
    done = subprocess.run(
        [sys.executable, "-m", "dcpcheck", "fetch", "vllm==0.29.0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"dcpcheck: error: {record}: not a regular file; fetch it afresh: "
        "dcpcheck fetch --refresh vllm==0.29.0"
    ]


def test_a_changed_cached_file_is_exit_2_naming_it_and_the_refetch(cached_release):
    _changed(cached_release)
    done = invoke(
        "run",
        "--dcp",
        "1",
        "--no-tokens",
        "--kernel",
        "vllm==0.29.0",
        "--scenario",
        "decode-single-dcp4",
    )
    assert done.exit_code == 2
    assert str(cached_release) in done.output
    assert "dcpcheck fetch --refresh vllm==0.29.0" in done.output


def test_fetch_refresh_replaces_a_changed_file(cached_release, monkeypatch):
    original = cached_release.read_bytes()
    _changed(cached_release)
    monkeypatch.setattr(releases, "_download_wheel", _fake_download(original, []))
    done = invoke("fetch", "--refresh", "vllm==0.29")
    assert done.exit_code == 0, done.output
    assert cached_release.read_bytes() == original
    assert hashlib.sha256(original).hexdigest() in done.output
    assert load_kernel("vllm==0.29.0").name == "vllm==0.29.0"


def test_a_version_is_normalised_so_one_release_has_one_folder_and_one_name(cache_dir, monkeypatch):
    calls: list[str] = []
    fixture = Path(__file__).parent / "fixtures" / "vllm_separate_outputs_api.py"
    monkeypatch.setattr(releases, "_download_wheel", _fake_download(fixture.read_bytes(), calls))
    assert load_kernel("vllm==0.30").name == "vllm==0.30.0"
    assert load_kernel("vllm==0.30.0.0").name == "vllm==0.30.0"
    assert calls == ["0.30.0"]
    assert [p.name for p in (cache_dir / "releases" / "vllm").iterdir()] == ["0.30.0"]


def _pip_answering(stderr: str):
    def run(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", stderr)

    return run


def test_an_unknown_version_is_exit_2_with_the_nearest_published_and_leaves_nothing(
    cache_dir, monkeypatch
):
    stderr = (
        "ERROR: Could not find a version that satisfies the requirement vllm==0.31.5 "
        "(from versions: 0.29.0, 0.30.0, 0.31.0, 0.32.0, 0.33.0)\n"
        "ERROR: No matching distribution found for vllm==0.31.5\n"
    )
    monkeypatch.setattr(releases.subprocess, "run", _pip_answering(stderr))
    with pytest.raises(KernelSpecError) as raised:
        load_kernel("vllm==0.31.5")
    assert str(raised.value) == (
        "vllm==0.31.5: no such release on the package index (nearest published: 0.31.0, 0.32.0)"
    )
    assert not [p for p in cache_dir.rglob("*") if p.name != "vllm" and p.name != "releases"]


def test_an_unreachable_index_is_a_load_error_not_an_unknown_version(cache_dir, monkeypatch):
    stderr = (
        "ERROR: Could not find a version that satisfies the requirement vllm==0.31.0 "
        "(from versions: none)\n"
    )
    monkeypatch.setattr(releases.subprocess, "run", _pip_answering(stderr))
    with pytest.raises(KernelLoadError) as raised:
        load_kernel("vllm==0.31.0")
    assert not isinstance(raised.value, KernelSpecError)


def test_a_cache_folder_that_is_a_file_is_exit_2(tmp_path, monkeypatch):
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("")
    monkeypatch.setenv("DCPCHECK_CACHE", str(not_a_folder))
    monkeypatch.setattr(releases, "_download_wheel", _fake_download(b"# kernel\n", []))
    done = invoke(
        "run", "--kernel", "vllm==0.29.0", "--no-tokens", "--scenario", "decode-single-dcp4"
    )
    assert done.exit_code == 2
    [line] = [line for line in done.output.splitlines() if "Not a directory" in line]
    assert line.startswith("Error: release cache ")  # click's runner prints the one line
    assert "Traceback" not in done.output


def test_a_cache_that_cannot_be_written_is_exit_2(cache_dir, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(cache_dir))

    monkeypatch.setattr(releases.tempfile, "TemporaryDirectory", read_only)
    with pytest.raises(KernelSpecError, match="Read-only file system"):
        load_kernel("vllm==0.29.0")


def test_a_relative_cache_setting_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DCPCHECK_CACHE", "rel/cache")
    assert releases.cache_root() == tmp_path / "rel" / "cache"


def test_an_uncached_release_without_the_registry_is_a_one_line_load_error(cache_dir, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("PIP_NO_INDEX", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    with pytest.raises(KernelLoadError) as raised:
        load_kernel("vllm==0.29.0")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("vllm==0.29.0 is not in dcpcheck's cache")
    assert not releases.release_dir("0.29.0").exists()


def test_a_wheel_without_any_judged_file_is_refused_and_leaves_nothing(cache_dir, monkeypatch):
    monkeypatch.setattr(releases, "_download_wheel", _fake_download(None, []))
    with pytest.raises(releases.ReleaseError, match="its wheel has none of the files dcpcheck"):
        releases.fetch("0.27.0")
    assert not list(cache_dir.rglob("*.whl"))
    assert not releases.release_dir("0.27.0").exists()


def test_a_release_without_one_ops_file_keeps_the_others_and_is_not_fetched_twice(
    cache_dir, monkeypatch
):
    """One download keeps every op's files the wheel has; asking for a file it lacks is
    told from the record, not by downloading the wheel again."""
    calls: list[str] = []
    others = OPS[SLOT_MAPPING].wheel_members
    monkeypatch.setattr(releases, "_download_wheel", _fake_download(None, calls, others=others))
    assert releases.fetch("0.20.0", others[0]).path.read_text() == f"# {others[0]}\n"
    for _ in range(2):
        with pytest.raises(releases.ReleaseError, match="its wheel has no vllm/models/deepseek"):
            releases.fetch("0.20.0")
    kept = [file.path for file in releases.fetch_all("0.20.0")]
    assert kept == [releases.release_dir("0.20.0") / member for member in others]
    assert calls == ["0.20.0"]


def test_reports_name_each_judged_file_and_its_sha256(cached_release, tmp_path):
    json_path, junit_path = tmp_path / "r.json", tmp_path / "r.xml"
    done = invoke(
        "run",
        "--dcp",
        "1",
        "--no-tokens",
        "--kernel",
        "vllm==0.29",
        "--scenario",
        "decode-single-dcp4",
        "--json",
        str(json_path),
        "--junit",
        str(junit_path),
        "--no-isolate",  # a worker would read the lock file this process's fixture empties
    )
    assert done.exit_code == 0, done.output
    sha = hashlib.sha256(cached_release.read_bytes()).hexdigest()
    report = json.loads(json_path.read_text())
    assert report["kernel"] == "vllm==0.29.0"
    assert report["kernel_files"] == [{"path": str(cached_release), "sha256": sha}]
    assert f'name="kernel_file" value="{sha}  {cached_release}"' in junit_path.read_text()


# -- the released kernels themselves ----------------------------------------------------

RELEASES = ("0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0")


@functools.cache
def release_kernel(version: str) -> VllmFusedNormRope:
    """Release ``version`` as ``--kernel vllm==X`` loads it; skips only where the registry
    is unreachable and the release is not cached."""
    try:
        kernel = load_kernel(f"vllm=={version}")
    except KernelLoadError as exc:
        problem = registry_problem()
        if problem is not None:
            pytest.skip(f"vllm=={version} is not cached and the registry is unreachable: {problem}")
        raise AssertionError(
            f"the registry answers, yet vllm=={version} did not load: {exc}"
        ) from exc
    assert isinstance(kernel, VllmFusedNormRope)
    return kernel


def judge(version: str, scenario: str, dcp_size: int) -> CaseResult:
    """One scenario at ``dcp_size`` as ``dcpcheck run`` judges it (limitations applied)."""
    [sc] = load_scenarios([scenario])
    config = RunConfig(f"vllm=={version}", (dcp_size,))
    [result] = run_scenario(release_kernel(version), sc, config, BACKEND)
    assert result.error is None, result.error
    return result


def findings(result: CaseResult) -> set[tuple[str, str, str | None]]:
    """(check, field, ownership of the first bad token) of every failing check."""
    return {(c.check, f.field, f.ownership) for c in result.failed_checks for f in c.findings}


def bad_tokens(result: CaseResult, check: str, field: str) -> dict[int, set[int]]:
    return {
        f.rank: set(f.tokens)
        for c in result.failed_checks
        if c.check == check
        for f in c.findings
        if f.field == field
    }


SMALL = ("decode-single-dcp4", "mixed-prefill-decode-padding", "fp8-ds-mla-cache")
"""Small scenarios the whole matrix runs (auto and fp8_ds_mla layouts, decode, prefill,
spec-decode and padding rows); others join where a verdict hinges on them."""


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize(
    "scenario", [*SMALL, "indexer-sharded", "profiling-call", "shared-layer-no-indexer"]
)
def test_every_release_passes_at_dcp1(version, scenario):
    result = judge(version, scenario, 1)
    assert findings(result) == set()
    assert result.status == "pass"


@pytest.mark.parametrize("version", RELEASES)
def test_a_release_file_tells_its_tile_scale_rule_by_its_source(version):
    """amax up to 0.30.0, pow2 from 0.31.0 on (README), read from the file's own
    tile_scale, not from its version number."""
    pow2 = RELEASES.index(version) >= RELEASES.index("0.31.0")
    rule = DsMlaScale.POW2 if pow2 else DsMlaScale.AMAX
    assert release_kernel(version).ds_mla_scale is rule


@pytest.mark.parametrize("version", ["0.30.0", "0.33.0"])
def test_a_file_is_judged_the_same_by_path_as_by_version(version):
    """A kernel engineer points dcpcheck at the file in a vLLM checkout: the verdict must be
    the one its release gets (both rules: 0.30.0 writes amax, 0.33.0 pow2)."""
    release_kernel(version)
    path = releases.fetch(version).path
    by_path = load_kernel(f"{path}:fused_norm_rope")
    [sc] = load_scenarios(["fp8-ds-mla-cache"])
    for kernel in (by_path, release_kernel(version)):
        [result] = run_scenario(kernel, sc, RunConfig(str(path), (1,)), BACKEND)
        assert result.status == "pass", findings(result)


def _foreign_rows(scenario: str, dcp_size: int) -> dict[int, set[int]]:
    """Per rank, the real tokens another rank owns (what a skipped-output bug leaves)."""
    from dcpcheck.ops.fused_norm_rope.case import build_case

    [sc] = load_scenarios([scenario])
    case = build_case(sc, dcp_size, BACKEND.device)
    real = case.mappings.owner >= 0
    rows = {}
    for rank in range(dcp_size):
        foreign = real & (case.mappings.per_rank[rank].cpu() < 0)
        if foreign.any():
            rows[rank] = set(foreign.nonzero().flatten().tolist())
    return rows


@pytest.mark.parametrize("dcp_size", [2, 4, 8])
@pytest.mark.parametrize(
    ("version", "fields"), [("0.28.0", {"q_out"}), ("0.29.0", {"kv_out", "kpe_out"})]
)
def test_the_buggy_releases_fail_on_exactly_the_foreign_rows_of_what_they_skip(
    version, fields, dcp_size
):
    scenario = "mixed-prefill-decode-padding"
    result = judge(version, scenario, dcp_size)
    assert {check for check, _, _ in findings(result)} == {"outputs", "ranks_agree"}
    assert {field for _, field, _ in findings(result)} == fields
    foreign = _foreign_rows(scenario, dcp_size)
    for field in fields:
        assert bad_tokens(result, "outputs", field) == foreign


@pytest.mark.parametrize("version", RELEASES[2:])
@pytest.mark.parametrize(
    ("scenario", "dcp_size"),
    [(name, 4) for name in SMALL] + [("decode-single-dcp4", 2), ("decode-single-dcp4", 8)],
)
def test_the_fixed_releases_pass_under_dcp_with_their_callers_arguments(
    version, scenario, dcp_size
):
    result = judge(version, scenario, dcp_size)
    assert findings(result) == set()
    skipped = {c.check: c.skipped for c in result.checks if c.skipped}
    assert skipped.get("outputs[index_k_out]") is not None  # not asked for with slots


@pytest.mark.parametrize("version", RELEASES[2:])
def test_a_fixed_release_file_named_by_its_path_drops_a_replicated_indexers_foreign_entries(
    version,
):
    """What the file does (module docstring), judged where it has no release's callers:
    only the indexer cache, only on the tokens whose MLA slot is on another rank."""
    release_kernel(version)
    path = releases.fetch(version).path
    by_path = load_kernel(f"{path}:fused_norm_rope")
    assert isinstance(by_path, VllmFusedNormRope) and by_path.release is None
    scenario = "indexer-replicated"
    [sc] = load_scenarios([scenario])
    [result] = run_scenario(by_path, sc, RunConfig(str(path), (4,)), BACKEND)
    assert {(check, field.split(".")[0]) for check, field, _ in findings(result)} == {
        ("cache_owned", "index_cache"),
        ("shards_reassemble", "index_cache"),  # the owner's shard lacks the entry too
    }
    assert bad_tokens(result, "cache_owned", "index_cache.values") == _foreign_rows(scenario, 4)


INDEXER_APART_READ = (*RELEASES[2:], "0.34.0")
"""The releases whose callers ``indexer_groups`` reads: from the indexer's own mapping on."""


@pytest.mark.parametrize("version", INDEXER_APART_READ)
@pytest.mark.parametrize("dcp_size", [2, 4])
def test_a_replicated_indexer_is_not_applicable_to_a_release_whose_callers_never_pass_one(
    version, dcp_size
):
    """As ``vllm==X`` the case is never launched and never passed; its reason quotes the
    release's lines: the caller's two mappings and the indexer cache's spec."""
    kernel = release_kernel(version)
    assert kernel.release == version
    result = run_release(version, "indexer-replicated", dcp_size)
    assert result.status == "not_applicable" and not result.failed and not result.checks
    assert result.error == indexer_groups.apart_never_passed(version)
    mla, index = indexer_groups.declared(indexer_groups.MAPPINGS_TAKEN, version)
    assert f"deepseek_v32/attention.py:{mla},{index}" in result.error
    spec = indexer_groups.declared(indexer_groups.INDEXER_SPEC, version)
    assert f"deepseek_v2.py:{spec}" in result.error


@pytest.mark.parametrize("version", INDEXER_APART_READ)
def test_a_replicated_indexer_is_still_judged_at_dcp1_where_both_mappings_agree(version):
    result = run_release(version, "indexer-replicated", 1)
    assert result.status == "pass", findings(result)
    assert "cache_owned" in {c.check for c in result.checks if c.skipped is None}
    assert not [c for c in result.checks if "[index_cache]" in c.check]  # nothing declared


def test_0_29_writes_the_indexer_cache_of_a_block_outermost_layout_into_the_wrong_bytes():
    """0.29.0's wrapper takes the indexer cache's block stride from its shape (``shape[2]``)
    while its MLA write reads ``stride(0)``, and its callers may pass caches whose blocks lie
    apart (``VLLM_KV_CACHE_LAYOUT=BLHNC``, README): at DCP1 every finding is the indexer
    cache's, the gaps between its blocks written among them."""
    result = judge("0.29.0", "block-gap", 1)
    found = findings(result)
    assert found and {field.split(".")[0] for _, field, _ in found} == {"index_cache"}, found
    assert ("guard_bands", "index_cache", None) in found


@pytest.mark.parametrize("version", ["0.30.0", "0.34.0"])
@pytest.mark.parametrize("dcp_size", [1, 4])
def test_the_releases_that_address_blocks_by_their_stride_pass_with_blocks_apart(
    version, dcp_size
):
    assert findings(judge(version, "block-gap", dcp_size)) == set()


@pytest.mark.parametrize("version", ["0.25.0", "0.27.1", "0.28.0"])
def test_blocks_apart_are_not_applicable_where_the_callers_never_pass_them(version):
    """0.25.0 - 0.28.0 would write both caches into the wrong bytes (``block_gaps``), but
    none of their callers passes such a cache: N/A as ``vllm==X``, with the lines; judged,
    and failing, as the same file named by its path."""
    result = run_release(version, "block-gap", 2)
    assert result.status == "not_applicable" and not result.checks
    assert result.error == block_gaps.apart_never_passed(version)
    assert f"kv_cache_utils.py:{block_gaps.declared(block_gaps.UNIFORM_TYPE_GROUP, version)}" in (
        result.error
    )
    [judged_file] = judged_files(f"vllm=={version}")
    by_path = load_kernel(f"{judged_file.path}:fused_norm_rope")
    [sc] = load_scenarios(["block-gap"])
    [judged] = run_scenario(by_path, sc, RunConfig("by-path", (1,)), BACKEND)
    assert {field.split(".")[0] for _, field, _ in findings(judged)} == {
        "mla_cache",
        "index_cache",
    }


def edited_release_file(tmp_path: Path, old: str, new: str) -> VllmFusedNormRope:
    """0.34.0's kernel file with its one ``old`` replaced by ``new``, loaded by its path."""
    release_kernel("0.34.0")
    source = releases.fetch("0.34.0").path.read_text()
    assert source.count(old) == 1
    edited = tmp_path / "kernels.py"
    edited.write_text(source.replace(old, new))
    return load_kernel(f"{edited}:fused_norm_rope")


def by_path_at_dcp1(kernel: VllmFusedNormRope, scenario) -> CaseResult:
    """``scenario``'s DCP1 case, judged as a file named by its path is."""
    [result] = run_scenario(kernel, scenario, RunConfig("by-path", (1,)), BACKEND)
    return result


@pytest.mark.parametrize("version", ["0.25.0", "0.30.0", "0.34.0"])
def test_each_api_of_the_file_passes_a_ds_mla_models_profiling_call(version):
    """Q output only (0.25.0), separate outputs (0.30.0), and 0.34.0's ds_mla tiles."""
    assert findings(judge(version, "profiling-ds-mla", 1)) == set()


def test_a_wrapper_that_divides_by_its_tile_count_default_fails_the_ds_mla_profiling_call(
    tmp_path,
):
    """DeepSeek-V3.2's profiling run passes no cache but still names ``fp8_ds_mla`` (0.34.0's
    ``attention.py:359-361, 392``), so 0.34.0's wrapper sizes the tiles from
    ``mla_num_tiles``' default (line 617, divided by at 732). The file with that default 0
    fails ``profiling-ds-mla`` and passes ``profiling-call``, whose cache is ``auto``."""
    kernel = edited_release_file(tmp_path, "    mla_num_tiles = 1\n", "    mla_num_tiles = 0\n")
    [ds_mla] = load_scenarios(["profiling-ds-mla"])
    [auto] = load_scenarios(["profiling-call"])
    failed = by_path_at_dcp1(kernel, ds_mla)
    assert failed.status == "error" and "ZeroDivisionError" in failed.error, failed.error
    passed = by_path_at_dcp1(kernel, auto)
    assert passed.status == "pass", findings(passed)


@pytest.mark.parametrize("version", ["0.25.0", "0.30.0", "0.34.0"])
def test_each_api_of_the_file_passes_one_token_in_fused_rows_at_dcp1(version):
    """Q output only (0.25.0), separate outputs (0.30.0 and 0.34.0), handed inputs and
    outputs laid out as their caller makes them (``activation_rows``). DCP1: the earlier
    files' DCP bugs (PR 50005, 54908) fail the DCP4 case, as on ``decode-single-dcp4``."""
    assert findings(judge(version, "fused-rows-decode-dcp4", 1)) == set()


def test_a_wrapper_that_takes_the_output_row_stride_for_its_width_fails_fused_rows(tmp_path):
    """0.34.0's launch with ``kv_c_out_stride`` and ``kv_dim`` swapped (line 668's call)
    compiles ``KV_DIM`` from the output's row stride. Compact outputs make the two equal;
    the one-token output ``empty_like`` makes of a fused row (vLLM's caller,
    ``attention.py:301-303, 369``) has the fused row's stride, which is no power of two."""
    kernel = edited_release_file(
        tmp_path,
        "        kv_c_out,\n        kv_c_out_stride,\n        kv_dim,\n",
        "        kv_c_out,\n        kv_dim,\n        kv_c_out_stride,\n",
    )
    [fused] = load_scenarios(["fused-rows-decode-dcp4"])
    failed = by_path_at_dcp1(kernel, fused)
    assert failed.status == "error" and "power of 2" in failed.error, failed.error
    passed = by_path_at_dcp1(kernel, dataclasses.replace(fused, activation_rows="separate"))
    assert passed.status == "pass", findings(passed)


@pytest.mark.parametrize("version", ["0.25.0", "0.25.1", "0.26.0"])
def test_the_releases_that_kept_the_kernel_beside_the_nvidia_model_are_judged_there(version):
    """0.25.0 - 0.26.0 keep ``fused_norm_rope`` at ``deepseek_v32/nvidia/kernels.py``, the
    bytes 0.27.0 later moved to ``common/`` (its early return on a negative slot, line
    173): ``vllm==X`` loads it from there, the reports name that file, and Q of exactly the
    foreign rows is never written (the PR-50005 bug)."""
    release_kernel(version)
    [judged] = judged_files(f"vllm=={version}")
    assert judged.path.endswith("vllm/models/deepseek_v32/nvidia/kernels.py")
    assert judged.sha256 == releases.fetch("0.27.0").sha256
    scenario = "mixed-prefill-decode-padding"
    result = judge(version, scenario, 4)
    assert {field for _, field, _ in findings(result)} == {"q_out"}
    assert bad_tokens(result, "outputs", "q_out") == _foreign_rows(scenario, 4)
    assert findings(judge(version, scenario, 1)) == set()


def test_0_28_declares_the_outputs_its_api_has_no_buffer_for():
    result = judge("0.28.0", "decode-single-dcp4", 4)
    skipped = {c.check for c in result.checks if c.skipped}
    assert {"outputs[kv_out]", "outputs[kpe_out]", "outputs[index_k_out]"} <= skipped
    assert "outputs" in {c.check for c in result.checks if not c.skipped}


def test_bisecting_the_releases_names_0_30_0_as_the_first_fixed(tmp_path):
    """``dcpcheck bisect --releases ... --find first-fixed``, as a user runs it."""
    for version in RELEASES:
        release_kernel(version)  # cached (or skipped) before the bisection's subprocesses
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dcpcheck",
            "bisect",
            "--releases",
            ",".join(RELEASES),
            "--find",
            "first-fixed",
            "--scenario",
            "decode-single-dcp4",
            "--dcp",
            "4",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    assert "first fixed release: 0.30.0 vllm 0.30.0" in done.stdout
    runs = [line for line in done.stdout.splitlines() if line.startswith("  ")]
    assert 2 <= len(runs) <= 4  # both ends judged, then log2 of the three between, rounded up
    assert f"{len(runs)} dcpcheck run(s) for 5 revision(s)" in done.stdout


# ----------------------------------------------------------------------------------------
# The newer cache formats: judged where the release has them, declared where
# its API cannot express them, not applicable where this machine cannot run them
# ----------------------------------------------------------------------------------------

FORMAT_ARRIVED = {"indexer-shuffled": "0.31.0", "indexer-mx-scales": "0.33.0"}
"""The first release whose kernel file writes each indexer format (read from the files:
the indexer_cache_shuffled parameter, the mqa_logits_use_mx_scales question)."""

INDEX_CACHE_SKIPS = {
    f"{check}[index_cache]" for check in ("cache_owned", "cache_foreign", "prefix_intact")
}


def run_release(version: str, scenario: str, dcp_size: int) -> CaseResult:
    [sc] = load_scenarios([scenario])
    [result] = run_scenario(release_kernel(version), sc, RunConfig(version, (dcp_size,)), BACKEND)
    return result


@pytest.mark.parametrize("version", RELEASES[2:])
@pytest.mark.parametrize("scenario", sorted(FORMAT_ARRIVED))
@pytest.mark.parametrize("dcp_size", [1, 4])
def test_a_release_writes_the_indexer_formats_it_has_and_declares_the_rest(
    version, scenario, dcp_size
):
    result = run_release(version, scenario, dcp_size)
    assert result.status == "pass", findings(result)
    skipped = {c.check: c.skipped for c in result.checks if c.skipped}
    has_it = RELEASES.index(version) >= RELEASES.index(FORMAT_ARRIVED[scenario])
    if has_it:  # every indexer cache check ran on the format's bytes
        assert not INDEX_CACHE_SKIPS & set(skipped)
    else:
        assert set(skipped) >= INDEX_CACHE_SKIPS
        assert "cannot be asked of it" in skipped["cache_owned[index_cache]"]


def test_0_33_writes_mx_words_only_when_the_case_asks():
    """The stand-in's answer is the case's: the release stores four equal UE8M0 bytes in an
    MX case and the fp32 scale otherwise (the same scenario read both ways)."""
    from dcpcheck.ops.fused_norm_rope.case import build_case
    from dcpcheck.ops.fused_norm_rope.contract import IndexFormat, IndexScale
    from dcpcheck.ops.fused_norm_rope.runner import launch

    [mx] = load_scenarios(["indexer-mx-scales"])
    words = {}
    for scale in IndexScale:
        scenario = dataclasses.replace(mx, index_format=IndexFormat(False, scale))
        case = build_case(scenario, 1, BACKEND.device)
        assert launch(release_kernel("0.33.0"), case).error is None
        rank = case.ranks[0]
        slot = int(rank.inputs.index_slot_mapping[0])
        block, offset = divmod(slot, scenario.block_size)
        index_dim = scenario.model.index_head_dim
        start = scenario.block_size * index_dim + 4 * offset
        words[scale] = rank.index.view[block].reshape(-1)[start : start + 4].tolist()
    exponent = words[IndexScale.MX][0]
    assert words[IndexScale.MX] == [exponent] * 4
    fp32 = torch.tensor(words[IndexScale.FP32], dtype=torch.uint8).view(torch.float32)
    assert float(fp32) == 2.0 ** (exponent - 127)


@pytest.mark.parametrize("version", RELEASES)
def test_nvfp4_is_not_applicable_where_the_release_cannot_write_it(version):
    """0.28/0.29 never name the layout; 0.30 on convert to e2m1 by inline PTX of sm_100+,
    which neither Triton's interpreter nor an H200 runs: never launched, never a pass."""
    result = run_release(version, "nvfp4-ds-mla-cache", 2)
    assert result.status == "not_applicable" and not result.failed and not result.checks
    if version in ("0.28.0", "0.29.0"):
        assert result.error == "nvfp4_ds_mla: the file never names nvfp4_ds_mla"
    elif BACKEND.interpreted:
        assert "cvt.rn.satfinite.e2m1x2.f32" in result.error and "interpreter" in result.error
    else:
        assert result.error.startswith("not applicable on this GPU")


def test_sigterm_during_a_download_still_writes_a_partial_report(tmp_path):
    """A CI job's timeout may land while a release's wheel downloads: the run exits 143
    and leaves its report, partial and empty, never an earlier run's; nothing of the
    download stays in the cache."""
    stalled = socket.socket()  # accepts connections, never answers: pip waits
    stalled.bind(("127.0.0.1", 0))
    stalled.listen(8)
    cache, report = tmp_path / "cache", tmp_path / "r.json"
    report.write_text('{"an earlier run": true}')
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "DCPCHECK_CACHE": str(cache),
        "PIP_INDEX_URL": f"http://127.0.0.1:{stalled.getsockname()[1]}/simple",
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "120",
    }
    command = [sys.executable, "-m", "dcpcheck", "run", "--kernel", "vllm==0.29.0"]
    command += ["--no-tokens", "--scenario", "decode-single-dcp4", "--json", str(report)]
    with stalled, subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True) as run:
        deadline = time.monotonic() + 120
        while not list(cache.glob("releases/vllm/.fetch-*")) and time.monotonic() < deadline:
            assert run.poll() is None, run.stderr.read()
            time.sleep(0.1)
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=60) == 143, run.stderr.read()
        stderr = run.stderr.read()
    assert "terminated loading the kernel; partial report(s): " in stderr
    written = json.loads(report.read_text())
    assert written["partial"] is True and written["cases"] == []
    assert [p.name for p in (cache / "releases" / "vllm").iterdir()] == []
