"""The project's decode attention over one rank's shard of a paged cache, in Triton: what
produces the partials the merge combines (the chain, ``chain.py``).

One program per query row and block of ``BLOCK_H`` heads (MLA's latent cache is one head
wide, so the heads share keys and values). A row attends to the first ``seq_lens[row]`` tokens of
its pages, ``BLOCK_N`` at a time, with the running maximum and sum of the softmax in fp32
(flash-decoding's online softmax). It returns the output in the query's dtype and the
natural LSE in fp32; a row with no token gets the empty sum: zeros and ``-inf``, never a
division by zero.

Import this module only once ``dcpcheck.backend.current_backend()`` has chosen between
compiling and Triton's interpreter: Triton decides that when a kernel is defined.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dcpcheck.ops.lse_combine.contract import AttentionInputs

BLOCK_N = 32
"""Tokens a program reads per step."""

BLOCK_H = 16
"""Heads a program attends with: ``tl.dot``'s smallest tile, and few enough that MLA's
576-wide rows of 128 heads stay within a GPU program's registers."""


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
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    head_ok = heads < HEADS
    dim_ok = dims < DIM
    at = row * HEADS * DIM + heads[:, None] * DIM + dims[None, :]
    q = tl.load(q_ptr + at, mask=head_ok[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)
    length = tl.load(lens_ptr + row)
    top = tl.full((BLOCK_H,), -float("inf"), tl.float32)
    total = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_D), tl.float32)
    for start in range(0, length, BLOCK_N):
        tokens = start + tl.arange(0, BLOCK_N)
        valid = tokens < length
        page = tl.load(table_ptr + row * table_row_stride + tokens // PAGE, mask=valid, other=0)
        slot = page.to(tl.int64) * PAGE + tokens % PAGE
        kv_at = slot[:, None] * DIM + dims[None, :]
        kv_ok = valid[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + kv_at, mask=kv_ok, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + kv_at, mask=kv_ok, other=0.0).to(tl.float32)
        logits = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [BLOCK_H, BLOCK_N]
        logits = tl.where(valid[None, :], logits, -float("inf"))
        new_top = tl.maximum(top, tl.max(logits, axis=1))  # finite: one token is valid
        rescale = tl.exp(top - new_top)
        weights = tl.exp(logits - new_top[:, None])
        total = total * rescale + tl.sum(weights, axis=1)
        acc = acc * rescale[:, None] + tl.dot(weights, v, input_precision="ieee")
        top = new_top
    some = total > 0.0
    out = acc / tl.where(some, total, 1.0)[:, None]
    lse = tl.where(some, top + tl.log(tl.where(some, total, 1.0)), -float("inf"))
    tl.store(
        out_ptr + at, out.to(out_ptr.dtype.element_ty), mask=head_ok[:, None] & dim_ok[None, :]
    )
    tl.store(lse_ptr + row * HEADS + heads, lse, mask=head_ok)


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
    if rows:
        _decode_kernel[(rows, triton.cdiv(heads, BLOCK_H))](
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
            BLOCK_D=max(16, triton.next_power_of_2(dim)),
            PAGE=page_size,
            BLOCK_N=BLOCK_N,
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
