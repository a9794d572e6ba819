"""Released vLLM kernels as test subjects (dcpcheck.kernels.releases), and every release from 0.28.0
to 0.33.0 judged right on the CPU.

The ground truth of each release comes from reading its ``vllm/models/deepseek_v32/common/
kernels.py`` (README, "vLLM's released kernels"):

* 0.28.0: the kernel returns before any per-token work on a row whose slot is negative,
  so Q is skipped on every token another rank owns (the PR-50005 bug); K has no output.
* 0.29.0: Q fixed; the KV/k_pe outputs still skipped on foreign rows (the PR-54908 bug).
* 0.30.0 - 0.33.0: fixed. One true finding remains on inputs the API accepts but vLLM's
  caller never passes: with the indexer's own mapping *replicated* (every rank stores
  every token), the indexer program returns on a negative MLA slot before it reads the
  indexer slot, so foreign tokens' indexer entries are never written.

The releases are fetched as ``--kernel vllm==X`` fetches them (pip, then the cache outside
the checkout), so a second run reads the cache. Where the package registry cannot be
reached and a release is not cached, its tests skip with that reason.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from dcpcheck.adapters.vllm import VllmFusedNormRope
from dcpcheck.contract import DsMlaScale
from dcpcheck.harness.runner import CaseResult, RunConfig, run_scenario
from dcpcheck.kernels import releases
from dcpcheck.kernels.loading import KernelLoadError, load_kernel
from dcpcheck.spec.scenario import load_scenarios
from tests.conftest import BACKEND

# -- the release spec and its cache, offline -------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("vllm==0.29.0", releases.ReleaseSpec("0.29.0")),
        ("vllm==0.33.0:fused_q", releases.ReleaseSpec("0.33.0", "fused_q")),
        ("vllm==0.30.0rc1", releases.ReleaseSpec("0.30.0rc1")),
        ("vllm>=0.29", None),
        ("vllm==", None),
        ("mypkg.kernels:fused_norm_rope", None),
        ("default", None),
    ],
)
def test_a_release_is_named_vllm_equals_version(spec, expected):
    assert releases.parse_spec(spec) == expected


@pytest.mark.parametrize(
    ("version", "rule"),
    [
        ("0.28.0", DsMlaScale.AMAX),
        ("0.30.0", DsMlaScale.AMAX),
        ("0.30.9", DsMlaScale.AMAX),
        ("0.31.0", DsMlaScale.POW2),
        ("0.33.0", DsMlaScale.POW2),
        ("1.0.0", DsMlaScale.POW2),
    ],
)
def test_the_ds_mla_scale_rule_changed_in_0_31(version, rule):
    assert releases.ds_mla_scale_of(version) is rule


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DCPCHECK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fake_download(member_bytes: bytes | None, calls: list[str]):
    """A stand-in for pip: writes a wheel holding the kernel file (or not)."""

    def download(version: str, into: Path) -> Path:
        calls.append(version)
        wheel = into / f"vllm-{version}-cp38-abi3-manylinux1_x86_64.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("vllm/__init__.py", "")
            if member_bytes is not None:
                archive.writestr(releases.KERNEL_MEMBER, member_bytes)
        return wheel

    return download


def test_fetch_keeps_only_the_kernel_file_and_reads_the_cache_afterwards(cache_dir, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(releases, "_download_wheel", _fake_download(b"# kernel\n", calls))
    first = releases.fetch("0.29.0")
    second = releases.fetch("0.29.0")
    assert first == second == cache_dir / "releases" / "vllm" / "0.29.0" / "kernels.py"
    assert first.read_bytes() == b"# kernel\n"
    assert calls == ["0.29.0"]  # the second fetch is the cache
    assert sorted(p.name for p in first.parent.iterdir()) == ["kernels.py", "source.json"]
    assert not list(cache_dir.rglob("*.whl"))  # the wheel is deleted
    assert '"member": "vllm/models/deepseek_v32/common/kernels.py"' in (
        first.with_name("source.json").read_text()
    )


def test_a_cached_release_loads_offline(cache_dir, monkeypatch):
    def offline(version, into):
        raise AssertionError("no download may be attempted for a cached release")

    target = releases.cached_kernel_file("0.29.0")
    target.parent.mkdir(parents=True)
    fixture = Path(__file__).parent / "fixtures" / "vllm_separate_outputs_api.py"
    target.write_bytes(fixture.read_bytes())
    monkeypatch.setattr(releases, "_download_wheel", offline)
    kernel = load_kernel("vllm==0.29.0")
    assert isinstance(kernel, VllmFusedNormRope)
    assert kernel.name == "vllm==0.29.0"
    assert kernel.ds_mla_scale is DsMlaScale.AMAX


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
    assert not releases.cached_kernel_file("0.29.0").exists()


def test_a_wheel_without_the_kernel_file_is_refused(cache_dir, monkeypatch):
    monkeypatch.setattr(releases, "_download_wheel", _fake_download(None, []))
    with pytest.raises(releases.ReleaseError, match="its wheel has no vllm/models/deepseek_v32"):
        releases.fetch("0.27.0")
    assert not list(cache_dir.rglob("*.whl"))


# -- the released kernels themselves ----------------------------------------------------

RELEASES = ("0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0")


@functools.cache
def _registry_problem() -> str | None:
    """Why the package registry cannot be asked about vllm, or None when it can."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "vllm", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"pip index exited {done.returncode}"


@functools.cache
def release_kernel(version: str) -> VllmFusedNormRope:
    """Release ``version`` as ``--kernel vllm==X`` loads it; skips only where the registry
    is unreachable and the release is not cached."""
    try:
        kernel = load_kernel(f"vllm=={version}")
    except KernelLoadError as exc:
        problem = _registry_problem()
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


def _foreign_rows(scenario: str, dcp_size: int) -> dict[int, set[int]]:
    """Per rank, the real tokens another rank owns (what a skipped-output bug leaves)."""
    from dcpcheck.harness.case import build_case

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
def test_the_fixed_releases_drop_a_replicated_indexers_foreign_entries(version):
    """The true finding that remains (module docstring): only the indexer cache, only on
    the tokens whose MLA slot is on another rank."""
    scenario = "indexer-replicated"
    result = judge(version, scenario, 4)
    assert {(check, field.split(".")[0]) for check, field, _ in findings(result)} == {
        ("cache_owned", "index_cache"),
        ("shards_reassemble", "index_cache"),  # the owner's shard lacks the entry too
    }
    assert bad_tokens(result, "cache_owned", "index_cache.values") == _foreign_rows(scenario, 4)


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
    assert 1 <= len(runs) <= 3  # log2 of five candidates, rounded up
    assert f"{len(runs)} dcpcheck run(s) for 5 revision(s)" in done.stdout


# ----------------------------------------------------------------------------------------
# The newer cache formats (issue 21): judged where the release has them, declared where
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
    from dcpcheck.contract import IndexFormat, IndexScale
    from dcpcheck.harness.case import build_case
    from dcpcheck.harness.runner import launch

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
