"""The project's decode attention over one rank's shard of a paged cache, in Triton: what
produces the partials the merge combines (the chain, ``chain.py``).

One program per query row, block of ``BLOCK_H`` heads and block of ``BLOCK_DV`` output
columns (MLA's latent cache is one head wide, so the heads share keys and values). A row
attends to the first ``seq_lens[row]`` tokens of its pages, ``BLOCK_N`` at a time, with the
running maximum and sum of the softmax in fp32 (flash-decoding's online softmax). The
logits of a block of tokens are summed over the row's width ``BLOCK_DK`` columns at a time,
in column order, so every output block of a row computes the same logits and the same LSE.
It returns the output in the query's dtype and the natural LSE in fp32; a row with no token
gets the empty sum: zeros and ``-inf``, never a division by zero.

Why the tiles are what they are: a Hopper program has 232,448 bytes of shared memory, and
Triton stages ``tl.dot``'s operands there, once per pipeline stage. Whole rows of MLA's
576-wide cache (padded to 1,024) in fp32, 32 tokens a step, asked 327,680 to 458,880 bytes
and did not launch; 64-column slices of the keys and 128-column slices of the values keep a
launch near a tenth of that (``tests/test_gpu_fit.py`` compiles every launch for sm_90 and
sm_100). The interpreter has no shared memory and pays per operation, so it takes the whole
row in one slice (``tiles``): the same arithmetic, in fewer, wider steps.

Import this module only once ``dcpcheck.backend.current_backend()`` has chosen between
compiling and Triton's interpreter: Triton decides that when a kernel is defined.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from dcpcheck.backend import current_backend
from dcpcheck.gpu_fit import on_gpu_as
from dcpcheck.ops.lse_combine.contract import AttentionInputs

BLOCK_N = 32
"""Tokens a program reads per step, compiled or interpreted: the softmax of a row of ``seen``
tokens takes ``seen / BLOCK_N`` rescaling steps (the chain check's bound counts them)."""

BLOCK_H = 16
"""Heads a program attends with: ``tl.dot``'s smallest tile, and few enough that MLA's
576-wide rows of 128 heads stay within a GPU program's registers."""


class Tiles(NamedTuple):
    """A launch's tile: tokens per step, key columns per logit slice, output columns per
    program (module docstring)."""

    block_n: int
    block_dk: int
    block_dv: int


GPU_TILES = Tiles(block_n=BLOCK_N, block_dk=64, block_dv=128)
"""On a GPU: small enough for shared memory with Triton's default pipeline stages."""

GPU_NUM_STAGES = 2
"""Pipeline stages on a GPU: the token loop's loads of one step overlap the previous step's
dots; more stages only buy shared memory."""


def tiles(dim: int, interpreted: bool) -> Tiles:
    """The tile for rows ``dim`` wide: :data:`GPU_TILES` compiled, the whole padded row
    under the interpreter (module docstring)."""
    if not interpreted:
        return GPU_TILES
    width = max(16, triton.next_power_of_2(dim))
    return Tiles(block_n=BLOCK_N, block_dk=width, block_dv=width)


@triton.jit
def _decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    lens_ptr,
    out_ptr,
    lse_ptr,
    scale,
    table_row_stride,
    HEADS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DIM: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < HEADS
    # This program's output columns; the logits run over all DIM columns.
    out_dims = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    out_ok = head_ok[:, None] & (out_dims < DIM)[None, :]
    q_rows = q_ptr + row * HEADS * DIM + heads[:, None] * DIM
    length = tl.load(lens_ptr + row)
    top = tl.full((BLOCK_H,), -float("inf"), tl.float32)
    total = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_DV), tl.float32)
    for start in range(0, length, BLOCK_N):
        # The block's tokens and the cache rows they live in.
        tokens = start + tl.arange(0, BLOCK_N)
        valid = tokens < length
        page = tl.load(table_ptr + row * table_row_stride + tokens // PAGE, mask=valid, other=0)
        slot = page.to(tl.int64) * PAGE + tokens % PAGE
        # Logits q . k over the row's width, one slice of columns at a time.
        logits = tl.zeros((BLOCK_H, BLOCK_N), tl.float32)
        for first in range(0, DIM, BLOCK_DK):
            dims = first + tl.arange(0, BLOCK_DK)
            dim_ok = dims < DIM
            q = tl.load(q_rows + dims[None, :], mask=head_ok[:, None] & dim_ok[None, :], other=0.0)
            k_at = slot[:, None] * DIM + dims[None, :]
            k = tl.load(k_ptr + k_at, mask=valid[:, None] & dim_ok[None, :], other=0.0)
            logits += tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        logits = tl.where(valid[None, :], logits * scale, -float("inf"))
        # Online softmax: rescale what was summed so far to the new running maximum.
        new_top = tl.maximum(top, tl.max(logits, axis=1))  # finite: one token is valid
        rescale = tl.exp(top - new_top)
        weights = tl.exp(logits - new_top[:, None])
        total = total * rescale + tl.sum(weights, axis=1)
        v_at = slot[:, None] * DIM + out_dims[None, :]
        v = tl.load(v_ptr + v_at, mask=valid[:, None] & (out_dims < DIM)[None, :], other=0.0)
        acc = acc * rescale[:, None] + tl.dot(weights, v.to(tl.float32), input_precision="ieee")
        top = new_top
    some = total > 0.0
    out = acc / tl.where(some, total, 1.0)[:, None]
    tl.store(
        out_ptr + row * HEADS * DIM + heads[:, None] * DIM + out_dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=out_ok,
    )
    # Every output block computed the same LSE; the first stores it.
    lse = tl.where(some, top + tl.log(tl.where(some, total, 1.0)), -float("inf"))
    tl.store(lse_ptr + row * HEADS + heads, lse, mask=head_ok & (tl.program_id(2) == 0))


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of ``q`` (``[B, H, D]``) over the first ``seq_lens[row]`` tokens of the
    pages ``block_table[row]`` names in ``k_cache``/``v_cache`` (``[pages * page_size,
    D]``): the output (``q``'s dtype) and the natural LSE (fp32), module docstring."""
    rows, heads, dim = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((rows, heads), dtype=torch.float32, device=q.device)
    interpreted = current_backend().interpreted
    tile = tiles(dim, interpreted)
    if rows:
        grid = (rows, triton.cdiv(heads, BLOCK_H), triton.cdiv(dim, tile.block_dv))
        # Recorded for the GPU's tiles and stages (dcpcheck.gpu_fit.on_gpu_as).
        with on_gpu_as(
            BLOCK_DK=GPU_TILES.block_dk, BLOCK_DV=GPU_TILES.block_dv, num_stages=GPU_NUM_STAGES
        ):
            _decode_kernel[grid](
                q.contiguous(),
                k_cache.contiguous(),
                v_cache.contiguous(),
                block_table,
                seq_lens,
                out,
                lse,
                scale,
                block_table.stride(0),
                HEADS=heads,
                BLOCK_H=BLOCK_H,
                DIM=dim,
                BLOCK_DK=tile.block_dk,
                BLOCK_DV=tile.block_dv,
                PAGE=page_size,
                BLOCK_N=tile.block_n,
                **({} if interpreted else {"num_stages": GPU_NUM_STAGES}),
            )
    return out, lse


def mla_decode_attention(inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The project's decode attention under the op's attention protocol
    (``contract.AttentionInputs``): MLA's values are the first ``kv_lora_rank`` columns of
    its keys, so the attention runs with the cache as both and keeps those columns of the
    output. The output is fp32, the LSE natural and fp32."""
    blocks, page, width = inputs.kv_cache.shape
    cache = inputs.kv_cache.reshape(blocks * page, width)
    out, lse = decode_attention(
        inputs.q.float(),
        cache,
        cache,
        inputs.block_table,
        inputs.seq_lens,
        page,
        inputs.scale,
    )
    return out[..., : inputs.kv_lora_rank].contiguous(), lse
