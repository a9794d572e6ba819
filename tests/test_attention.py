"""Partial attention and its log-sum-exp merge (dcpcheck.e2e.attention).

The merge of partial attentions over any split of the keys into shards must equal plain
softmax attention over all keys. The plain attention here is written independently, in
fp64 with ``torch.softmax`` over the whole key axis, so agreement is evidence. The bound
is fp32 rounding: scores of size ~3 and values ~1 put the fp32 result within a few ulps
of 1, hence ``atol = rtol = 1e-5``.

Splits are drawn by hypothesis from the shapes that DCP produces: shards that hold no key
(a rank owning none of a request's tokens), one shard holding every key, and causal masks
that leave a query with no visible key at all.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpcheck.e2e.attention import PartialAttention, merge_partials, partial_attention

HEADS = 2
HEAD_DIM = 8
V_DIM = 4
SCALE = HEAD_DIM**-0.5
TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}


def plain_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """Softmax attention in fp64, query by query and head by head."""
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float64)
    for t in range(q.shape[0]):
        keys = visible[t].nonzero().flatten()
        for h in range(q.shape[1]):
            scores = (k[keys, h].double() @ q[t, h].double()) * SCALE
            out[t, h] = torch.softmax(scores, dim=0) @ v[keys, h].double()
    return out


def random_qkv(seed: int, queries: int, keys: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(queries, HEADS, HEAD_DIM, generator=gen) * 2
    k = torch.randn(keys, HEADS, HEAD_DIM, generator=gen) * 2
    v = torch.randn(keys, HEADS, V_DIM, generator=gen)
    return q, k, v


def shard_partials(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor,
    owners: list[int],
    shards: int,
) -> list[PartialAttention]:
    """One partial per shard, shard ``s`` holding the keys ``i`` with ``owners[i] == s``."""
    partials = []
    for shard in range(shards):
        held = torch.tensor(
            [i for i, owner in enumerate(owners) if owner == shard], dtype=torch.long
        )
        partials.append(partial_attention(q, k[held], v[held], SCALE, visible[:, held]))
    return partials


@st.composite
def splits(draw):
    """(queries, shards, owner of each key): 1..12 keys over 1..8 shards, so most draws
    leave some shard empty, and the one-shard draw holds everything."""
    keys = draw(st.integers(1, 12))
    shards = draw(st.integers(1, 8))
    owners = draw(st.lists(st.integers(0, shards - 1), min_size=keys, max_size=keys))
    queries = draw(st.integers(1, 4))
    return queries, shards, owners


@settings(max_examples=60, deadline=None)
@given(split=splits(), seed=st.integers(0, 2**16))
def test_merged_shards_equal_plain_attention(split, seed):
    queries, shards, owners = split
    q, k, v = random_qkv(seed, queries, len(owners))
    visible = torch.ones(queries, len(owners), dtype=torch.bool)
    merged = merge_partials(shard_partials(q, k, v, visible, owners, shards))
    torch.testing.assert_close(
        merged.output.double(), plain_attention(q, k, v, visible), **TOLERANCE
    )


@settings(max_examples=40, deadline=None)
@given(split=splits(), seed=st.integers(0, 2**16))
def test_causal_merge_equals_plain_attention(split, seed):
    """Queries sit after the keys, one per key from the last: query ``t`` sees the keys
    up to ``len - queries + t``, like a prefill chunk's last tokens."""
    queries, shards, owners = split
    keys = len(owners)
    q, k, v = random_qkv(seed, queries, keys)
    last_seen = torch.arange(queries) + keys - queries
    visible = torch.arange(keys)[None, :] <= last_seen[:, None]
    merged = merge_partials(shard_partials(q, k, v, visible, owners, shards))
    seen_any = visible.any(dim=1)
    torch.testing.assert_close(
        merged.output[seen_any].double(),
        plain_attention(q, k, v, visible)[seen_any],
        **TOLERANCE,
    )


def test_empty_shard_is_inert_bitwise():
    """A rank holding no key changes no bit: merging it in, before or after, is exact."""
    q, k, v = random_qkv(1, 3, 7)
    every = torch.ones(3, 7, dtype=torch.bool)
    owners = [0, 1, 1, 0, 2, 2, 0]
    partials = shard_partials(q, k, v, every, owners, 3)
    empty = partial_attention(q, k[:0], v[:0], SCALE)
    assert torch.equal(empty.lse, torch.full((3, HEADS), float("-inf")))
    assert torch.equal(empty.output, torch.zeros(3, HEADS, V_DIM))
    base = merge_partials(partials)
    for with_empty in ([empty, *partials], [*partials, empty, empty]):
        merged = merge_partials(with_empty)
        assert torch.equal(merged.output, base.output)
        assert torch.equal(merged.lse, base.lse)


def test_one_shard_holding_everything_is_its_own_attention():
    """DCP with every key on one rank: the merge returns that rank's partial bit for bit,
    and it equals plain attention."""
    q, k, v = random_qkv(2, 4, 9)
    whole = partial_attention(q, k, v, SCALE)
    empty = partial_attention(q, k[:0], v[:0], SCALE)
    merged = merge_partials([empty, whole, empty, empty])
    assert torch.equal(merged.output, whole.output)
    every = torch.ones(4, 9, dtype=torch.bool)
    torch.testing.assert_close(merged.output.double(), plain_attention(q, k, v, every), **TOLERANCE)


def test_lse_is_log_sum_exp_of_all_scores():
    q, k, v = random_qkv(3, 2, 6)
    merged = merge_partials(
        shard_partials(q, k, v, torch.ones(2, 6, dtype=torch.bool), [0, 1, 0, 3, 3, 1], 4)
    )
    scores = torch.einsum("qhd,khd->qhk", q.double(), k.double()) * SCALE
    torch.testing.assert_close(merged.lse.double(), scores.logsumexp(dim=-1), **TOLERANCE)


def test_query_with_no_key_anywhere_gives_zero_not_nan():
    q, k, v = random_qkv(4, 2, 3)
    nothing = torch.zeros(2, 3, dtype=torch.bool)
    merged = merge_partials(shard_partials(q, k, v, nothing, [0, 1, 1], 2))
    assert torch.equal(merged.output, torch.zeros(2, HEADS, V_DIM))
    assert torch.equal(merged.lse, torch.full((2, HEADS), float("-inf")))


@pytest.mark.parametrize("poisoned", ["key", "value", "query"])
def test_nan_in_a_shard_propagates_instead_of_counting_as_empty(poisoned):
    """An unwritten (NaN-poisoned) kernel output on one rank must reach the merged result:
    a NaN shard is not an empty shard."""
    q, k, v = random_qkv(5, 2, 6)
    if poisoned == "key":
        k[4] = float("nan")
    elif poisoned == "value":
        v[4] = float("nan")
    q_per_shard = [q, q.clone()]
    if poisoned == "query":
        q_per_shard[1][:] = float("nan")
    partials = [  # shard 0 holds keys 0..2, shard 1 (the poisoned one) keys 3..5
        partial_attention(q_per_shard[s], k[3 * s : 3 * s + 3], v[3 * s : 3 * s + 3], SCALE)
        for s in range(2)
    ]
    assert merge_partials(partials).output.isnan().all()


def test_merging_nothing_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        merge_partials([])
