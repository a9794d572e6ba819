"""One case of the lse-combine op: a batch of decode rows at one DCP size, every rank's
partial attention over its shard, and every rank's merge of them.

The partials are the oracle's (``reference.lse_combine``): each rank's attention over the
positions it stores, computed in fp64 from the values rounded to the case's dtype, then
rounded to the dtype (the output) and to the LSE's dtype (in the declared base). So a case
judges the merge alone: what a decode kernel adds is the producer's, judged apart.

A rank that stores none of a row's positions holds what the case's ``empty`` encoding
says a decode kernel leaves for an empty shard (``EMPTY_SHARDS``). Padding rows, past the
last request, hold random partials on every rank, as a CUDA graph's buffers do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dcpcheck.cases.collectives import run_ranks
from dcpcheck.cases.scenario_files import batch_rows, requests_in_words
from dcpcheck.ops.lse_combine.contract import CombineInputs, CombineKernel, Merged
from reference import lse_combine as oracle

DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}
"""The dtypes a case's partial outputs (``dtype``) and LSEs (``lse_dtype``) may have."""

EMPTY_SHARDS: dict[str, tuple[float, float | None]] = {
    "neg-inf-zeros": (-math.inf, 0.0),
    "neg-inf-nan": (-math.inf, math.nan),
    "pos-inf-zeros": (math.inf, 0.0),
    "nan-nan": (math.nan, math.nan),
    "zero-zeros": (0.0, 0.0),
    "zero-garbage": (0.0, None),
}
"""What an empty shard's row may hold, as (LSE, output; None: random values). ``-inf``
with zeros is the empty sum itself; ``-inf`` with NaN is what vLLM's Triton decode
attention leaves (its second stage divides the empty sum by itself: ``acc / e_sum`` and
``e_max + log(e_sum)`` with ``e_sum = 0``, ``e_max = -inf``; read in 0.34.0's
``triton_decode_attention.py``). The others are drawn because a merge must survive them,
not yet traced to a release's kernel: ``+inf`` (an empty split marked so, which vLLM's
merges turn into ``-inf``), NaN, and an LSE of 0 with zeros or whatever the buffer held (a
kernel that never ran for the row). The finite ones look like a real shard and can be told
apart only by the lengths (``NEEDS_LENGTHS``), so they stand only where no kernel ran: for
a request the rank holds nothing of. A speculative row that sees none of the rank's
positions while its request has some there was attended to, over no key: its LSE is the
empty sum's ``-inf``, with the encoding's output."""

NEEDS_LENGTHS = frozenset(name for name, (lse, _) in EMPTY_SHARDS.items() if math.isfinite(lse))
"""Encodings a merge can give no weight only if its caller passes the local lengths."""


@dataclass(frozen=True)
class CombineBatch:
    """What a case of the op is drawn from (module docstring)."""

    requests: tuple[tuple[int, int], ...]  # (context length, query rows)
    heads: int  # every head of the layer: the query was all-gathered by heads
    head_dim: int  # of the output (and of the values)
    dtype: str = "bfloat16"
    lse_dtype: str = "float32"
    base_e: bool = True
    return_lse: bool = False
    masked: bool = True  # the caller passes the local lengths
    empty: str = "neg-inf-zeros"
    interleave: int = 1
    padding: int = 0
    sink_logit: float = 0.0  # added to position 0's logits: an attention sink
    logit_shift: float = 0.0  # added to every logit: moves every LSE, no output
    seed: int = 0

    @property
    def num_rows(self) -> int:
        return batch_rows(self.requests, self.padding)

    @property
    def summary(self) -> str:
        """The batch in a few words, as a shrunk failure is reported."""
        base = "e" if self.base_e else "2"
        return (
            f"{requests_in_words(self.requests, self.num_rows)}, "
            f"{self.heads} heads, {self.dtype}, LSE base {base}, empty shards {self.empty}"
        )


@dataclass(frozen=True)
class Askable:
    """What a merge can be asked, for one whose callers never ask the rest (an adapter's
    ``askable``): the property search then draws only that, so its examples judge the merge rather
    than go not applicable."""

    base_2: bool = True
    unmasked: bool = True
    speculative: bool = True  # requests of several query rows
    dcp1: bool = True


ASK_EVERYTHING = Askable()
"""What a merge that judges any case of the op can be asked."""


@dataclass(frozen=True)
class CombineCase:
    """A batch at one DCP size: every rank's inputs (without the group) and what the
    oracle says the merge is."""

    batch: CombineBatch
    dcp_size: int
    partial_out: tuple[torch.Tensor, ...]  # per rank [B, H, D], the batch's dtype
    partial_lse: tuple[torch.Tensor, ...]  # per rank [B, H], lse_dtype, declared base
    seq_lens: tuple[torch.Tensor, ...]  # per rank [requests] int32: local lengths
    query_start_loc: torch.Tensor  # [requests + 1] int32
    expected_out: torch.Tensor  # [B, H, D] fp64, CPU; padding rows 0
    expected_lse: torch.Tensor  # [B, H] fp64, declared base, CPU
    partial_max: torch.Tensor  # [B, H, D] fp64: the largest |partial| of each element
    lse_max: torch.Tensor  # [B] fp64: the largest finite |partial LSE| of a row
    empty_rank: torch.Tensor  # [B] bool: a rank stores none of the row's positions
    real: torch.Tensor  # [B] bool: a request's row, not padding
    queries: torch.Tensor  # [B, H, D] the batch's dtype, CPU: each row's query
    keys: tuple[torch.Tensor, ...]  # per request [context, D], the batch's dtype, CPU
    values: tuple[torch.Tensor, ...]  # per request, likewise
    row_request: torch.Tensor  # [B] int64: each row's request, -1 for padding
    row_seen: torch.Tensor  # [B] int64: how many positions each row sees
    value_max: torch.Tensor  # [B] fp64: the largest |v| among the positions a row sees

    @property
    def heads_per_rank(self) -> int:
        return self.batch.heads // self.dcp_size


