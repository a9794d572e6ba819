"""The reshape-and-cache-flash op's property search: Hypothesis draws batches (requests with
cached prefixes and new tokens, decode and prefill, padding rows, every layout and cache
dtype, fp8 scales, head counts and sizes, block sizes and interleaves) and a DCP size;
every rank is launched and checked, and a failure is shrunk to its smallest batch and
saved as a scenario file of the op, which ``dcpcheck repro`` replays.

Shrinking goes toward one decode request without a prefix, no padding, one KV head of 16
bf16 elements into an ``auto`` ``nhd`` cache of block size 16 at interleave 1, and DCP2.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st

from dcpcheck.ops.reshape_and_cache_flash.case import CacheWriteBatch
from dcpcheck.ops.reshape_and_cache_flash.contract import CacheWriteKernel
from reference.reshape_and_cache_flash import KV_CACHE_DTYPES, LAYOUTS

DCP_SIZES = (2, 4, 8, 1)
"""Drawn DCP sizes, the first the one shrinking settles on."""

INTERLEAVES = (1, 2, 4, 16)
BLOCK_MULTIPLES = (16, 1, 2, 4)
"""A block size is the interleave times one of these."""

HEAD_SIZES = (16, 64, 128, 80)
SCALES = (0.05, 1.0, 0.3, 2.0)


@st.composite
def batches(draw: Callable, dcp_sizes: tuple[int, ...] = DCP_SIZES) -> tuple[CacheWriteBatch, int]:
    """A batch of the op and the DCP size it runs at (module docstring)."""
    dcp_size = draw(st.sampled_from(dcp_sizes))
    interleave = draw(st.sampled_from(INTERLEAVES))
    request = st.tuples(
        st.one_of(st.just(0), st.integers(0, 300)),
        st.one_of(st.just(1), st.integers(1, 40)),
    )
    requests = draw(st.lists(request, min_size=1, max_size=4))
    batch = CacheWriteBatch(
        requests=tuple(requests),
        kv_heads=draw(st.integers(1, 4)),
        head_size=draw(st.sampled_from(HEAD_SIZES)),
        dtype=draw(st.sampled_from(("bfloat16", "float16", "float32"))),
        kv_cache_dtype=draw(st.sampled_from(KV_CACHE_DTYPES)),
        k_scale=draw(st.sampled_from(SCALES)),
        v_scale=draw(st.sampled_from(SCALES)),
        layout=draw(st.sampled_from(LAYOUTS)),
        block_size=interleave * draw(st.sampled_from(BLOCK_MULTIPLES)),
        interleave=interleave,
        padding=draw(st.integers(0, 3)),
        seed=draw(st.integers(0, 2**16)),
    )
    return batch, dcp_size


def drawn(kernel: CacheWriteKernel, dcp_sizes: tuple[int, ...]) -> st.SearchStrategy:
    """The batches to draw for ``kernel``: every one (a kernel that cannot be asked a batch
    says so, and the example counts as not applicable)."""
    return batches(dcp_sizes)
