"""Softmax attention over one shard of the keys, and the log-sum-exp merge of shards.

Under DCP each rank holds only its shard of a request's cached keys. A rank computes
attention over its shard alone and returns the normalized output together with the
log-sum-exp (LSE) of its scores; the ranks' partials are then merged into the attention
over all keys::

    lse   = log(sum_s exp(lse_s))
    out   = sum_s exp(lse_s - lse) * out_s

A shard with no key for a query (a rank holding none of the request's tokens, or a
causal mask that hides every key) has ``lse = -inf`` and contributes weight 0. Both
functions handle that case explicitly instead of letting ``exp(-inf - -inf)`` produce
NaN, so an empty shard is inert: merging it in changes no bit of the result. Only
``-inf`` means empty: a NaN score (a kernel output left unwritten, still NaN-poisoned)
stays NaN through both functions, so a broken shard can never pass for an empty one.

Everything is fp32. The merge adds the shards' contributions in the order given, so two
merges of the same partials in the same order are bitwise identical (every rank of a DCP
group merges the gathered partials in rank order and gets the same bits), while a merge of
a different split of the keys agrees only up to fp32 rounding (DCP1 against DCPn).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PartialAttention:
    """Attention of ``Tq`` queries over one shard of keys, per head.

    ``output`` is normalized within the shard (a convex combination of the shard's values)
    and is 0 where the shard has no key for a query; ``lse`` is ``-inf`` there.
    """

    output: torch.Tensor  # [Tq, H, Dv] fp32
    lse: torch.Tensor  # [Tq, H] fp32


NO_KEYS = float("-inf")
"""The log-sum-exp of a shard that holds no key for a query."""


def _exp_unless_empty(x: torch.Tensor, has_keys: torch.Tensor) -> torch.Tensor:
    """``exp(x)`` where ``has_keys``, exactly 0 elsewhere (no NaN from ``-inf - -inf``)."""
    return torch.where(has_keys, torch.exp(torch.where(has_keys, x, 0.0)), 0.0)


def partial_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    visible: torch.Tensor | None = None,
) -> PartialAttention:
    """Softmax attention of ``q`` ``[Tq, H, D]`` over the shard ``k`` ``[Tk, H, D]``,
    ``v`` ``[Tk, H, Dv]``, in fp32, with scores ``scale * q.k``.

    ``visible`` ``[Tq, Tk]`` (bool) hides the keys a query may not see (a causal mask);
    ``None`` shows every key. ``Tk`` may be 0.
    """
    q32, k32, v32 = q.float(), k.float(), v.float()
    scores = torch.einsum("qhd,khd->qhk", q32, k32) * scale
    if visible is not None:
        scores = scores.masked_fill(~visible[:, None, :], NO_KEYS)
    lse = torch.logsumexp(scores, dim=-1)  # NO_KEYS for a query that sees no key
    has_keys = lse != NO_KEYS  # NaN counts as keys: it must propagate
    weights = _exp_unless_empty(scores - lse[..., None], has_keys[..., None])
    output = torch.einsum("qhk,khd->qhd", weights, v32)
    return PartialAttention(output=output, lse=lse)


def merge_partials(partials: Sequence[PartialAttention]) -> PartialAttention:
    """The attention over the union of the shards behind ``partials`` (module docstring).

    Contributions are added in the order of ``partials``. A query that no shard has a key
    for keeps output 0 and ``lse = -inf``.
    """
    if not partials:
        raise ValueError("merging needs at least one partial attention")
    lses = torch.stack([p.lse for p in partials])  # [S, Tq, H]
    peak = lses.max(dim=0).values  # NaN if any shard's is
    any_keys = peak != NO_KEYS
    shifted = torch.where(any_keys, peak, 0.0)
    total = torch.zeros_like(peak)
    weighted = torch.zeros_like(partials[0].output)
    for partial in partials:
        weight = _exp_unless_empty(partial.lse - shifted, partial.lse != NO_KEYS)
        total = total + weight
        weighted = weighted + weight[..., None] * partial.output
    safe_total = torch.where(any_keys, total, 1.0)
    lse = torch.where(any_keys, shifted + torch.log(safe_total), peak)
    return PartialAttention(output=weighted / safe_total[..., None], lse=lse)
