"""The project's kernel against golden vectors of vLLM's production kernel run on an H200.

``shared/vectors/fused_norm_rope_owned_h200.pt`` (see its README) holds four cases of 5
tokens, every slot owned: bf16 + ``auto`` cache + NeoX indexer, fp16 + ``auto`` +
interleaved indexer, bf16 + ``fp8`` (scale 0.3) + interleaved indexer, bf16 +
``fp8_ds_mla`` on a shared layer. They are independent evidence for the layouts and the
arithmetic (entry bytes, tile scales, RoPE pairing, UE8M0 scales, the top-k fill), not
for DCP: that kernel skips outputs of tokens without a local slot.

Tolerances are those the harness uses against the oracle
(``dcpcheck.ops.fused_norm_rope.tolerances``), for the same reason: both sides round an fp32
pipeline once, and on the CPU Triton's interpreter truncates fp32 -> bf16 where the H200
rounded to nearest even, so about half of the bf16 values sit one step toward zero (fp16 and
fp8 bytes agree exactly).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import reference
from dcpcheck.ops.fused_norm_rope.contract import (
    DS_MLA_NOPE_DIM,
    CacheLayout,
    FusedOpCaches,
    FusedOpInputs,
    FusedOpOutputs,
    index_entry_bytes,
    mla_entry_bytes,
)
from dcpcheck.ops.fused_norm_rope.launcher import fused_norm_rope
from dcpcheck.ops.fused_norm_rope.tolerances import (
    DS_MLA_SCALE,
    FP8_VALUE,
    OUTPUT,
    UE8M0_SCALE,
    fp8_step_distance,
    ulp_distance,
)

VECTORS = Path(__file__).parents[2] / "shared" / "vectors" / "fused_norm_rope_owned_h200.pt"

CASE_LAYOUTS = {
    "mla_auto_bf16__indexer_neox": CacheLayout.AUTO,
    "mla_auto_fp16__indexer_interleaved": CacheLayout.AUTO,
    "mla_fp8_scale0.3__indexer_interleaved": CacheLayout.FP8,
    "mla_fp8_ds_mla__no_indexer": CacheLayout.FP8_DS_MLA,
}

NUM_BLOCKS = 3
"""The golden caches are [3 blocks, block_size 4, entry], started as zeros."""
TOPK_WIDTH = 16
TOPK_START = 7
ROPE_DIM = 64
DS_MLA_SCALES = slice(DS_MLA_NOPE_DIM, DS_MLA_NOPE_DIM + 16)
DS_MLA_ROPE = slice(DS_MLA_NOPE_DIM + 16, None)


@pytest.fixture(scope="module")
def golden() -> dict[str, dict[str, torch.Tensor]]:
    if not VECTORS.is_file():
        pytest.skip(f"golden vectors not found at {VECTORS}")
    return torch.load(VECTORS, weights_only=True)


def _run_case(case: dict[str, torch.Tensor], layout: CacheLayout, device: torch.device):
    """Launch the kernel on one golden case as the README describes it was produced."""
    c = {name: tensor.to(device) for name, tensor in case.items()}
    act_dtype = c["q_c"].dtype
    block_size = int(c["meta_block_size"])
    has_indexer = bool(c["meta_has_indexer"])
    num_tokens, index_dim = c["index_k"].shape
    cos_sin = reference.cos_sin_table(
        int(c["meta_max_pos"]), ROPE_DIM, float(c["meta_rope_base"])
    ).to(device)
    inputs = FusedOpInputs(
        q_c=c["q_c"],
        q_weight=c["q_w"],
        kv_c=c["kv_c"],
        kv_weight=c["kv_w"],
        k_pe=c["k_pe"],
        positions=c["positions"],
        cos_sin=cos_sin,
        eps=float(c["eps"]),
        block_size=block_size,
        cache_layout=layout,
        mla_scale=float(c["mla_k_scale"]) if layout is CacheLayout.FP8 else None,
        slot_mapping=c["slot_mapping"],
        index_k=c["index_k"] if has_indexer else None,
        index_weight=c["index_w"] if has_indexer else None,
        index_bias=c["index_b"] if has_indexer else None,
        index_rope_interleaved=bool(c["meta_index_rope_interleave"]),
        index_slot_mapping=c["slot_mapping"] if has_indexer else None,
    )
    nan = float("nan")
    outputs = FusedOpOutputs(
        q_out=torch.full_like(c["q_c"], nan),
        kv_out=torch.full_like(c["kv_c"], nan),
        kpe_out=torch.full_like(c["k_pe"], nan),
        topk_indices=torch.full(
            (num_tokens, TOPK_WIDTH), TOPK_START, dtype=torch.int32, device=device
        ),
        index_k_out=torch.full_like(c["index_k"], nan) if has_indexer else None,
    )
    entry_bytes = mla_entry_bytes(layout, c["kv_c"].shape[1], ROPE_DIM, act_dtype)
    caches = FusedOpCaches(
        mla=torch.zeros(NUM_BLOCKS, block_size, entry_bytes, dtype=torch.uint8, device=device),
        index=(
            torch.zeros(
                NUM_BLOCKS,
                block_size,
                index_entry_bytes(index_dim),
                dtype=torch.uint8,
                device=device,
            )
            if has_indexer
            else None
        ),
    )
    fused_norm_rope(inputs, outputs, caches)
    return outputs, caches


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