def _rounded(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return values.to(dtype).to(torch.float64)


def build_case(batch: CombineBatch, dcp_size: int, device: torch.device) -> CombineCase:
    """Every rank's partials of ``batch`` at ``dcp_size`` (module docstring)."""
    dtype, lse_dtype = DTYPES[batch.dtype], DTYPES[batch.lse_dtype]
    generator = torch.Generator().manual_seed(batch.seed)
    rows, heads, dim = batch.num_rows, batch.heads, batch.head_dim
    scale = 1.0 / math.sqrt(dim)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    out = normal(dcp_size, rows, heads, dim)  # padding rows keep these values
    lse = normal(dcp_size, rows, heads)
    expected_out = torch.zeros(rows, heads, dim, dtype=torch.float64)
    expected_lse = torch.zeros(rows, heads, dtype=torch.float64)
    partial_max = torch.zeros(rows, heads, dim, dtype=torch.float64)
    lse_max = torch.zeros(rows, dtype=torch.float64)
    empty_rank = torch.zeros(rows, dtype=torch.bool)
    real = torch.zeros(rows, dtype=torch.bool)
    queries_of_rows = torch.zeros(rows, heads, dim, dtype=torch.float64)
    keys, values = [], []
    row_request = torch.full((rows,), -1, dtype=torch.int64)
    row_seen = torch.zeros(rows, dtype=torch.int64)
    value_max = torch.zeros(rows, dtype=torch.float64)
    seq_lens = torch.zeros(dcp_size, len(batch.requests), dtype=torch.int32)
    empty_lse, empty_out = EMPTY_SHARDS[batch.empty]
    row = 0
    for index, (context, queries) in enumerate(batch.requests):
        k = _rounded(normal(context, dim), dtype)
        v = _rounded(normal(context, dim), dtype)
        keys.append(k.to(dtype))
        values.append(v.to(dtype))
        bias = torch.full((context,), batch.logit_shift, dtype=torch.float64)
        bias[0] += batch.sink_logit
        owners = oracle.owner_of(torch.arange(context), dcp_size, batch.interleave)
        seq_lens[:, index] = torch.bincount(owners, minlength=dcp_size).to(torch.int32)
        for query in range(queries):
            q = _rounded(normal(heads, dim), dtype)
            seen = oracle.visible(context, queries, query)
            queries_of_rows[row], row_request[row], row_seen[row] = q, index, seen
            value_max[row] = v[:seen].abs().max()
            whole, whole_lse = oracle.attention(q, k[:seen], v[:seen], bias[:seen], scale)
            expected_out[row], expected_lse[row] = whole, oracle.to_base(whole_lse, batch.base_e)
            real[row] = True
            for rank in range(dcp_size):
                part, part_lse = oracle.shard_attention(
                    q, k, v, bias, scale, seen, dcp_size, rank, batch.interleave
                )
                if torch.isneginf(part_lse).all():
                    empty_rank[row] = True
                    # a row its rank's kernel ran for (the request has positions there)
                    # gets the empty sum's -inf, whatever a kernel that never ran leaves
                    ran = seq_lens[rank, index] > 0 and math.isfinite(empty_lse)
                    lse[rank, row] = -math.inf if ran else empty_lse
                    if empty_out is not None:
                        out[rank, row] = empty_out
                    continue
                out[rank, row] = part
                rounded = _rounded(part, dtype).abs()
                partial_max[row] = torch.maximum(
                    partial_max[row], torch.maximum(part.abs(), rounded)
                )
                lse[rank, row] = oracle.to_base(part_lse, batch.base_e)
                lse_max[row] = max(float(lse_max[row]), float(lse[rank, row].abs().max()))
            row += 1
    queries_of_rows[~real] = normal(int((~real).sum()), heads, dim)  # padding rows' queries
    starts = [0]
    for _, queries in batch.requests:
        starts.append(starts[-1] + queries)
    return CombineCase(
        batch,
        dcp_size,
        tuple(out[r].to(dtype).to(device) for r in range(dcp_size)),
        tuple(lse[r].to(lse_dtype).to(device) for r in range(dcp_size)),
        tuple(seq_lens[r].to(device) for r in range(dcp_size)),
        torch.tensor(starts, dtype=torch.int32, device=device),
        expected_out,
        expected_lse,
        partial_max,
        lse_max,
        empty_rank,
        real,
        queries_of_rows.to(dtype),
        tuple(keys),
        tuple(values),
        row_request,
        row_seen,
        value_max,
    )


def rank_inputs(case: CombineCase, group) -> CombineInputs:
    """What the rank ``group`` says it is gets of ``case``: its own copies of its
    partials, the lengths where the caller passes them, and the group."""
    rank = group.rank_in_group
    masked = case.batch.masked
    return CombineInputs(
        partial_out=case.partial_out[rank].clone(),
        partial_lse=case.partial_lse[rank].clone(),
        group=group,
        base_e=case.batch.base_e,
        return_lse=case.batch.return_lse,
        seq_lens=case.seq_lens[rank].clone() if masked else None,
        query_start_loc=case.query_start_loc.clone() if masked else None,
    )


def launch_all(kernel: CombineKernel, case: CombineCase) -> list[Merged]:
    """Every rank's merge of ``case``, the ranks meeting in a simulated group."""
    return run_ranks(case.dcp_size, lambda group: kernel(rank_inputs(case, group)))
