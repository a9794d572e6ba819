"""Property search (dcpcheck.ops.fused_norm_rope.search) and its command line (``run
--examples``, ``repro``).

The kernels are fast oracle-based ones (tests/kernels_under_test.py) plus one defined here
whose flaw needs a batch of at least three rows, so the search must generate past the
first (minimal) example and then shrink. Every search writes into ``tmp_path``, never into
the checkout's ``.dcpcheck/``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import configuration

from dcpcheck import files
from dcpcheck.cli import cli
from dcpcheck.ops.fused_norm_rope import search
from dcpcheck.ops.fused_norm_rope.contract import FusedOpCaches, FusedOpInputs, FusedOpOutputs
from dcpcheck.ops.fused_norm_rope.scenario import load_scenario, load_scenarios, scenario_to_toml
from tests.conftest import BACKEND
from tests.kernels_under_test import oracle_kernel, raises, shifts_q_out, skips_foreign_kv

REPO = Path(__file__).resolve().parents[1]

ROWS_NEEDED = 3
"""``skips_foreign_kv_from_three_rows`` is correct on batches of fewer rows."""

BROKEN = "tests.test_search:skips_foreign_kv_from_three_rows"
ORACLE = "tests.kernels_under_test:oracle_kernel"


def skips_foreign_kv_from_three_rows(
    inputs: FusedOpInputs, outputs: FusedOpOutputs, caches: FusedOpCaches
) -> None:
    """The PR-54908 flaw, only on launches of at least ``ROWS_NEEDED`` rows (padding counts)."""
    if inputs.num_tokens >= ROWS_NEEDED:
        skips_foreign_kv(inputs, outputs, caches)
    else:
        oracle_kernel(inputs, outputs, caches)


def run_search(home: Path, kernel=skips_foreign_kv_from_three_rows, name=BROKEN, **options):
    config = search.SearchConfig(name, search.PROFILES["smoke"], home=home, **options)
    return search.search(kernel, config, BACKEND)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def found(home: Path) -> search.SearchResult:
    """One search against the broken kernel, shared by the tests that read its result."""
    return run_search(home, examples=60)


# ---------------------------------------------------------------------------------------
# Finding, shrinking, saving


def test_a_broken_kernel_is_found_and_shrunk_to_a_tiny_scenario(found) -> None:
    assert not found.passed
    assert found.examples_to_first_failure is not None
    assert found.examples_to_first_failure > 1  # the minimal example has one row: it passes
    shrunk = found.shrunk
    assert len(shrunk.batch.requests) <= 2
    assert shrunk.batch.num_real_tokens <= 4
    assert shrunk.batch.num_tokens == ROWS_NEEDED  # no row more than the flaw needs
    assert max(shrunk.dcp_sizes) >= 2  # the flaw is invisible without a foreign token
    assert found.failed_checks == ("outputs", "ranks_agree")


FLAWED_POSITION = 3
FLAWED_LAUNCH_ROWS: list[int] = []


def skips_foreign_kv_at_position_three(
    inputs: FusedOpInputs, outputs: FusedOpOutputs, caches: FusedOpCaches
) -> None:
    """The PR-54908 flaw, only in launches where some token sits at position 3 (the rows
    of each such launch noted in ``FLAWED_LAUNCH_ROWS``)."""
    if bool((inputs.positions == FLAWED_POSITION).any()):
        FLAWED_LAUNCH_ROWS.append(inputs.num_tokens)
        skips_foreign_kv(inputs, outputs, caches)
    else:
        oracle_kernel(inputs, outputs, caches)


def test_a_failure_found_in_a_batch_shrinks_to_one_scenario_that_fails_alone(
    tmp_path: Path,
) -> None:
    """Examples launch several scenarios as one; the saved failure is one request holding
    the flawed position, and it fails when replayed on its own."""
    name = "tests.test_search:skips_foreign_kv_at_position_three"
    FLAWED_LAUNCH_ROWS.clear()
    result = run_search(tmp_path, kernel=skips_foreign_kv_at_position_three, name=name,
                        examples=100)  # fmt: skip
    assert not result.passed
    assert result.scenarios_run > result.examples_run  # batched examples ran
    [request] = result.shrunk.batch.requests
    assert request.prefix <= FLAWED_POSITION < request.length
    assert max(FLAWED_LAUNCH_ROWS) > result.shrunk.batch.num_tokens  # seen in a larger launch
    replayed = invoke("repro", str(result.saved_path), "--kernel", name)
    assert replayed.exit_code == 1, replayed.output
    assert invoke("repro", str(result.saved_path), "--kernel", ORACLE).exit_code == 0


def test_the_failure_is_saved_as_a_scenario_named_after_its_file(found, home: Path) -> None:
    path = found.saved_path
    assert path.parent == home / files.FAILURES_DIR
    assert re.fullmatch(rf"shrunk-{re.escape(files.kernel_slug(BROKEN))}-[0-9a-f]{{8}}", path.stem)
    saved = load_scenario(path)
    assert saved.name == path.stem
    assert saved == found.shrunk
    assert path.read_text(encoding="utf-8") == scenario_to_toml(saved)
    # The description says what failed: checks, fields, kernel.
    for words in ("outputs on kv_out, kpe_out", "ranks_agree", BROKEN, "foreign"):
        assert words in saved.description


def test_the_saved_file_can_be_copied_into_a_scenario_directory_as_is(
    found, tmp_path: Path
) -> None:
    shutil.copy(found.saved_path, tmp_path)
    (copied,) = load_scenarios([], tmp_path)
    assert copied.name == found.saved_path.stem
    assert copied == found.shrunk


def test_the_search_replays_the_saved_file_before_returning(found) -> None:
    assert [r.scenario for r in found.replay] == [found.shrunk.name] * len(found.replay)
    assert all(r.status == "fail" for r in found.replay)
    assert found.replay[0].replay.startswith(f"dcpcheck repro {found.saved_path} ")
    assert f" --kernel {BROKEN}" in found.replay[0].replay


def test_a_rerun_tries_the_last_failure_first(found, home: Path) -> None:
    assert (home / files.HYPOTHESIS_DIR / files.kernel_slug(BROKEN)).is_dir()
    again = run_search(home, examples=60)
    assert again.examples_to_first_failure == 1  # replayed from HOME/hypothesis/<kernel>/
    assert again.saved_path == found.saved_path


def test_the_default_seed_makes_runs_reproducible(found, tmp_path: Path) -> None:
    """A fresh home (no database to replay) draws the same examples, finds the same failure."""
    fresh = run_search(tmp_path, examples=60)
    assert fresh.examples_to_first_failure == found.examples_to_first_failure
    assert fresh.shrunk == found.shrunk


def test_an_explicit_seed_draws_other_scenarios(tmp_path: Path) -> None:
    default = run_search(tmp_path / "a", kernel=oracle_kernel, name=ORACLE, examples=10)
    explored = run_search(tmp_path / "b", kernel=oracle_kernel, name=ORACLE, examples=10, seed=1)
    assert explored.ownership != default.ownership


def test_a_kernel_that_raises_is_a_failure_too(tmp_path: Path) -> None:
    result = run_search(tmp_path, kernel=raises, name="raises", examples=5)
    assert result.failed_checks == ("error",)
    assert result.shrunk.batch.num_real_tokens == 1
    assert "the kernel raised (rank 0: RuntimeError: kernel exploded)" in result.shrunk.description


def test_a_correct_kernel_passes_and_writes_no_failure(tmp_path: Path) -> None:
    result = run_search(tmp_path, kernel=oracle_kernel, name=ORACLE, examples=10)
    assert result.passed
    assert result.examples_run == 10
    assert result.examples_to_first_failure is None
    assert not (tmp_path / files.FAILURES_DIR).exists()
    assert sum(result.ownership.values()) > 0


def test_without_the_oracle_the_search_still_finds_and_shrinks_the_dcp_bug(tmp_path: Path) -> None:
    found = run_search(tmp_path, examples=60, oracle=False)
    assert found.failed_checks == ("outputs", "ranks_agree")
    assert max(found.shrunk.dcp_sizes) >= 2
    assert f"--kernel {BROKEN} --oracle off" in found.shrunk.description
    [outputs] = [c for r in found.replay for c in r.failed_checks if c.check == "outputs"]
    assert outputs.without_oracle is not None
    assert "never written" in outputs.findings[0].detail


def test_without_the_oracle_the_search_passes_a_self_consistent_encoding(tmp_path: Path) -> None:
    name = "tests.kernels_under_test:shifts_q_out"
    with_oracle = run_search(tmp_path / "on", kernel=shifts_q_out, name=name, examples=10)
    assert with_oracle.failed_checks == ("outputs",)
    without = run_search(
        tmp_path / "off", kernel=shifts_q_out, name=name, examples=10, oracle=False
    )
    assert without.passed and without.examples_run == 10


SEARCH_IN_A_FRESH_PROCESS = """
import sys
from pathlib import Path
from dcpcheck.backend import current_backend
from dcpcheck.ops.fused_norm_rope import search
from tests.kernels_under_test import writes_foreign_token

