"""The chain a DCP decode runs: each rank's decode attention over its own shard of the
cache, then the merge, which together must be one rank's attention over the whole
context. ``chain`` is the op's check of it: the partials come from a decode attention
over each rank's paged shard, not from the oracle, and the kernel under test merges them.
The attention is the kernel's own when it names one (``attention``, as an attention's
mutant does: ``mutants.ProducedBy``), else the project's
(``attention.mla_decode_attention``); a release's decode attention runs in the token
streams' chain (``dcpcheck.e2e.chain``), where its backend's dtypes are the release's.

The attention takes MLA's latent layout (``contract.AttentionInputs``): one cache entry a
token, read whole as the key and its first ``kv_lora_rank`` columns as the value. A
case's keys and values are independent, so each entry is ``[v | k]`` and each query
``[0 | q]`` with ``kv_lora_rank = D``: the logits are ``q . k`` and the values ``v``.

Each rank's cache holds the positions it stores, in order, in pages of ``PAGE_SIZE``
tokens placed at shuffled page numbers (a page read from the wrong table entry is another
token's); a query row attends to the first of them it sees (the positions it sees that the
rank stores are a prefix of the rank's tokens of its request). Padding rows attend to
nothing. A decode kernel takes no logit bias, so a case with a sink or a shift has the
check skipped.

The bound is the merge's (``checks.output_tolerance``) plus what the decode attention adds
in fp32 beyond the rounding of its output, which the merge's bound already counts: its
logits are sums of ``D`` products and its softmax runs over ``seen / BLOCK_N`` steps, each
a few ``eps(fp32)`` relative to what they sum, the weighted values, which no output
exceeds but which may cancel in it: so ``eps(fp32) * (32 + D + seen / BLOCK_N)`` of the
largest ``|v|`` the row sees (``value_max``), not of the output.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from dcpcheck.cases.verdicts import CheckResult
from dcpcheck.ops import op_cases
from dcpcheck.ops.lse_combine import checks
from dcpcheck.ops.lse_combine.case import DTYPES, CombineCase, launch_all
from dcpcheck.ops.lse_combine.contract import AttentionInputs, CombineKernel, DecodeAttention
from reference import lse_combine as oracle

PAGE_SIZE = 16


def _rank_partials(
    case: CombineCase, rank: int, device: torch.device, attention: DecodeAttention
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s decode attention of every row over its shard: (out in the case's
    dtype, LSE in the case's base and LSE dtype). The shard is laid out as MLA's latent
    cache (module docstring): entries ``[v | k]``, the query ``[0 | q]``."""
    batch, dim = case.batch, case.batch.head_dim
    generator = torch.Generator().manual_seed(batch.seed * 1009 + rank)
    owned = []
    for k in case.keys:
        positions = torch.arange(k.shape[0])
        owned.append(positions[oracle.owner_of(positions, case.dcp_size, batch.interleave) == rank])
    pages_of = [math.ceil(len(p) / PAGE_SIZE) for p in owned]
    numbers = torch.randperm(max(sum(pages_of), 1), generator=generator)
    cache = torch.zeros(max(sum(pages_of), 1), PAGE_SIZE, 2 * dim, dtype=case.keys[0].dtype)
    tables = torch.zeros(len(case.keys), max(max(pages_of), 1), dtype=torch.int32)
    first = 0
    for request, positions in enumerate(owned):
        pages = numbers[first : first + pages_of[request]]
        first += pages_of[request]
        tables[request, : len(pages)] = pages.to(torch.int32)
        for local, position in enumerate(positions.tolist()):
            entry = cache[int(pages[local // PAGE_SIZE]), local % PAGE_SIZE]
            entry[:dim] = case.values[request][position]
            entry[dim:] = case.keys[request][position]
    rows = case.row_request.shape[0]
    table = torch.zeros(rows, tables.shape[1], dtype=torch.int32)
    lengths = torch.zeros(rows, dtype=torch.int32)
    for row in range(rows):
        request = int(case.row_request[row])
        if request >= 0:
            table[row] = tables[request]
            lengths[row] = int((owned[request] < case.row_seen[row]).sum())
    q = torch.cat([torch.zeros_like(case.queries), case.queries], dim=-1)
    inputs = AttentionInputs(
        q=q.to(device),
        kv_cache=cache.to(device),
        kv_lora_rank=dim,
        block_table=table.to(device),
        seq_lens=lengths.to(device),
        scale=1.0 / math.sqrt(dim),
    )
    out, lse = attention(inputs)
    out = out.to(DTYPES[batch.dtype])
    return out, oracle.to_base(lse.float(), batch.base_e).to(DTYPES[batch.lse_dtype])


def attention_of(kernel: CombineKernel) -> DecodeAttention:
    """The decode attention that produces ``kernel``'s partials in the chain: its own
    (``attention``: a release's, or a mutant's) or the project's."""
    from dcpcheck.ops.lse_combine.attention import mla_decode_attention

    return getattr(kernel, "attention", None) or mla_decode_attention


def chain(kernel: CombineKernel, case: CombineCase, device: torch.device) -> CheckResult:
    """``chain`` (module docstring)."""
    batch = case.batch
    if batch.sink_logit or batch.logit_shift:
        return CheckResult("chain", skipped="a decode kernel takes no logit bias")
    attention = op_cases.raising(attention_of(kernel))
    partials = [_rank_partials(case, rank, device, attention) for rank in range(case.dcp_size)]
    produced = replace(
        case,
        partial_out=tuple(out for out, _ in partials),
        partial_lse=tuple(lse for _, lse in partials),
    )
    merged = launch_all(op_cases.raising(kernel), produced)
    from dcpcheck.ops.lse_combine.attention import BLOCK_N

    fp32 = torch.finfo(torch.float32).eps
    extra = fp32 * (32 + batch.head_dim + case.row_seen.to(torch.float64) / BLOCK_N)
    bound = checks.output_tolerance(case) + (case.value_max * extra)[:, None, None]
    return checks.outputs(case, merged, case.real, "chain", bound)
