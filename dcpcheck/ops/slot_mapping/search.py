"""The slot-mapping op's property search: Hypothesis draws batches (requests, cache
groups, interleave, padding, requests without blocks) and a DCP size, every rank is
launched and checked, and a failure is shrunk to its smallest batch and saved as a
scenario file of the op, which ``dcpcheck repro`` replays.

The strategies are built so that shrinking means something: toward one request of one
new token, one sharded group of block size 16, interleave 1, no padding, every request
owning blocks, and DCP2, the smallest DCP size at which a rank owns nothing.

Two inputs are drawn because deployments make them and shipped bugs needed them:

* CUDA-graph padding longer than one program's block of rows (:data:`LONG_PADDING`, one
  batch in four): vLLM's slot kernels fill the padding 1024 rows per loop step
  (``TRITON_BLOCK_SIZE``), and a step captured at a graph size past 1024 tokens pads by
  more than that, so a fill that stops after one step, or the rows 0.17.x left between
  the scheduled and the padded count, show only there;
* kernel blocks smaller than the interleave: every divisor of a group's block size is
  drawn as its kernel block, not only multiples of the interleave, as vLLM runs an
  interleave of 32 over attention kernels of 16-token blocks; localizing by the kernel
  block instead of the cache block (vLLM #51031, 0.22.0 - 0.28.0) is wrong only there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

from hypothesis import strategies as st

from dcpcheck.ops.op_cases import named_routines
from dcpcheck.ops.slot_mapping.case import SlotMappingBatch
from dcpcheck.ops.slot_mapping.contract import Routines
from dcpcheck.ops.slot_mapping.vllm import CALLER_BLOCK, Askable

DCP_SIZES = (2, 4, 8, 1)
"""Drawn DCP sizes, the first the one shrinking settles on."""

INTERLEAVES = (1, 2, 4, 8, 16)
BLOCK_MULTIPLES = (16, 1, 2, 4, 8)
"""A group's block size is the interleave times one of these (16 first: block size 16 at
interleave 1, the usual cache)."""

LONG_PADDING = (CALLER_BLOCK + 1, CALLER_BLOCK + 64)
"""The padding rows of a batch drawn with long padding: past one loop step of vLLM's
slot kernels (module docstring)."""


@st.composite
def batches(
    draw: Callable,
    dcp_sizes: tuple[int, ...] = DCP_SIZES,
    replicated: bool = True,
    without_blocks: bool = True,
    interleaved: bool = True,
    kernel_blocks: bool = True,
) -> tuple[SlotMappingBatch, int]:
    """A batch of the op and the DCP size it runs at (module docstring); ``replicated``,
    ``without_blocks``, ``interleaved`` and ``kernel_blocks`` say whether replicated groups,
    requests that own no blocks, interleaves above 1 and kernel blocks smaller than the
    cache's may be drawn."""
    dcp_size = draw(st.sampled_from(dcp_sizes))
    interleave = draw(st.sampled_from(INTERLEAVES if interleaved else (1,)))
    groups = draw(st.integers(1, 3))
    block_sizes = tuple(interleave * draw(st.sampled_from(BLOCK_MULTIPLES)) for _ in range(groups))
    # each group's kernel block: a divisor of its block size, below the interleave too
    # (module docstring; shrinks to the block size itself)
    kernel_block_sizes = tuple(
        draw(st.sampled_from([k for k in range(size, 0, -1) if size % k == 0]))
        for size in block_sizes
    )
    # shrinks to sharded
    sharded = tuple(not (replicated and draw(st.booleans())) for _ in range(groups))
    requests = tuple(
        draw(st.lists(st.tuples(st.integers(0, 2048), st.integers(1, 64)), min_size=1, max_size=6))
    )
    most = 2 if without_blocks else 0
    without = draw(st.lists(st.integers(0, len(requests) - 1), max_size=most, unique=True))
    return (
        SlotMappingBatch(
            requests=requests,
            block_sizes=block_sizes,
            sharded=sharded,
            interleave=interleave,
            kernel_block_sizes=(
                kernel_block_sizes if kernel_blocks and kernel_block_sizes != block_sizes else ()
            ),
            padding=draw(
                st.integers(*LONG_PADDING) if draw(st.integers(0, 3)) == 3 else st.integers(0, 8)
            ),
            without_blocks=tuple(sorted(without)),
            seed=draw(st.integers(0, 2**16)),
        ),
        dcp_size,
    )


def drawn(kernel: Routines, dcp_sizes: tuple[int, ...]) -> st.SearchStrategy:
    """The batches to draw for ``kernel``: all of them, or for a slot-mapping routine that
    says what it can be asked (an adapter's ``askable``: a release's API) only those, so that the
    examples judge it rather than go not applicable; for a release's every routine
    (``EachRoutine``), what any of them can be asked. Sizes it cannot run stay out unless
    they are all that was asked for; then every example is not applicable, and counted so."""
    each = [getattr(member, "askable", None) for _, member in named_routines(kernel.slot_mappings)]
    if any(askable is None for askable in each):
        return batches(dcp_sizes)
    askable = Askable(**{f.name: any(getattr(a, f.name) for a in each) for f in fields(Askable)})
    sizes = dcp_sizes if askable.dcp else tuple(s for s in dcp_sizes if s == 1) or dcp_sizes
    return batches(
        sizes, askable.replicated, askable.without_blocks, askable.interleave, askable.kernel_blocks
    )
