"""Wrong merges and decode attentions, each the project's with one bug a DCP deployment has
had or could have, for the checks to be shown catching. Each wraps the project's kernel
from outside (what it is asked, or what it returns), so the kernel a reader studies holds
no code that is not the kernel."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from dcpcheck.ops.lse_combine.attention import mla_decode_attention
from dcpcheck.ops.lse_combine.contract import (
    AttentionInputs,
    CombineInputs,
    DecodeAttention,
    Merged,
)
from dcpcheck.ops.lse_combine.kernel import combine, empty_rows


def base_ignored(inputs: CombineInputs) -> Merged:
    """Base-2 LSEs merged as natural ones: weights ``exp`` of what ``exp2`` was owed."""
    return combine(replace(inputs, base_e=True))


def lengths_ignored(inputs: CombineInputs) -> Merged:
    """Empty shards not masked by the local lengths: a shard that left an LSE of 0 weighs
    like a real one."""
    return combine(replace(inputs, seq_lens=None, query_start_loc=None))


class _WrongRank:
    """A group that tells its rank as ``rank_in_group + 1`` and is otherwise the group."""

    def __init__(self, group) -> None:
        self._group = group
        self.world_size = group.world_size
        self.rank_in_group = (group.rank_in_group + 1) % group.world_size

    def __getattr__(self, name: str):
        return getattr(self._group, name)


def own_lse_of_next_rank(inputs: CombineInputs) -> Merged:
    """Each rank's partial weighed by the next rank's LSE."""
    merged = combine(replace(inputs, group=_WrongRank(inputs.group), return_lse=False))
    if not inputs.return_lse:
        return merged
    return Merged(merged.out, combine(inputs).lse)


def lse_in_output_dtype(inputs: CombineInputs) -> Merged:
    """The partial LSEs rounded to the output's dtype before the merge (an LSE buffer
    allocated like the query): a bf16 LSE of 100 is off by up to 0.25."""
    lse = inputs.partial_lse.to(inputs.partial_out.dtype).to(inputs.partial_lse.dtype)
    return combine(replace(inputs, partial_lse=lse))


def lse_of_first_heads(inputs: CombineInputs) -> Merged:
    """The merged LSE of rank 0's heads returned on every rank."""
    merged = combine(inputs)
    if merged.lse is None:
        return merged
    lses = inputs.group.all_gather(merged.lse, dim=1)
    return Merged(merged.out, lses[:, : inputs.heads_per_rank].contiguous())


def all_reduced(inputs: CombineInputs) -> Merged:
    """Every head of the merge on every rank (an all-reduce where the reduce-scatter by
    heads belongs): the rank's output has ``N`` times the heads it is owed."""
    merged = combine(inputs)
    return Merged(inputs.group.all_gather(merged.out, dim=1), merged.lse)


def empty_lse_as_zero(inputs: CombineInputs) -> Merged:
    """An empty shard's LSE (``-inf``, ``+inf`` or NaN) taken as 0: the empty shard weighs
    ``exp(-lse)`` of the row."""
    lse = inputs.partial_lse
    return combine(replace(inputs, partial_lse=torch.where(lse.isfinite(), lse, 0.0)))


def max_shift_dropped(inputs: CombineInputs) -> Merged:
    """The weights as ``exp(lse_r) / sum exp(lse_s)`` without subtracting the largest LSE
    first (in torch, fp32): past an LSE of 88.7 ``exp`` overflows and the row is NaN."""
    group, lse = inputs.group, inputs.partial_lse.float()
    lse = torch.where(lse.isnan() | (lse == float("inf")), float("-inf"), lse)
    if inputs.seq_lens is not None and inputs.query_start_loc is not None:
        rows = empty_rows(inputs.seq_lens, inputs.query_start_loc, lse.shape[0])
        lse = lse.masked_fill(rows[:, None], float("-inf"))
    if not inputs.base_e:
        lse = lse * math.log(2.0)
    lses = group.all_gather(lse.contiguous(), dim=0).reshape(group.world_size, *lse.shape)
    weight = torch.exp(lse) / torch.exp(lses).sum(dim=0)
    corrected = torch.where(
        weight[..., None] == 0, 0.0, inputs.partial_out.float() * weight[..., None]
    )
    merged = group.reduce_scatter(corrected.to(inputs.partial_out.dtype), dim=1)
    if not inputs.return_lse:
        return Merged(merged)
    total = torch.log(torch.exp(lses).sum(dim=0))
    total = total if inputs.base_e else total / math.log(2.0)
    first = group.rank_in_group * inputs.heads_per_rank
    return Merged(merged, total[:, first : first + inputs.heads_per_rank].contiguous())


def heads_rolled(inputs: CombineInputs) -> Merged:
    """Each head's partial weighed by the next head's LSE: a correction applied to another
    head than its own."""
    return combine(replace(inputs, partial_lse=inputs.partial_lse.roll(1, dims=1)))


def scatter_off_by_one(inputs: CombineInputs) -> Merged:
    """The reduce-scatter's slice one head late: rank ``r`` gets heads ``r * H / N + 1 ..``,
    the last rank wrapping round to head 0."""
    merged = combine(replace(inputs, return_lse=False))
    every = inputs.group.all_gather(merged.out, dim=1)
    share = inputs.heads_per_rank
    first = inputs.group.rank_in_group * share + 1
    heads = [(first + h) % every.shape[1] for h in range(share)]
    out = every[:, heads].contiguous()
    return Merged(out, combine(inputs).lse if inputs.return_lse else None)


MUTANTS = (
    base_ignored,
    lengths_ignored,
    own_lse_of_next_rank,
    lse_in_output_dtype,
    lse_of_first_heads,
    all_reduced,
    empty_lse_as_zero,
    max_shift_dropped,
    heads_rolled,
    scatter_off_by_one,
)


def attention_last_token_dropped(inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row reads one token short of its local length (a ``<`` one too strict): every
    rank drops its newest token, so DCPn drops one token per rank where DCP1 drops one."""
    return mla_decode_attention(replace(inputs, seq_lens=(inputs.seq_lens - 1).clamp(min=0)))


ATTENTION_MUTANTS = (attention_last_token_dropped,)


@dataclass(frozen=True)
class ProducedBy:
    """The project's merge of the partials ``attention`` produced: how the op judges a
    decode attention (its ``chain`` check runs a kernel's ``attention``)."""

    attention: DecodeAttention

    def __call__(self, inputs: CombineInputs) -> Merged:
        return combine(inputs)
