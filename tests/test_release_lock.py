"""Only verified bytes of a vLLM release run (dcpcheck.kernels.releases, release_lock,
loading): a cached file is compiled from the bytes whose SHA256 was checked, never from a
bytecode cache beside it, and none is written there; the SHA256 a release's files must
have ships with dcpcheck (the lock file), so a cache cannot vouch for itself; and a cache
that cannot be trusted is one line and exit 2 in every command and op that reads it.

The releases come from the release cache the suite runs with (fetched there on first use;
skipped where that cannot be), copied: every test damages its own copy.
"""

from __future__ import annotations

import base64
import builtins
import hashlib
import importlib.util
import json
import linecache
import logging
import marshal
import re
import shutil
import sys
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from dcpcheck.cli import cli
from dcpcheck.harness.isolation import IsolatedKernel
from dcpcheck.kernels import release_lock, releases, relock
from dcpcheck.kernels.loading import KernelLoadError, KernelSpecError
from dcpcheck.op_registry import OPS
from dcpcheck.ops import package
from dcpcheck.ops.fused_norm_rope.kernels import load_kernel
from dcpcheck.ops.lse_combine import kernels as lse_kernels
from tests.conftest import BACKEND, registry_problem

SUITE_CACHE = releases.cache_root()
"""The release cache the suite was started with (``$DCPCHECK_CACHE``), read only."""

KERNELS_PY = releases.KERNEL_MEMBER
COMMON_PY = "vllm/v1/attention/ops/common.py"
DCP_PY = "vllm/v1/attention/ops/dcp.py"
MERGE_STATES_PY = "vllm/v1/attention/ops/triton_merge_attn_states.py"
MODEL_RUNNER_PY = "vllm/v1/worker/gpu/model_runner.py"
SPARSE_UTILS_PY = "vllm/v1/attention/backends/mla/sparse_utils.py"
OLD_COMMON_PY = "vllm/attention/ops/common.py"  # where 0.30.0's wheel has nothing


def _in_suite_cache(version: str) -> Path:
    """Release ``version``'s folder in the suite's cache, fetched there if need be."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DCPCHECK_CACHE", str(SUITE_CACHE))
        try:
            releases.fetch_all(version)
        except KernelLoadError as exc:
            problem = registry_problem()
            if problem is not None:
                pytest.skip(f"vllm=={version} is not cached and the registry is unreachable")
            raise AssertionError(f"vllm=={version} cannot be had: {exc}") from exc
        return releases.release_dir(version)


@pytest.fixture
def copied(tmp_path, monkeypatch) -> Callable[..., Path]:
    """``copied(*versions)``: those releases copied into a cache of this test's own, which
    ``$DCPCHECK_CACHE`` then names; returns that cache's folder of releases."""
    cache = tmp_path / "cache"
    folder = cache / "releases" / releases.PACKAGE

    def copy(*versions: str) -> Path:
        for version in versions:
            # not a bytecode cache another program left there: the tests plant their own
            ignored = shutil.ignore_patterns("__pycache__")
            shutil.copytree(_in_suite_cache(version), folder / version, ignore=ignored)
        monkeypatch.setenv("DCPCHECK_CACHE", str(cache))
        return folder

    return copy


def _rewrite_record(release: Path, change: Callable[[dict], None]) -> None:
    record = release / releases.SOURCE_RECORD
    content = json.loads(record.read_text())
    change(content)
    record.write_text(json.dumps(content))


def _one_error_line(output: str) -> str:
    assert "Traceback" not in output
    [line] = [line for line in output.splitlines() if line.startswith("Error: ")]
    return line


# -- only the bytes checked run: no bytecode cache read or written ----------------------

MARKER = "dcpcheck_tests_planted_bytecode_ran"


def _loads(op: str) -> Callable[[], object]:
    return lambda: package(op).kernel("vllm==0.30.0")


