"""Upper bounds on every count a scenario holds, wherever it comes from.

A scenario file, a ``--dcp`` or ``--seed`` option and a scenario built in code are held to
the same bounds (``Scenario`` checks them, so a file that asks for more is refused on one
line by ``load_scenario``, before any buffer is allocated). They bound each value to
something a deployment could ask of a kernel; whether a scenario within them fits in the
memory at hand is a separate question, answered up front by each op's estimate
(``dcpcheck.ops.<op>.cost``) against ``dcpcheck.cases.memory``'s budget.

Counts bounded elsewhere: ``interleave`` must divide ``block_size``, so it is at most
``BLOCK_SIZE_MAX``; a request's ``prefix`` and ``new`` are at most the preset's
``max_position`` (its last position must have a RoPE row); the blocks of each rank's cache
follow from the requests' lengths, the block size and the DCP size
(``dcp.blocks_needed``).
"""

from __future__ import annotations

DCP_SIZE_MAX = 64
"""Largest DCP size (``--dcp``, a scenario's ``dcp``): every rank is simulated in this
process, each with its own caches, so the cost grows with the size; deployed DCP groups
are a node or two (8-16 ranks)."""

SEED_MAX = 2**32 - 1
"""Largest seed (``--seed``, a scenario's ``seed``): ``case.build_case`` derives torch
generator seeds as ``seed * 1_000_003 + dcp_size``, which must fit in 64 bits."""

TIMEOUT_MAX_S = 2_147_483.0
"""Longest timeout an option takes, in seconds (``--case-timeout``, ``--rank-timeout``):
the longest wait ``poll`` can be asked (2^31 - 1 milliseconds, about 24.8 days), which
the waits they bound come down to; past it a wait overflows instead of timing out."""

BLOCK_SIZE_MAX = 1024
"""Largest ``block_size``. The block sizes kernels meet are powers of two up to a few
hundred tokens (FlashMLA's is 64; docs/dcp-contract.md draws 1 to 64), and every rank's cache
carries two guard blocks on each side plus a partly used block per request, so the size of a block
multiplies into every rank's cache: at 1024 tokens of 1,152 bytes (the widest MLA entry)
the guard blocks alone are 4.5 MiB a rank, held twice (the pristine copy)."""

BLOCK_GAP_MAX = 65536
"""Most bytes between one cache block and the next (``block_gap``). In a block-outermost
layout the gap holds every other layer's pages of the block, megabytes in a deep model,
but what a kernel can get wrong is using ``block_size * entry`` for the block stride, and
any gap that is not zero shows that; each gap byte is allocated on every block of every
rank and held twice (the pristine copy)."""

BLOCK_GAP_ALIGNMENT = 16
"""``block_gap`` is a multiple of this: every block then starts as aligned as the cache
does, as the pages an allocator packs into a block do, and viewing a cache as 2- or
4-byte elements (a release's wrapper reads bf16 entries and fp32 scales that way) keeps
every stride whole."""

PADDING_MAX = 1024
"""Most CUDA-graph padding rows (``padding``). Padding brings a batch up to the next
captured graph size, and vLLM captures sizes up to 512 tokens by default, so a step pads
by less than that; each padding row costs as much as a real one on every rank, and a
thousand of them test nothing a few do not."""

SLOT_PADDING_MAX = 8192
"""Most CUDA-graph padding rows of a slot-mapping batch. Its rows are one integer per
cache group and rank, and vLLM's slot kernels fill padding 1024 rows per loop step, so
padding past one step (a graph captured at a size past 1024 tokens, up to
``max_num_batched_tokens``, 8192 by default) is an input of its own there."""

REQUESTS_MAX = 1024
"""Most requests in one batch (``[[requests]]`` tables): a server schedules 256 to 1024
sequences a step (vLLM's ``max_num_seqs``). Each request's block table rounds its cache up
to whole ``block_size * dcp_size`` blocks on every rank, so the count bounds that too."""

BATCH_TOKENS_MAX = 262_144
"""Most rows in one batch: the new tokens of every request plus ``padding``, the rows the
kernel sees (every rank holds all of them, in every output). One whole-context prefill of
the longest preset (GLM-5.x, 202,752 positions) fits; vLLM schedules 8k-16k tokens a step
(``max_num_batched_tokens``), and the kernel's own tests reach 65,536 rows (its grid
boundary). It also keeps the widest activation (2,048 values a row) within the 2^31 values
``seeded.normal`` can draw into one tensor."""

CONTEXT_TOKENS_MAX = 1_048_576
"""Most tokens the caches hold after the step: ``prefix + new`` summed over the requests,
the entries that the caches of a DCP group hold between them (the DCP1 baseline's one rank
holds them all). About five whole GLM-5.x contexts; and its cached prefix, drawn 512 values
a token, stays within the 2^31 values ``seeded.normal`` can draw into one tensor."""
