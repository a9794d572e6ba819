"""The reshape-and-cache-flash op: its oracle against entries written out by hand, every
check failing on a kernel broken the way it catches, the project's kernel passing and its
mutants caught through the generic selftest, the scenario files read strictly."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dcpcheck.cases.scenario_files import ScenarioError
from dcpcheck.cases.verdicts import Status
from dcpcheck.op_registry import RESHAPE_AND_CACHE_FLASH
from dcpcheck.ops.reshape_and_cache_flash import checks, kernel, mutants
from dcpcheck.ops.reshape_and_cache_flash.case import CacheWriteBatch, build_case
from dcpcheck.ops.reshape_and_cache_flash.scenario import load_scenario
from reference import reshape_and_cache_flash as oracle
from tests.conftest import BACKEND, op_selftest

CPU = torch.device("cpu")
SMALL = CacheWriteBatch(((5, 3), (0, 2)), kv_heads=2, head_size=16, block_size=4, padding=1)
"""Two requests, five tokens and a padding row: small enough to run every check quickly."""


def _write(layout: str, kv_cache_dtype: str = "auto", **scales: float):
    key = torch.arange(2 * 1 * 16, dtype=torch.float32).view(2, 1, 16) + 1
    value = -key
    dtype = oracle.storage_dtype(kv_cache_dtype, torch.float32)
    storage = torch.zeros(oracle.storage_shape(layout, 3, 2, 1, 16), dtype=dtype)
    k_scale = torch.tensor(scales.get("k", 1.0))
    v_scale = torch.tensor(scales.get("v", 1.0))
    slots = torch.tensor([3, -1])  # token 0 at block 1, offset 1; token 1 nowhere
    written = oracle.write(storage, layout, key, value, slots, kv_cache_dtype, k_scale, v_scale)
    return key, value, written


def test_oracle_writes_the_token_with_a_slot_at_its_block_and_offset_nhd():
    key, value, written = _write("nhd")
    assert torch.equal(written[1, 0, 1, 0], key[0, 0])  # [block, K, offset, head]
    assert torch.equal(written[1, 1, 1, 0], value[0, 0])
    written[1, :, 1, 0] = 0
    assert not written.any()  # nothing else, and nothing of the token with slot -1


def test_oracle_hnd_keeps_key_and_value_as_halves_of_the_head_axis():
    key, value, written = _write("hnd")
    assert torch.equal(written[1, 0, 1, :16], key[0, 0])  # [block, head, offset, K | V]
    assert torch.equal(written[1, 0, 1, 16:], value[0, 0])
    written[1, 0, 1] = 0
    assert not written.any()


def test_oracle_head_major_packs_x_elements_of_the_key():
    key, value, written = _write("head-major")
    x = 16 // 4  # fp32 elements
    k = written[0].view(3, 1, 16 // x, 2, x)
    v = written[1].view(3, 1, 16, 2)
    assert torch.equal(k[1, 0, :, 1, :].flatten(), key[0, 0])
    assert torch.equal(v[1, 0, :, 1], value[0, 0])
    k[1, 0, :, 1, :] = 0
    v[1, 0, :, 1] = 0
    assert not written.any()


def test_oracle_fp8_stores_the_value_over_its_scale_as_e4m3_bytes():
    _key, _value, written = _write("nhd", "fp8", k=4.0, v=0.5)
    # key[0, 0, 7] = 8: 8 / 4 = 2.0 is e4m3 0x40; value[0, 0, 0] = -1: -1 / 0.5 = -2.0 is 0xC0
    assert int(written[1, 0, 1, 0, 7]) == 0x40
    assert int(written[1, 1, 1, 0, 0]) == 0xC0
    # 1 / 4 = 0.25 is 2^-2: exponent 5 of bias 7, 0x28
    assert int(written[1, 0, 1, 0, 0]) == 0x28


@pytest.mark.parametrize("layout", oracle.LAYOUTS)
@pytest.mark.parametrize("kv_cache_dtype", oracle.KV_CACHE_DTYPES)
def test_the_project_kernel_passes_every_check(layout, kv_cache_dtype):
    batch = replace(SMALL, layout=layout, kv_cache_dtype=kv_cache_dtype, k_scale=0.5, v_scale=0.1)
    for size in (1, 2, 4):
        results = checks.judge(kernel.write, build_case(batch, size, BACKEND.device))
        assert [r.check for r in results] == list(checks.CHECKS)
        assert not [r for r in results if r.findings], results


def modifies_the_key(inputs, key_cache, value_cache):
    """The project's write, then the key overwritten (an in-place cast of the caller's K)."""
    kernel.write(inputs, key_cache, value_cache)
    inputs.key.add_(1)


BROKEN = {
    "owned": (mutants.last_head_dropped, SMALL),
    "stray": (mutants.negative_slot_as_zero, SMALL),
    "reassembly": (mutants.last_head_dropped, SMALL),
    "guard": (modifies_the_key, SMALL),
}
"""Each check and a kernel broken the way it catches."""


@pytest.mark.parametrize("check", checks.CHECKS)
def test_every_check_fails_on_a_kernel_broken_its_way(check):
    broken, batch = BROKEN[check]
    results = checks.judge(broken, build_case(batch, 2, BACKEND.device))
    [result] = [r for r in results if r.check == check]
    assert result.findings, f"{check} passed {broken.__name__}"


def test_stray_names_the_rank_that_wrote_a_foreign_token():
    results = checks.judge(mutants.negative_slot_as_zero, build_case(SMALL, 2, BACKEND.device))
    [stray] = [r for r in results if r.check == "stray"]
    assert {f.rank for f in stray.findings} == {0, 1}  # both ranks have foreign tokens


def test_an_all_padding_step_writes_nothing_and_a_clamping_kernel_is_caught():
    batch = CacheWriteBatch((), padding=3, head_size=16, block_size=4)
    clean = checks.judge(kernel.write, build_case(batch, 2, BACKEND.device))
    assert not [r for r in clean if r.findings]
    broken = checks.judge(mutants.negative_slot_as_zero, build_case(batch, 2, BACKEND.device))
    assert [r.check for r in broken if r.findings] == ["stray"]


def test_the_selftest_through_the_generic_path_passes_the_kernel_and_catches_every_mutant():
    report = op_selftest(RESHAPE_AND_CACHE_FLASH)  # tests/test_op_contract.py's too
    assert report.default.status is Status.PASSED, report.default
    assert len(report.mutants) == len(mutants.MUTANTS)
    missed = [row.name for row in report.mutants if row.status is not Status.CAUGHT]
    assert not missed


def test_scenario_keys_out_of_range_are_one_line_naming_the_key(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(
        'op = "reshape-and-cache-flash"\nname = "bad"\ndescription = "d"\n'
        'layout = "khd"\nblock_size = 16\ndcp = [2]\nseed = 0\npadding = 1\n'
    )
    with pytest.raises(ScenarioError, match="key 'layout': must be one of nhd, hnd, head-major"):
        load_scenario(path)
