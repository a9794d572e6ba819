"""The lse-combine op's protocol: ``kernel(inputs) -> Merged``, called once on every rank
of a DCP group at the same time (the ranks meet in the group's collectives).

Under DCP the query is all-gathered by heads, so every rank attends with all ``H`` heads
over the positions it stores and holds a partial output and its log-sum-exp. The merge
turns the ``N`` ranks' partials into what one rank attending over the whole context
computes, and leaves rank ``r`` heads ``r * H / N .. (r + 1) * H / N - 1`` of it (the
reduce-scatter by heads that undoes the all-gather of the query).

A rank's inputs:

* ``partial_out`` (``[B, H, D]``, the attention's dtype) and ``partial_lse`` (``[B, H]``,
  the LSE's dtype, in the base ``base_e`` declares: natural, or base 2): the rank's
  attention over its shard for every query row. A row whose shard is empty on this rank
  holds what the decode kernel leaves there (``scenario.EMPTY_SHARDS``: an LSE of
  ``-inf``, ``+inf``, NaN or 0, an output of zeros, NaN or garbage); the merge must give
  it no weight whatever it holds.
* ``seq_lens`` (int32 ``[requests]``, each request's length on this rank) and
  ``query_start_loc`` (int32 ``[requests + 1]``): passed by callers that let the merge
  mask empty shards, ``None`` by those that do not. Rows from ``query_start_loc[-1]`` on
  are CUDA-graph padding: what the merge leaves there is never read.
* ``group``: the DCP group (``dcpcheck.cases.collectives.Group``), its rank and size,
  its collectives.
* ``return_lse``: return the merged LSE of the rank's heads (in the declared base) too.

What every row must become is ``reference.lse_combine.merge`` of the partials, which is
the whole context's attention (``reference.lse_combine.attention``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dcpcheck.cases.collectives import Group


@dataclass(frozen=True)
class CombineInputs:
    """One rank's call of the merge (module docstring)."""

    partial_out: torch.Tensor
    partial_lse: torch.Tensor
    group: Group
    base_e: bool
    return_lse: bool
    seq_lens: torch.Tensor | None
    query_start_loc: torch.Tensor | None

    @property
    def heads_per_rank(self) -> int:
        return self.partial_out.shape[1] // self.group.world_size


@dataclass(frozen=True)
class Merged:
    """What the merge returns on a rank: the rank's heads of the merged output
    (``[B, H / N, D]``) and, when asked for, of the merged LSE (``[B, H / N]``)."""

    out: torch.Tensor
    lse: torch.Tensor | None = None


CombineKernel = Callable[[CombineInputs], Merged]
"""``kernel(inputs) -> Merged``: one rank's merge (module docstring)."""


@dataclass(frozen=True)
class AttentionInputs:
    """One rank's call of an MLA decode attention over its shard: what produces the
    partials the merge combines (the chain).

    MLA decodes in the latent space: the query of head ``h`` is its no-RoPE part absorbed
    into the latent (``q_nope @ W_uk[h]^T``, ``kv_lora_rank`` wide) followed by its RoPE
    part; every head reads the same cache entries ``[kv_c | k_pe]`` as keys and their
    ``kv_c`` part as values (one KV head). So:

    * ``q`` (``[B, H, L]``, the attention's dtype), ``L = kv_lora_rank + rope``;
    * ``kv_cache`` (``[blocks, page, L]``, the same dtype): the rank's cache entries, the
      values being ``kv_cache[..., :kv_lora_rank]``;
    * ``block_table`` (int32 ``[B, max blocks]``) and ``seq_lens`` (int32 ``[B]``): row
      ``b`` attends to the rank's first ``seq_lens[b]`` tokens of the request, local token
      ``j`` at ``block_table[b, j // page] * page + j % page``; ``seq_lens[b]`` may be 0
      (the rank holds none of the request);
    * ``scale``: the softmax scale.

    It returns the partial output (``[B, H, kv_lora_rank]``) and its natural LSE
    (``[B, H]``), in the dtypes the backend allocates them in.
    """

    q: torch.Tensor
    kv_cache: torch.Tensor
    kv_lora_rank: int
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    scale: float


DecodeAttention = Callable[[AttentionInputs], tuple[torch.Tensor, torch.Tensor]]
"""``attention(inputs) -> (partial_out, partial_lse)``: one rank's MLA decode attention
over its shard (:class:`AttentionInputs`)."""