home = Path(sys.argv[1])
config = search.SearchConfig("w", search.PROFILES["smoke"], examples=20, home=home)
assert not search.search(writes_foreign_token, config, current_backend()).passed
"""


def test_a_search_writes_nothing_outside_its_home(tmp_path: Path) -> None:
    """Not even Hypothesis's ``.hypothesis/`` (its example database, written when a search
    fails). A fresh interpreter: Hypothesis fixes its default directory when imported."""
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the tests' kernels; cwd stays first
    done = subprocess.run(
        [sys.executable, "-c", SEARCH_IN_A_FRESH_PROCESS, str(home)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert list(cwd.iterdir()) == []
    assert sorted(p.name for p in home.iterdir()) == sorted(
        [files.FAILURES_DIR, files.HYPOTHESIS_DIR]
    )


def test_a_search_gives_hypothesis_its_storage_directory_back(tmp_path: Path) -> None:
    before = configuration.storage_directory(intent_to_write=False).home_directory
    run_search(tmp_path, kernel=oracle_kernel, name=ORACLE, examples=2)
    assert configuration.storage_directory(intent_to_write=False).home_directory == before


def test_kernel_slugs_are_file_names() -> None:
    assert files.kernel_slug("regress/pre-54908") == "regress-pre-54908"
    assert files.kernel_slug(BROKEN) == "tests.test_search-skips_foreign_kv_from_"
    assert files.kernel_slug("../k.py:fused") == "k.py-fused"
    assert len(files.kernel_slug("x" * 100)) == files.SLUG_MAX


# ---------------------------------------------------------------------------------------
# Command line


def invoke(*args: str, env: dict[str, str] | None = None, isolate: bool = False):
    """The CLI in process; the kernel in process too (``--no-isolate``) unless ``isolate``:
    isolation is the subject of ``test_faults``, and each worker costs a torch start."""
    argv = [*args] if isolate else [*args, "--no-isolate"]
    return CliRunner().invoke(cli, argv, env=env, catch_exceptions=False)


def test_repro_replays_the_saved_failure_and_passes_a_correct_kernel(found) -> None:
    path = str(found.saved_path)
    failing = invoke("repro", path, "--kernel", BROKEN)
    assert failing.exit_code == 1
    assert "outputs: kv_out on rank" in failing.output
    assert "failed: outputs, ranks_agree" in failing.output
    assert invoke("repro", path, "--kernel", ORACLE).exit_code == 0


def test_repro_dcp_override_replays_at_other_sizes(found) -> None:
    result = invoke("repro", str(found.saved_path), "--kernel", BROKEN, "--dcp", "1,8")
    assert result.exit_code == 1  # DCP1 passes, DCP8 has foreign tokens
    assert "2 case(s): 1 passed, 1 failed" in result.output


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ("missing", "no such scenario file"),
        ("bad TOML", "invalid TOML"),
        ("new key", "key 'kernel': unknown key"),
    ],
)
def test_repro_file_errors_are_one_line_exit_2(found, tmp_path: Path, change, words) -> None:
    path = tmp_path / "case.toml"
    text = found.saved_path.read_text(encoding="utf-8")
    if change == "bad TOML":
        path.write_text(text.replace("dcp = [", "dcp = = ["), encoding="utf-8")
    elif change == "new key":
        path.write_text('kernel = "x"\n' + text.replace(found.shrunk.name, "case"))
    result = CliRunner().invoke(cli, ["repro", str(path)])
    assert result.exit_code == 2
    (line,) = [line for line in result.output.splitlines() if words in line]
    assert str(path) in line


def test_run_property_only_saves_under_dcpcheck_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = invoke(
        "run", "--property-only", "--profile", "smoke", "--examples", "60", "--kernel", BROKEN,
        env={files.HOME_ENV: str(home)},
    )  # fmt: skip
    assert result.exit_code == 1
    (saved,) = (home / files.FAILURES_DIR).glob("*.toml")
    assert f"saved: {saved}" in result.output
    assert "property: FAIL" in result.output


def test_run_property_only_honours_oracle_off(tmp_path: Path) -> None:
    """Through the command line and its worker process: the consistently shifted kernel
    fails the oracle and passes its own DCP1 run."""
    kernel = "tests.kernels_under_test:shifts_q_out"
    args = ["run", "--property-only", "--profile", "smoke", "--examples", "10", "--kernel", kernel]
    env = {files.HOME_ENV: str(tmp_path)}
    assert invoke(*args, env=env, isolate=True).exit_code == 1
    result = invoke(*args, "--oracle", "off", env=env, isolate=True)
    assert result.exit_code == 0, result.output
    assert "property: 10 example(s) passed" in result.output


def test_run_home_defaults_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(files.HOME_ENV, raising=False)
    result = invoke(
        "run", "--property-only", "--examples", "3", "--kernel", "tests.kernels_under_test:raises"
    )
    assert result.exit_code == 1
    assert len(list((tmp_path / ".dcpcheck" / files.FAILURES_DIR).glob("*.toml"))) == 1


def test_run_stats_count_examples_and_rank_launches(tmp_path: Path) -> None:
    result = invoke(
        "run", "--property-only", "--examples", "8", "--dcp", "4", "--kernel", ORACLE,
        "--stats", "--home", str(tmp_path),
    )  # fmt: skip
    assert result.exit_code == 0
    stats = re.search(
        r"stats: property: (\d+) example\(s\), (\d+) scenarios, in [\d.]+ s \(([\d.]+) "
        r"examples/s, ([\d.]+) scenarios/s\); rank launches: (\d+) all_negative, (\d+) mixed, "
        r"(\d+) fully_owned",
        result.output,
    )
    assert stats is not None, result.output
    examples, scenarios, rate, scenario_rate, *shapes = stats.groups()
    assert int(examples) == 8
    assert int(scenarios) > int(examples)  # examples launch several scenarios at once
    assert float(scenario_rate) > float(rate) > 0
    assert sum(map(int, shapes)) == 4 * 8  # DCP4: four rank launches per example
    assert int(shapes[0]) > 0 and int(shapes[1]) > 0  # both shapes the search is built for


def test_run_named_scenarios_then_the_property(tmp_path: Path) -> None:
    result = invoke(
        "run", "--scenario", "decode-single-dcp4", "--examples", "3", "--kernel", ORACLE,
        "--stats", "--home", str(tmp_path), "--no-tokens",
    )  # fmt: skip
    assert result.exit_code == 0
    assert "decode-single-dcp4[dcp4]" in result.output
    assert "stats: scenarios: 1 case(s)" in result.output
    assert re.search(r"property: 3 example\(s\) passed \(\d+ scenarios; profile ci, seed 0\)",
                     result.output)  # fmt: skip


def test_property_only_and_scenario_exclude_each_other() -> None:
    result = CliRunner().invoke(cli, ["run", "--property-only", "--scenario", "fp8-cache"])
    assert result.exit_code == 2
    assert "--scenario and --property-only exclude each other" in result.output
