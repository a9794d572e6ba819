"""Decode attention over a whole context and over each DCP rank's shard of it, and the
LSE-weighted merge of the shards' partials: the oracle of the lse-combine op.

A batch is requests one after the other; request ``i`` has ``context[i]`` cached tokens
(this step's included) and ``queries[i]`` query rows, row ``j`` attending to the positions
``0 .. context[i] - queries[i] + j`` (a decode step with ``queries - 1`` speculative
tokens: each sees itself and what precedes it). Every head reads the same keys and values
(MLA's latent cache is one head wide). A logit is ``scale * q . k`` plus a per-position
``bias`` (an attention sink, a shift of every logit: what moves the LSEs apart).

Under DCP, position ``p`` is stored on rank ``(p // interleave) % dcp_size``; a rank's
partial is the attention over the positions it stores, with the log-sum-exp of its logits.
The partials merge into the whole as ``sum_r exp(lse_r - lse) * out_r`` with
``lse = log sum_r exp(lse_r)``; a rank that stores none of a row's positions has an empty
sum, an LSE of ``-inf``, and no weight. An LSE in base 2 is the natural one over ``ln 2``.

Everything is fp64, from the values the kernels read (already rounded to their dtype), so
the oracle's own rounding is far below any tolerance a kernel in fp32 or narrower is held
to.
"""

from __future__ import annotations

import math

import torch

LN2 = math.log(2.0)


def visible(context: int, queries: int, row: int) -> int:
    """How many positions query ``row`` (``0 .. queries - 1``) of a request sees."""
    return context - queries + row + 1


def owner_of(positions: torch.Tensor, dcp_size: int, interleave: int) -> torch.Tensor:
    """The rank that stores each position: runs of ``interleave`` dealt round-robin."""
    return (positions // interleave) % dcp_size


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One query row over a set of positions, every head at once, in fp64.

    ``q`` ``[H, Dk]``; ``k`` ``[T, Dk]``, ``v`` ``[T, Dv]``, ``bias`` ``[T]`` for the ``T``
    positions attended. Returns the output ``[H, Dv]`` and the natural LSE ``[H]``; with no
    position (``T == 0``) the output is zeros and the LSE ``-inf``, the empty sum."""
    q, k, v, bias = (t.to(torch.float64) for t in (q, k, v, bias))
    if k.shape[0] == 0:
        return q.new_zeros(q.shape[0], v.shape[1]), q.new_full((q.shape[0],), -math.inf)
    logits = scale * (q @ k.T) + bias[None, :]
    lse = torch.logsumexp(logits, dim=1)
    return torch.exp(logits - lse[:, None]) @ v, lse


def shard_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    scale: float,
    seen: int,
    dcp_size: int,
    dcp_rank: int,
    interleave: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A rank's partial (``attention``) of a row that sees positions ``0 .. seen - 1`` of
    ``k``/``v``/``bias``: over those of them the rank stores (module docstring)."""
    positions = torch.arange(seen)
    mine = positions[owner_of(positions, dcp_size, interleave) == dcp_rank]
    return attention(q, k[mine], v[mine], bias[mine], scale)


def merge(outputs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The LSE-weighted merge of ``N`` partials, in fp64: ``outputs`` ``[N, ..., D]``,
    natural ``lses`` ``[N, ...]``. A partial with an LSE of ``-inf`` has no weight, whatever
    its output holds; if every partial is empty the merge is empty too (zeros, ``-inf``)."""
    outputs, lses = outputs.to(torch.float64), lses.to(torch.float64)
    lse = torch.logsumexp(lses, dim=0)
    empty = torch.isneginf(lse)
    weights = torch.exp(lses - torch.where(empty, 0.0, lse)[None])
    weights = torch.where(torch.isneginf(lses), 0.0, weights)
    kept = torch.where(weights[..., None] == 0, 0.0, outputs)
    return (weights[..., None] * kept).sum(dim=0), lse


def to_base(lse: torch.Tensor, base_e: bool) -> torch.Tensor:
    """A natural LSE in the base a kernel declares (``base_e`` False: base 2)."""
    return lse if base_e else lse / LN2
