"""The lse-combine op's property search: Hypothesis draws batches (context lengths that
leave ranks empty, query rows, heads and dims, dtypes, LSE bases, what an empty shard
holds, attention sinks and shifted logits, padding) and a DCP size; a failure is shrunk
to its smallest batch and saved as a scenario file of the op, which ``dcpcheck repro``
replays.

Shrinking goes toward one request of one token and one query row, 2 heads of dim 16 in
bf16, a natural LSE, no sink or shift, no padding, and DCP2, where a one-token request
already leaves a rank empty.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st

from dcpcheck.ops.lse_combine.case import (
    ASK_EVERYTHING,
    EMPTY_SHARDS,
    NEEDS_LENGTHS,
    Askable,
    CombineBatch,
)
from dcpcheck.ops.lse_combine.contract import CombineKernel

DCP_SIZES = (2, 4, 8, 1)
"""Drawn DCP sizes, the first the one shrinking settles on."""

HEADS_PER_RANK = (1, 2, 4)
HEAD_DIMS = (16, 32, 64, 128)
DTYPES = ("bfloat16", "float16", "float32")
LOGITS = (0.0, 20.0, 100.0, -100.0, 1000.0)
"""Sink logits and shifts: none, a sink that takes most of the weight, LSEs past where
fp32 ``exp`` overflows (88.7) or underflows, one far past both."""


@st.composite
def batches(
    draw: Callable, dcp_sizes: tuple[int, ...] = DCP_SIZES, askable: Askable = ASK_EVERYTHING
) -> tuple[CombineBatch, int]:
    """A batch of the op and the DCP size it runs at (module docstring), of what
    ``askable`` allows."""
    if not askable.dcp1:
        dcp_sizes = tuple(size for size in dcp_sizes if size > 1) or dcp_sizes
    dcp_size = draw(st.sampled_from(dcp_sizes))
    most = max(dcp_sizes)
    heads = most * draw(st.sampled_from(HEADS_PER_RANK))  # every drawn size divides it
    # half the contexts short enough to leave ranks empty at the drawn sizes
    contexts = st.one_of(st.integers(1, 8), st.integers(1, 300))
    requests = draw(
        st.lists(
            contexts.flatmap(
                lambda context: st.tuples(
                    st.just(context),
                    st.integers(1, min(context, 3) if askable.speculative else 1),
                )
            ),
            min_size=1,
            max_size=4,
        )
    )
    masked = not (askable.unmasked and draw(st.booleans()))  # shrinks to masked
    # most batches without a sink or a shift: a large LSE hides what a small one shows (an
    # empty shard's LSE of 0 weighs next to nothing beside an LSE of 20)
    logits = st.one_of(st.just(0.0), st.sampled_from(LOGITS))
    encodings = (
        list(EMPTY_SHARDS) if masked else [e for e in EMPTY_SHARDS if e not in NEEDS_LENGTHS]
    )
    batch = CombineBatch(
        requests=tuple(requests),
        heads=heads,
        head_dim=draw(st.sampled_from(HEAD_DIMS)),
        dtype=draw(st.sampled_from(DTYPES)),
        base_e=not (askable.base_2 and draw(st.booleans())),
        return_lse=draw(st.booleans()),
        masked=masked,
        empty=draw(st.sampled_from(encodings)),
        interleave=draw(st.sampled_from((1, 2, 4, 16))),
        padding=draw(st.integers(0, 4)),
        sink_logit=draw(logits),
        logit_shift=draw(logits),
        seed=draw(st.integers(0, 2**16)),
    )
    return batch, dcp_size


def drawn(kernel: CombineKernel, dcp_sizes: tuple[int, ...]) -> st.SearchStrategy:
    """The batches to draw for ``kernel``: those of what it can be asked (an adapter's
    ``askable``), so that the examples judge it rather than go not applicable."""
    return batches(dcp_sizes, getattr(kernel, "askable", ASK_EVERYTHING))
