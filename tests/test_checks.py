"""Each contract check fails on a kernel built to break it, and passes on a correct one.

The kernels come from ``tests/kernels_under_test.py`` (oracle-backed, so these run fast
on the CPU); the Triton kernel's own runs are in ``test_run_cli.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dcpcheck.backend import current_backend
from dcpcheck.runner import CaseResult, RunConfig, run
from dcpcheck.scenario import load_scenario
from tests import kernels_under_test as k

SCENARIO = """
name = "{name}"
description = "harness self-test"
preset = "small-neox"
dtype = "bfloat16"
cache_layout = "{layout}"
{scale}
indexer = "{indexer}"
block_size = 4
interleave = 1
dcp = [1, 4]
seed = 3
block_table = "shuffled"
profiling = {profiling}
padding = 2

[[requests]]
prefix = 5
new = 6

[[requests]]
prefix = 9
new = 1
"""


def make_scenario(tmp_path: Path, *, layout="auto", indexer="sharded", profiling=False):
    name = f"selftest-{layout}-{indexer}-{'prof' if profiling else 'run'}".replace("_", "-")
    scale = "mla_scale = 0.3" if layout == "fp8" else ""
    path = tmp_path / f"{name}.toml"
    path.write_text(
        SCENARIO.format(name=name, layout=layout, scale=scale, indexer=indexer,
                        profiling=str(profiling).lower())
    )
    return load_scenario(path)


def run_one(kernel, scenario, dcp=(4,)) -> list[CaseResult]:
    return run(kernel, [scenario], RunConfig("test", dcp), current_backend())


def failing(results: list[CaseResult]) -> dict[str, set[str]]:
    """check name -> fields that failed, over all results."""
    found: dict[str, set[str]] = {}
    for r in results:
        for c in r.failed_checks:
            found.setdefault(c.check, set()).update(f.field for f in c.findings)
    return found


@pytest.mark.parametrize("layout", ["auto", "fp8", "fp8_ds_mla"])
@pytest.mark.parametrize("indexer", ["sharded", "replicated", "none"])
def test_correct_kernel_passes_every_check(tmp_path, layout, indexer):
    results = run_one(k.oracle_kernel, make_scenario(tmp_path, layout=layout, indexer=indexer),
                      dcp=(1, 2, 4))
    assert [r.status for r in results] == ["pass"] * 3, failing(results)
    dcp4 = results[-1]
    ran = {c.check for c in dcp4.checks if c.skipped is None}
    expected = {"outputs", "topk", "cache_owned", "cache_foreign", "prefix_intact",
                "padding_inert", "guard_bands", "inputs_unmodified", "ranks_agree",
                "shards_reassemble"}
    assert expected <= ran


def test_profiling_call_passes_and_checks_no_write(tmp_path):
    results = run_one(k.oracle_kernel, make_scenario(tmp_path, profiling=True))
    assert results[0].status == "pass"
    assert "profiling_no_write" in {c.check for c in results[0].checks if c.passed}


def test_profiling_call_that_writes_fails(tmp_path):
    def writes_anyway(inputs, outputs, caches):
        k.oracle_kernel(inputs, outputs, caches)
        caches.mla[0, 0, 0] ^= 0xFF

    results = run_one(writes_anyway, make_scenario(tmp_path, profiling=True))
    assert "profiling_no_write" in failing(results)


def test_foreign_write_is_caught(tmp_path):
    found = failing(run_one(k.writes_foreign_token, make_scenario(tmp_path)))
    assert found.get("cache_foreign") == {"mla_cache"}, found


def test_guard_block_write_is_caught(tmp_path):
    found = failing(run_one(k.writes_guard_block, make_scenario(tmp_path)))
    assert set(found) == {"guard_bands"}, found


def test_one_rank_differing_is_caught(tmp_path):
    k.reset_call_count()
    results = run_one(k.one_rank_differs, make_scenario(tmp_path))
    found = failing(results)
    assert set(found) == {"ranks_agree"}, found
    finding = next(c for c in results[0].failed_checks).findings[0]
    assert (finding.field, finding.rank) == ("q_out", 1)


def test_padding_row_write_is_caught(tmp_path):
    found = failing(run_one(k.writes_padding_row, make_scenario(tmp_path)))
    assert "padding_inert" in found, found


def test_prefix_overwrite_is_caught(tmp_path):
    found = failing(run_one(k.overwrites_prefix, make_scenario(tmp_path, indexer="none")))
    assert "prefix_intact" in found, found


def test_modified_input_is_caught(tmp_path):
    found = failing(run_one(k.modifies_input, make_scenario(tmp_path)))
    assert found.get("inputs_unmodified") == {"kv_c"}, found


def test_skipped_foreign_outputs_name_field_rank_and_ownership(tmp_path):
    results = run_one(k.skips_foreign_kv, make_scenario(tmp_path), dcp=(1, 4))
    dcp1, dcp4 = results
    assert dcp1.status == "pass"
    outputs = next(c for c in dcp4.failed_checks if c.check == "outputs")
    assert {f.field for f in outputs.findings} == {"kv_out", "kpe_out"}
    assert {f.ownership for f in outputs.findings} == {"foreign"}
    assert all(f.max_error == "NaN (unwritten)" for f in outputs.findings)


def test_kernel_exception_is_a_case_error_not_a_crash(tmp_path):
    results = run_one(k.raises, make_scenario(tmp_path))
    assert results[0].status == "error"
    assert "kernel exploded" in results[0].error