LOADERS: dict[str, Callable[[], object]] = {
    **{op: _loads(op) for op in OPS},
    "lse-combine attention": lambda: lse_kernels.ATTENTION_REGISTRY.load("vllm==0.30.0"),
    "lse-combine state merge": lambda: lse_kernels.REGISTRY.load("vllm==0.30.0:merge_attn_states"),
}
"""Every op's loading of a release's files: each op's ``--kernel vllm==X``, and
lse-combine's two further functions (its attention stage and the state merge, which
``--kernel`` names apart)."""


def _plant_bytecode(source_file: Path) -> None:
    """A timestamp .pyc where Python's import looks for ``source_file``'s, valid for the
    file as it is (its modification time and size): the file's own code, then a line
    that marks ``builtins``."""
    code = compile(
        source_file.read_text() + f"\nimport builtins\nbuiltins.{MARKER} = True\n",
        str(source_file),
        "exec",
    )
    stat = source_file.stat()
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little")
    header += (int(stat.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
    header += (stat.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    pyc = Path(importlib.util.cache_from_source(str(source_file)))
    pyc.parent.mkdir(parents=True, exist_ok=True)  # under PYTHONPYCACHEPREFIX where set
    pyc.write_bytes(header + marshal.dumps(code))


@pytest.mark.parametrize("op", list(LOADERS))
def test_bytecode_planted_beside_a_cached_file_never_runs(op, copied, monkeypatch):
    release = copied("0.30.0") / "0.30.0"
    for source_file in release.rglob("*.py"):
        _plant_bytecode(source_file)
    monkeypatch.delattr(builtins, MARKER, raising=False)
    LOADERS[op]()
    assert not hasattr(builtins, MARKER)


@pytest.mark.parametrize("op", list(LOADERS))
def test_loading_a_release_writes_no_bytecode_into_the_cache(op, copied, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    cache = copied("0.30.0")
    LOADERS[op]()
    assert not list(cache.rglob("__pycache__")) and not list(cache.rglob("*.pyc"))


@pytest.mark.parametrize("op", list(LOADERS))
def test_a_file_changed_after_its_check_is_not_what_runs(op, copied, monkeypatch):
    """Each cached file is changed on disk as soon as its SHA256 has been checked: what
    runs, and what Triton reads to compile a kernel (through ``linecache``), is the text
    checked; an op that checks a file again refuses the change."""
    copied("0.30.0")
    checked: dict[Path, str] = {}
    fetch = releases.fetch

    def fetch_then_change(version: str, member: str = KERNELS_PY, **kwargs) -> object:
        kept = fetch(version, member, **kwargs)
        checked[kept.path] = kept.path.read_text()
        kept.path.write_text(checked[kept.path] + f"\nimport builtins\nbuiltins.{MARKER} = 1\n")
        return kept

    monkeypatch.setattr(releases, "fetch", fetch_then_change)
    monkeypatch.delattr(builtins, MARKER, raising=False)
    try:
        LOADERS[op]()
    except KernelSpecError as exc:
        assert "the cached file was changed" in str(exc)
    assert checked and not hasattr(builtins, MARKER)
    for path, text in checked.items():  # the text of each file a loader has read
        entry = linecache.cache.get(str(path))
        assert entry is None or "".join(entry[2]) == text


# -- the lock file: the cache cannot vouch for itself -----------------------------------


def test_a_release_file_passed_off_as_another_release_is_refused(copied):
    """0.30.0's kernels.py copied over 0.29.0's, its SHA256 written into 0.29.0's record:
    the lock file still gives 0.29.0's own, so no command judges it as 0.29.0."""
    cache = copied("0.29.0", "0.30.0")
    shutil.copyfile(cache / "0.30.0" / KERNELS_PY, cache / "0.29.0" / KERNELS_PY)
    sha = hashlib.sha256((cache / "0.30.0" / KERNELS_PY).read_bytes()).hexdigest()
    _rewrite_record(cache / "0.29.0", lambda record: record["files"].update({KERNELS_PY: sha}))
    with pytest.raises(
        KernelSpecError, match=re.escape("that dcpcheck's lock file gives for vllm 0.29.0")
    ):
        load_kernel("vllm==0.29.0")
    done = CliRunner().invoke(
        cli,
        [
            *("bisect", "--releases", "0.29.0,0.30.0", "--find", "first-fixed"),
            *("--scenario", "decode-single-dcp4", "--dcp", "4"),
        ],
    )
    assert done.exit_code == 2
    line = _one_error_line(done.output)
    assert str(cache / "0.29.0" / KERNELS_PY) in line and "fetch --refresh vllm==0.29.0" in line


def test_a_record_that_hides_a_locked_file_is_refused(copied):
    """A record saying the wheel lacks the newest home of a routine would have the loader
    fall back to an older file: the lock file says the wheel has it."""
    release = copied("0.30.0") / "0.30.0"
    (release / DCP_PY).unlink()
    _rewrite_record(release, lambda record: record["files"].pop(DCP_PY))
    with pytest.raises(KernelSpecError, match=f"says vllm 0.30.0's wheel has no {DCP_PY}"):
        lse_kernels.REGISTRY.load("vllm==0.30.0")


def _wheel(version: str, into: Path, kernels_py: bytes) -> Path:
    """A wheel holding ``kernels_py`` as the fused op's file, its RECORD right."""
    digest = hashlib.sha256(kernels_py).digest()
    encoded = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    wheel = into / f"vllm-{version}-cp38-abi3-manylinux1_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(KERNELS_PY, kernels_py)
        record = f"{KERNELS_PY},sha256={encoded},{len(kernels_py)}\n"
        archive.writestr(f"vllm-{version}.dist-info/RECORD", record)
    return wheel


@pytest.fixture
def downloads(tmp_path, monkeypatch) -> list[str]:
    """An empty release cache, and pip replaced by wheels whose kernels.py is not vLLM's
    (their RECORD right); the versions asked for."""
    monkeypatch.setenv("DCPCHECK_CACHE", str(tmp_path / "cache"))
    asked: list[str] = []

    def download(version: str, into: Path) -> Path:
        asked.append(version)
        return _wheel(version, into, b"def fused_norm_rope():\n    pass\n")

    monkeypatch.setattr(releases, "_download_wheel", download)
    return asked


def test_a_wheel_other_than_the_locked_one_is_refused_and_leaves_nothing(downloads, tmp_path):
    with pytest.raises(KernelLoadError, match="differs from what dcpcheck's lock file gives"):
        releases.fetch("0.30.0")
    assert downloads == ["0.30.0"]
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]


def test_a_release_the_lock_does_not_know_is_checked_against_its_record_and_says_so(
    downloads, caplog
):
    version = "99.0.0"
    assert version not in release_lock.shipped().releases
    with caplog.at_level(logging.WARNING):
        kept = releases.fetch(version)
    said = [r.getMessage() for r in caplog.records if "lock file" in r.getMessage()]
    assert said and said[0].startswith(f"vllm=={version} is not in dcpcheck's lock file")
    kept.path.write_bytes(kept.source + b"# changed\n")
    with pytest.raises(
        KernelSpecError, match=re.escape("that its wheel's RECORD gave for vllm 99.0.0")
    ):
        releases.fetch(version)


def test_what_a_locked_release_lacks_is_known_from_the_lock_alone(downloads):
    """0.10.2's wheel has no fused_norm_rope: the lock says so, with no download and no
    cached record."""
    assert releases.lacks("0.10.2", KERNELS_PY)
    with pytest.raises(KernelLoadError, match=f"its wheel has no {KERNELS_PY}"):
        releases.fetch("0.10.2")
    assert downloads == []


def test_the_lock_is_made_for_every_file_dcpcheck_keeps_and_in_the_form_relock_writes():
    lock = release_lock.shipped()
    assert lock.package == releases.PACKAGE
    assert lock.members == releases.KEPT_MEMBERS  # an op's new file: relock every release
    assert list(lock.releases) == sorted(lock.releases, key=releases.version_key)
    assert all(releases.normalise(v) == v for v in lock.releases)
    assert release_lock.render(lock) == release_lock.LOCK_FILE.read_text()


def test_the_lock_ships_in_the_wheel():
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    package_data = pyproject["tool"]["setuptools"]["package-data"]
    assert release_lock.LOCK_FILE.name in package_data["dcpcheck.kernels"]


def test_relock_from_a_cache_gives_the_lock_of_that_release(copied, tmp_path, monkeypatch):
    copied("0.30.0")
    written = tmp_path / "release_lock.json"
    shutil.copyfile(release_lock.LOCK_FILE, written)
    monkeypatch.setattr(release_lock, "LOCK_FILE", written)
    shipped = release_lock.shipped()
    assert relock.main(["--from-cache", "0.30"]) == 0
    assert release_lock.read(written) == shipped
    unsaid = releases.release_dir("0.30.0")  # a record that does not say what the wheel lacks
    _rewrite_record(unsaid, lambda record: record["looked_for"].remove(OLD_COMMON_PY))
    assert relock.main(["--from-cache", "0.30.0"]) == 1
    assert release_lock.read(written) == shipped


@pytest.mark.parametrize(
    "damage",
    [
        lambda path: path.write_bytes(path.read_bytes() + b"# changed\n"),
        lambda path: path.unlink(),
    ],
    ids=["changed", "deleted"],
)
def test_a_malformed_lock_file_is_a_cache_fault(damage, tmp_path, monkeypatch):
    lock_file = tmp_path / "release_lock.json"
    shutil.copyfile(release_lock.LOCK_FILE, lock_file)
    damage(lock_file)
    monkeypatch.setattr(release_lock, "shipped", lambda: release_lock.read(lock_file))
    with pytest.raises(KernelSpecError, match=r"dcpcheck's release lock file: .*reinstall"):
        releases.lacks("0.30.0", KERNELS_PY)


# -- a cache fault is one line and exit 2, in every command and op -----------------------

COMMANDS = [
    (["run", "--op", "lse-combine", "--kernel", "vllm==0.30.0"], COMMON_PY),
    (["hash", "--kernel", "vllm==0.30.0", "--dcp", "2"], COMMON_PY),
    (["mutate", "--op", "lse-combine", "--kernel", "vllm==0.30.0", "--list"], COMMON_PY),
    (["run", "--op", "slot-mapping", "--kernel", "vllm==0.30.0"], MODEL_RUNNER_PY),
    (["run", "--op", "sparse-topk-remap", "--kernel", "vllm==0.30.0"], SPARSE_UTILS_PY),
    (["run", "--kernel", "vllm==0.30.0", "--no-tokens"], KERNELS_PY),
    (["bisect", "--op", "lse-combine", "--releases", "0.29.0,0.30.0"], MERGE_STATES_PY),
]


@pytest.mark.parametrize(("args", "member"), COMMANDS, ids=[" ".join(c[:3]) for c, _ in COMMANDS])
def test_a_changed_file_of_any_op_is_one_line_and_exit_2(args, member, copied):
    cache = copied("0.29.0", "0.30.0")
    changed = cache / "0.30.0" / member
    changed.write_bytes(changed.read_bytes() + b"# changed\n")
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 2, done.output
    line = _one_error_line(done.output)
    assert str(changed) in line and line.endswith("dcpcheck fetch --refresh vllm==0.30.0")


def test_an_unreadable_record_of_a_neighbour_file_is_exit_2(copied):
    (copied("0.30.0") / "0.30.0" / releases.SOURCE_RECORD).write_text("{")
    done = CliRunner().invoke(cli, ["run", "--op", "lse-combine", "--kernel", "vllm==0.30.0"])
    assert done.exit_code == 2, done.output
    assert "gives no file's SHA256" in _one_error_line(done.output)


def test_a_cache_fault_found_by_an_isolated_worker_is_a_spec_error(copied):
    """The worker loads the kernel itself: a cache it cannot trust is bad input there too,
    not a kernel that fails to load (125)."""
    changed = copied("0.30.0") / "0.30.0" / KERNELS_PY
    changed.write_bytes(changed.read_bytes() + b"# changed\n")
    isolated = IsolatedKernel("vllm==0.30.0", "auto", BACKEND, 120.0)
    try:
        with pytest.raises(KernelSpecError, match="differs from"):
            isolated.start()
    finally:
        isolated.close()
