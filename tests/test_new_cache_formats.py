"""The harness on the newer cache formats (nvfp4_ds_mla, the shuffled and MX indexer
caches): where a one-step nvfp4 scale is accepted, how a NaN read from a cache entry is
worded, and a stray write found at the right slot in the shuffled indexer layout."""

from __future__ import annotations

import torch

from dcpcheck.cases.verdicts import RunConfig
from dcpcheck.ops.fused_norm_rope.checks import NAN_UNWRITTEN, NAN_WRITTEN_ENTRY
from dcpcheck.ops.fused_norm_rope.comparison import nvfp4_scale_slack
from dcpcheck.ops.fused_norm_rope.contract import NVFP4_DS_MLA_NUM_TILES, nvfp4_scale_position
from dcpcheck.ops.fused_norm_rope.kernels import load_kernel
from dcpcheck.ops.fused_norm_rope.runner import run
from dcpcheck.ops.fused_norm_rope.scenario import load_scenarios
from tests import kernels_under_test as k
from tests.conftest import BACKEND


def test_a_scale_may_be_one_step_off_only_next_to_a_rounding_midpoint():
    """e4m3 holds 1.0 and 1.125, so a tile ratio amax / 6 of exactly 1.0625 sits on their
    midpoint (the RMSNorm's few ulps may round it either way); 1.03 is far from any."""
    kv = torch.full((1, NVFP4_DS_MLA_NUM_TILES, 16), 0.01)
    kv[0, 0, 0] = 6 * 1.0625
    kv[0, 1, 0] = 6 * 1.03
    slack = nvfp4_scale_slack(kv.reshape(1, -1))
    assert slack.shape == (1, NVFP4_DS_MLA_NUM_TILES)
    assert int(slack[0, nvfp4_scale_position(0)]) == 1
    assert int(slack[0, nvfp4_scale_position(1)]) == 0
    assert int(slack.sum()) == 1  # 0.01 / 6 floors to 2^-9, no midpoint near


def _findings(kernel, scenario: str) -> list:
    [sc] = load_scenarios([scenario])
    [result] = run(kernel, [sc], RunConfig("k", (1,)), BACKEND)
    return [f for c in result.failed_checks for f in c.findings]


def test_a_written_word_that_is_no_mx_scale_is_not_called_unwritten():
    findings = _findings(load_kernel("mutant/index-mx-scale-one-byte"), "indexer-mx-scales")
    scale = [f for f in findings if f.field == "index_cache.scale"]
    assert scale and {f.max_error for f in scale} == {NAN_WRITTEN_ENTRY}


def test_an_mx_scale_left_as_the_random_fill_is_unwritten():
    def skips_index_cache(inputs, outputs, caches) -> None:
        index = None if caches.index is None else caches.index.clone()
        k.oracle_kernel(inputs, outputs, caches)
        if index is not None:
            caches.index.copy_(index)

    findings = _findings(skips_index_cache, "indexer-mx-scales")
    scale = [f for f in findings if f.field == "index_cache.scale"]
    assert scale and {f.max_error for f in scale} == {NAN_UNWRITTEN}


def test_a_stray_write_into_a_shuffled_cache_is_found_at_its_slot():
    """The first real token's indexer row also copied into the next (unowned) slot's tile
    position: the shuffled layout scatters a row over 16-byte pieces, and the stray write
    is still counted per entry and located at that slot."""
    [sc] = load_scenarios(["indexer-shuffled"])
    written = {}

    def also_writes_next_slot(inputs, outputs, caches) -> None:
        k.oracle_kernel(inputs, outputs, caches)
        slots = inputs.index_slot_mapping
        if slots is None or caches.index is None or int(slots[0]) < 0:
            return
        flat = caches.index.view(-1)
        block_size, index_dim = caches.index.shape[1], sc.model.index_head_dim
        block_bytes = block_size * (index_dim + 4)

        def offsets(slot: int) -> list[int]:
            block, t = divmod(slot, block_size)
            return [
                block * block_bytes + (t // 16) * 16 * index_dim + (c // 16) * 256
                + (t % 16) * 16 + c % 16
                for c in range(index_dim)
            ]  # fmt: skip

        source, target = int(slots[0]), int(slots.max()) + 1
        flat[offsets(target)] = flat[offsets(source)]
        written["slot"] = target

    findings = _findings(also_writes_next_slot, "indexer-shuffled")
    stray = [f for f in findings if f.field == "index_cache"]
    assert stray, findings
    [finding] = stray
    # 128 bytes copied over the random fill; a byte may equal what was there (1 in 256)
    assert finding.detail.startswith(f"entry {written['slot']} (unowned) changed: ")
    assert finding.detail.endswith("byte(s), holds token 0's encoding")
    assert 120 <= int(finding.max_error.split()[0]) <= 128


def test_a_vllm_file_is_read_for_its_nvfp4_path(tmp_path, monkeypatch):
    """The signature cannot say whether a file writes nvfp4_ds_mla; its source can. A
    conversion dcpcheck does not recognise is run and judged, never declared N/A."""
    from dcpcheck.ops.fused_norm_rope.case import build_case
    from dcpcheck.ops.fused_norm_rope.vllm import ApiShape, Nvfp4Path, VllmFusedNormRope, nvfp4_path

    texts = {
        "absent": "def f(): return 'fp8_ds_mla'\n",
        "ptx": "def f(): return ('nvfp4_ds_mla', 'cvt.rn.satfinite.e2m1x2.f32')\n",
        "other": "def f(): return ('nvfp4_ds_mla', 'e2m1 by arithmetic')\n",
    }
    monkeypatch.syspath_prepend(str(tmp_path))
    paths = {}
    for name, text in texts.items():
        (tmp_path / f"nvfp4_probe_{name}.py").write_text(text.replace("'", '"'))
        module = __import__(f"nvfp4_probe_{name}")
        paths[name] = nvfp4_path(module.f)
    assert paths == {
        "absent": Nvfp4Path.ABSENT,
        "ptx": Nvfp4Path.PTX_E2M1,
        "other": Nvfp4Path.OTHER,
    }

    [sc] = load_scenarios(["nvfp4-ds-mla-cache"])
    inputs = build_case(sc, 1, BACKEND.device).ranks[0].inputs
    adapter = VllmFusedNormRope(lambda **_: None, ApiShape.SEPARATE_OUTPUTS, nvfp4=Nvfp4Path.OTHER)
    assert adapter.not_applicable(inputs) is None
