"""The project's kernel against golden vectors of vLLM's production kernel run on a GPU.

``tests/vectors/fused_norm_rope_owned.pt`` (see its README) holds four cases of 5
tokens, every slot owned: bf16 + ``auto`` cache + NeoX indexer, fp16 + ``auto`` +
interleaved indexer, bf16 + ``fp8`` (scale 0.3) + interleaved indexer, bf16 +
``fp8_ds_mla`` on a shared layer. They are independent evidence for the layouts and the
arithmetic (entry bytes, tile scales, RoPE pairing, UE8M0 scales, the top-k fill), not
for DCP: that kernel skips outputs of tokens without a local slot.

Tolerances are those the harness uses against the oracle
(``dcpcheck.ops.fused_norm_rope.tolerances``), for the same reason: both sides round an fp32
pipeline once, and on the CPU Triton's interpreter truncates fp32 -> bf16 where the GPU
rounded to nearest even, so about half of the bf16 values sit one step toward zero (fp16 and
fp8 bytes agree exactly).
"""

from __future__ import annotations

import pytest
import torch

from dcpcheck.ops.fused_norm_rope.contract import DS_MLA_NOPE_DIM, CacheLayout
from dcpcheck.ops.fused_norm_rope.launcher import fused_norm_rope
from dcpcheck.ops.fused_norm_rope.tolerances import (
    DS_MLA_SCALE,
    FP8_VALUE,
    OUTPUT,
    UE8M0_SCALE,
    fp8_step_distance,
    ulp_distance,
)
from tests.vectors.make_golden_vectors import CASES, NUM_BLOCKS, VECTORS, launch

CASE_LAYOUTS = {case.name: case.layout for case in CASES}

DS_MLA_SCALES = slice(DS_MLA_NOPE_DIM, DS_MLA_NOPE_DIM + 16)
DS_MLA_ROPE = slice(DS_MLA_NOPE_DIM + 16, None)


@pytest.fixture(scope="module")
def golden() -> dict[str, dict[str, torch.Tensor]]:
    return torch.load(VECTORS, weights_only=True)


def _run_case(case: dict[str, torch.Tensor], layout: CacheLayout, device: torch.device):
    """The project's kernel on one golden case, launched as the vectors were made."""
    return launch(case, layout, device, fused_norm_rope)


def _worst(dist: torch.Tensor) -> int:
    return int(dist.max()) if dist.numel() else 0


@pytest.mark.parametrize("name", list(CASE_LAYOUTS))
def test_kernel_matches_golden_vectors(golden, device, name):
    case = golden[name]
    layout = CASE_LAYOUTS[name]
    outputs, caches = _run_case(case, layout, device)
    act_dtype = case["q_c"].dtype

    for field, key in (("q_out", "out_q"), ("kv_out", "out_kv"), ("kpe_out", "out_kpe")):
        worst = _worst(ulp_distance(getattr(outputs, field).cpu(), case[key]))
        assert worst <= OUTPUT.max_steps, f"{name}: {field} {worst} ulps from the H200"
    assert torch.equal(outputs.topk_indices.cpu(), case["out_topk"]), f"{name}: topk_indices"

    # MLA cache: the owned entries field by field; the never-written ones are still zero
    # in both, so the whole cache is compared.
    entry_bytes = caches.mla.shape[-1]
    mine = caches.mla.cpu().reshape(-1, entry_bytes)
    theirs = case["out_mla_cache"].contiguous().view(torch.uint8).reshape(-1, entry_bytes)
    if layout is CacheLayout.AUTO:
        worst = _worst(ulp_distance(mine.view(act_dtype), theirs.view(act_dtype)))
        assert worst <= OUTPUT.max_steps, f"{name}: auto cache {worst} ulps"
    elif layout is CacheLayout.FP8:
        worst = _worst(fp8_step_distance(mine, theirs))
        assert worst <= FP8_VALUE.max_steps, f"{name}: fp8 cache {worst} steps"
    else:
        nope = _worst(fp8_step_distance(mine[:, :DS_MLA_NOPE_DIM], theirs[:, :DS_MLA_NOPE_DIM]))
        assert nope <= FP8_VALUE.max_steps, f"{name}: ds_mla NoPE {nope} steps"
        scales = _worst(
            ulp_distance(
                mine[:, DS_MLA_SCALES].contiguous().view(torch.float32),
                theirs[:, DS_MLA_SCALES].contiguous().view(torch.float32),
            )
        )
        assert scales <= DS_MLA_SCALE.max_steps, f"{name}: ds_mla scales {scales} ulps"
        rope = _worst(
            ulp_distance(
                mine[:, DS_MLA_ROPE].contiguous().view(torch.bfloat16),
                theirs[:, DS_MLA_ROPE].contiguous().view(torch.bfloat16),
            )
        )
        assert rope <= OUTPUT.max_steps, f"{name}: ds_mla RoPE {rope} ulps"

    if caches.index is None:
        assert "out_indexer_cache" not in case
        return
    # Indexer cache, per block: block_size * I fp8 values, then block_size fp32 scales.
    block_size, index_dim = caches.index.shape[1], caches.index.shape[2] - 4
    value_bytes = block_size * index_dim
    mine_blocks = caches.index.cpu().reshape(NUM_BLOCKS, -1)
    theirs_blocks = case["out_indexer_cache"].reshape(NUM_BLOCKS, -1)
    worst = _worst(fp8_step_distance(mine_blocks[:, :value_bytes], theirs_blocks[:, :value_bytes]))
    assert worst <= FP8_VALUE.max_steps, f"{name}: indexer values {worst} steps"
    scale_ulps = _worst(
        ulp_distance(
            mine_blocks[:, value_bytes:].contiguous().view(torch.float32),
            theirs_blocks[:, value_bytes:].contiguous().view(torch.float32),
        )
    )
    assert scale_ulps <= UE8M0_SCALE.max_steps, f"{name}: indexer scales {scale_ulps} ulps"
