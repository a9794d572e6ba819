"""The sparse-topk-remap op's property search: Hypothesis draws batches (top-k widths up to
2048 across the kernel's tiles, block sizes and interleaves, blocks a block apart or with
other layers' pages between them, contexts short and long,
speculative rows, unused and repeated picks, padding rows, packed or in-place rows, and
prefill chunks over the DCP-gathered workspace: packed with counts as their caller asks,
with picks past the block table, an earlier chunk's requests in the starts and decode
requests of a mixed batch before the chunk's, whose blocks may lie apart as the others')
and a DCP size; every rank is launched and checked, and a failure is shrunk to its smallest
batch and saved as a scenario file of the op, which ``dcpcheck repro`` replays.

Shrinking goes toward one request of a short context and one row, a top-16 in place, block
size 16 at interleave 1, blocks a block apart, no unused or repeated pick, no padding, no
prefill chunk (and in one, no decode request), and DCP2.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hypothesis import strategies as st

from dcpcheck.ops.sparse_topk_remap.case import RemapBatch
from dcpcheck.ops.sparse_topk_remap.contract import RemapKernel

DCP_SIZES = (2, 4, 8, 1)
"""Drawn DCP sizes, the first the one shrinking settles on."""

TOPKS = (16, 1, 3, 64, 256, 257, 512, 2048)
"""Top-k widths: within one tile of the project's kernel (256), one past it, and
DeepSeek's 2048 (eight tiles)."""

INTERLEAVES = (1, 2, 4, 16, 64)
BLOCK_MULTIPLES = (16, 1, 2, 4)
"""A block size is the interleave times one of these."""


@st.composite
def batches(
    draw: Callable, dcp_sizes: tuple[int, ...] = DCP_SIZES, topk_multiple: int = 1
) -> tuple[RemapBatch, int]:
    """A batch of the op and the DCP size it runs at (module docstring); its top-k width a
    multiple of ``topk_multiple``."""
    dcp_size = draw(st.sampled_from(dcp_sizes))
    interleave = draw(st.sampled_from(INTERLEAVES))
    topk = draw(st.sampled_from([k for k in TOPKS if k % topk_multiple == 0]))
    # half the contexts shorter than most top-k widths, half long enough to fill them
    contexts = st.one_of(st.integers(1, 64), st.integers(1, 6000))
    requests = draw(
        st.lists(
            contexts.flatmap(
                lambda context: st.tuples(st.just(context), st.integers(1, min(context, 3)))
            ),
            min_size=1,
            max_size=4,
        )
    )
    batch = RemapBatch(
        requests=tuple(requests),
        topk=topk,
        block_size=interleave * draw(st.sampled_from(BLOCK_MULTIPLES)),
        interleave=interleave,
        compact=draw(st.booleans()),
        count_valid=draw(st.booleans()),
        unused=draw(st.one_of(st.just(0), st.integers(0, topk))),
        duplicates=draw(st.one_of(st.just(0), st.integers(0, 4))),
        padding=draw(st.integers(0, 3)),
        seed=draw(st.integers(0, 2**16)),
    )
    # other layers' pages between the cache's blocks: none, or one to three of its size
    gap_rows = batch.block_size * draw(st.one_of(st.just(0), st.integers(1, 3)))
    # drawn whatever the batch, apart from the requests: they shrink apart
    decodes = draw(st.integers(0, 3))
    if draw(st.booleans()):
        batch = replace(
            batch,
            prefill=True,
            compact=True,
            count_valid=True,
            padding=0,
            past_table=draw(st.integers(0, min(4, topk - batch.unused))),
            earlier_entries=draw(st.integers(0, 3)),
            decode_requests=min(decodes, len(requests) - 1),
        )
    if not batch.prefill or batch.decode_requests:  # it moves only decode rows' entries
        batch = replace(batch, gap_rows=gap_rows)
    return batch, dcp_size


def drawn(kernel: RemapKernel, dcp_sizes: tuple[int, ...]) -> st.SearchStrategy:
    """The batches to draw for ``kernel``: a kernel whose API takes only some widths (a
    release's: ``topk_multiple``) is drawn those, so that the examples judge it rather
    than go not applicable."""
    return batches(dcp_sizes, getattr(kernel, "topk_multiple", 1))
