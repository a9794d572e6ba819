"""vLLM's Triton decode attention, ``decode_attention_fwd``, release by release, under the
op's attention protocol (``contract.AttentionInputs``): what vLLM's Triton MLA backend runs
on each rank over its shard before the merge.

Its file: ``vllm/attention/ops/triton_decode_attention.py``, later
``vllm/v1/attention/ops/triton_decode_attention.py``; it imports only torch, Triton and
vLLM's platform query, which the stand-ins answer, so it loads as a file.

It is called as the Triton MLA backend calls it (``TritonMLAImpl._forward_decode``, later
``forward_mqa``; 0.33.0's ``triton_mla.py:260-345``): the latent query ``[B, H, L]``; the
cache with a head dimension of one (``unsqueeze(2)``) as the keys and its first
``kv_lora_rank`` columns as the values; ``o`` and ``lse`` allocated as zeros **in the
query's dtype**, which the backend then hands to the merge; the split scratch
``[B, H, splits, kv_lora_rank + 1]`` in fp32; the cache's page size; ``is_mla=True`` where
the signature has it. The layer's fp8 scales are left at their defaults (1.0): the chain
gives the attention a cache already decoded to the query's dtype.

``NUM_KV_SPLITS`` is 4, the backend's constant before it sized the splits by the longest
context (its later rule gives 1 below 1,024 tokens); the splits change the order of the
fp32 sums, not which tokens are read. A rank that holds none of a request's tokens gets
what stage 2 leaves for no split: ``0 / 0`` (NaN) and ``-inf``.

A release whose ``decode_attention_fwd`` has no ``lse`` output cannot hand the merge its
partials (its backends did not run under DCP): :class:`~dcpcheck.adapters.protocol.
AdapterError`, one line.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.ops.lse_combine.contract import AttentionInputs

MEMBERS = (
    "vllm/attention/ops/triton_decode_attention.py",
    "vllm/v1/attention/ops/triton_decode_attention.py",
)
"""The files ``decode_attention_fwd`` lived in, oldest first."""

FUNCTION = "decode_attention_fwd"

NUM_KV_SPLITS = 4
"""Splits of each row's tokens (module docstring)."""

_ARGUMENTS = (
    "q",
    "k_buffer",
    "v_buffer",
    "o",
    "lse",
    "req_to_token",
    "b_seq_len",
    "attn_logits",
    "num_kv_splits",
    "sm_scale",
    "page_size",
)
"""The parameters the backend passes, by the names every release gives them."""


class VllmDecodeAttention:
    """A release's ``decode_attention_fwd`` called as its Triton MLA backend calls it."""

    def __init__(self, function: Callable[..., object], name: str) -> None:
        parameters = inspect.signature(function).parameters
        missing = [argument for argument in _ARGUMENTS if argument not in parameters]
        if missing:
            raise AdapterError(
                f"{name}: {FUNCTION}{inspect.signature(function)} has no "
                f"{', '.join(missing)}: its backends cannot hand the merge a partial and "
                f"its LSE"
            )
        self.function = function
        self.name = name
        self.is_mla = "is_mla" in parameters

    def __call__(self, inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
        q = inputs.q
        rows, heads, _ = q.shape
        out = torch.zeros(rows, heads, inputs.kv_lora_rank, dtype=q.dtype, device=q.device)
        lse = torch.zeros(rows, heads, dtype=q.dtype, device=q.device)
        scratch = torch.empty(
            rows,
            heads,
            NUM_KV_SPLITS,
            inputs.kv_lora_rank + 1,
            dtype=torch.float32,
            device=q.device,
        )
        keys = inputs.kv_cache.unsqueeze(2)
        extra = {"is_mla": True} if self.is_mla else {}
        self.function(
            q=q,
            k_buffer=keys,
            v_buffer=keys[..., : inputs.kv_lora_rank],
            o=out,
            lse=lse,
            req_to_token=inputs.block_table,
            b_seq_len=inputs.seq_lens,
            attn_logits=scratch,
            num_kv_splits=NUM_KV_SPLITS,
            sm_scale=inputs.scale,
            page_size=keys.shape[1],
            **extra,
        )
        return out, lse
