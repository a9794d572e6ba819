"""DCP slot mappings (dcpcheck.cases.dcp) against docs/dcp-contract.md

The vectorized mapping is checked three independent ways: against slots written out by
hand for a small case, against the ordinary (non-DCP) mapping at DCP size 1, and, for
arbitrary layouts drawn by hypothesis, against a token-by-token *counting* description of
vLLM's layout: inside one virtual block of ``B * n`` positions, runs of ``I`` positions are
dealt to ranks round robin, and each rank stores the positions it is dealt one after the
other in its physical block ``bt[k]``. That description never uses the closed-form
``local_off`` expression, so agreeing with it is evidence, not a restatement.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpcheck.cases.dcp import (
    FOREIGN,
    NO_SLOT,
    OWNED,
    PADDING,
    PADDING_POSITION,
    Batch,
    BatchError,
    DcpLayout,
    DcpLayoutError,
    Request,
    SlotMappings,
    build_block_tables,
    num_blocks,
    slot_mappings,
)

# ---------------------------------------------------------------------------------------
# Strategies: small structures whose simplest case (one request, one token, DCP1) is the
# plain mapping, so shrinking lands on something readable.


@st.composite
def layouts(draw: st.DrawFn, max_dcp: int = 8) -> DcpLayout:
    block_size = draw(st.integers(1, 16))
    divisors = [d for d in range(1, block_size + 1) if block_size % d == 0]
    interleave = draw(st.sampled_from(divisors))
    return DcpLayout(block_size, draw(st.integers(1, max_dcp)), interleave)


requests = st.builds(Request, prefix=st.integers(0, 40), new=st.integers(1, 9))
batches = st.builds(
    Batch,
    requests=st.lists(requests, min_size=1, max_size=4).map(tuple),
    padding=st.integers(0, 3),
)
shuffle_seeds = st.none() | st.integers(0, 2**16)

property_test = settings(deadline=None, max_examples=150)


def mappings_for(batch: Batch, layout: DcpLayout, seed: int | None) -> tuple[tuple, SlotMappings]:
    tables = build_block_tables(batch, layout.block_size, layout.dcp_size, seed)
    return tables, slot_mappings(batch, layout, tables)


def slots_by_counting(request: Request, table: tuple[int, ...], layout: DcpLayout) -> list:
    """``(owner, slot)`` of every position of ``request``: runs of ``I`` positions dealt round
    robin inside each virtual block, each rank filling its block in the order dealt."""
    block, n, interleave = layout.block_size, layout.dcp_size, layout.interleave
    result = []
    for position in range(request.length):
        if position % (block * n) == 0:
            filled = [0] * n  # a new virtual block: every rank starts a fresh physical block
        owner = (position // interleave) % n
        result.append((owner, table[position // (block * n)] * block + filled[owner]))
        filled[owner] += 1
    return result


# ---------------------------------------------------------------------------------------
# Hand-written cases


def test_hand_computed_example() -> None:
    """B=4, n=2, I=2, one request of 10 new tokens, block table (3, 1).

    Virtual block 0 (positions 0..7) lives in physical block 3: rank 0 gets positions
    0,1 then 4,5 (offsets 0..3 -> slots 12..15), rank 1 gets 2,3 then 6,7. Virtual block 1
    (positions 8, 9) lives in physical block 1 and both go to rank 0 (slots 4, 5).
    """
    batch = Batch((Request(prefix=0, new=10),), padding=1)
    maps = slot_mappings(batch, DcpLayout(block_size=4, dcp_size=2, interleave=2), ((3, 1),))
    assert maps.positions.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, PADDING_POSITION]
    assert maps.owner.tolist() == [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, -1]
    assert maps.per_rank.tolist() == [
        [12, 13, -1, -1, 14, 15, -1, -1, 4, 5, -1],
        [-1, -1, 12, 13, -1, -1, 14, 15, -1, -1, -1],
    ]
    assert maps.request_index.tolist() == [0] * 10 + [-1]
    assert maps.ownership(1).tolist() == [FOREIGN] * 2 + [OWNED] * 2 + [FOREIGN] * 2 + [
        OWNED
    ] * 2 + [FOREIGN] * 2 + [PADDING]


def test_hand_computed_prefix_example() -> None:
    """B=2, n=2, I=1: a request with 3 cached + 2 new tokens and table (5, 0).

    Positions 0..3 are virtual block 0 -> physical block 5 (slots 10, 11), 4 -> block 0.
    Rank 0 owns even positions, rank 1 odd ones.
    """
    batch = Batch((Request(prefix=3, new=2),))
    maps = slot_mappings(batch, DcpLayout(block_size=2, dcp_size=2), ((5, 0),))
    assert maps.prefix_positions.tolist() == [0, 1, 2]
    assert maps.prefix_owner.tolist() == [0, 1, 0]
    assert maps.prefix_per_rank.tolist() == [[10, -1, 11], [-1, 10, -1]]
    assert maps.positions.tolist() == [3, 4]
    assert maps.per_rank.tolist() == [[-1, 0], [11, -1]]


def test_single_decode_token_under_dcp4_leaves_three_ranks_without_a_slot() -> None:
    batch = Batch((Request(prefix=37, new=1),))
    layout = DcpLayout(block_size=16, dcp_size=4)
    _, maps = mappings_for(batch, layout, None)
    has_slot = (maps.per_rank >= 0).any(dim=1).tolist()
    assert has_slot == [False, True, False, False]  # 37 % 4 == 1: rank 1 owns it
    assert maps.per_rank[1].tolist() == [9]  # block 0, the 10th of rank 1's tokens


def test_multi_request_batch_offsets_rows_per_request() -> None:
    batch = Batch((Request(prefix=2, new=3), Request(prefix=0, new=2)), padding=2)
    maps = slot_mappings(batch, DcpLayout(block_size=8, dcp_size=1), ((4,), (7,)))
    assert maps.positions.tolist() == [2, 3, 4, 0, 1, PADDING_POSITION, PADDING_POSITION]
    assert maps.request_index.tolist() == [0, 0, 0, 1, 1, -1, -1]
    assert maps.per_rank.tolist() == [[34, 35, 36, 56, 57, -1, -1]]
    assert maps.prefix_request_index.tolist() == [0, 0]
    assert maps.prefix_per_rank.tolist() == [[32, 33]]


# ---------------------------------------------------------------------------------------
# Properties


@property_test
@given(batch=batches, layout=layouts(), seed=shuffle_seeds)
def test_matches_counting_description(batch: Batch, layout: DcpLayout, seed: int | None) -> None:
    tables, maps = mappings_for(batch, layout, seed)
    expected_new, expected_prefix = [], []
    for request, table in zip(batch.requests, tables, strict=True):
        counted = slots_by_counting(request, table, layout)
        expected_prefix += counted[: request.prefix]
        expected_new += counted[request.prefix :]
    real = batch.num_real_tokens
    for owner_slots, owner, per_rank in (
        (expected_new, maps.owner[:real], maps.per_rank[:, :real]),
        (expected_prefix, maps.prefix_owner, maps.prefix_per_rank),
    ):
        assert owner.tolist() == [o for o, _ in owner_slots]
        for rank in range(layout.dcp_size):
            want = [slot if o == rank else NO_SLOT for o, slot in owner_slots]
            assert per_rank[rank].tolist() == want


@property_test
@given(batch=batches, layout=layouts(), seed=shuffle_seeds)
def test_every_real_token_has_exactly_one_owner(
    batch: Batch, layout: DcpLayout, seed: int | None
) -> None:
    _, maps = mappings_for(batch, layout, seed)
    real = batch.num_real_tokens
    for per_rank, owner in (
        (maps.per_rank[:, :real], maps.owner[:real]),
        (maps.prefix_per_rank, maps.prefix_owner),
    ):
        holders = per_rank >= 0
        assert holders.sum(dim=0).eq(1).all()
        assert holders.int().argmax(dim=0).tolist() == owner.tolist()


@property_test
@given(batch=batches, layout=layouts(), seed=shuffle_seeds)
def test_local_slots_are_distinct_and_inside_the_requests_blocks(
    batch: Batch, layout: DcpLayout, seed: int | None
) -> None:
    """New and cached tokens share one cache per rank, so their slots must not collide."""
    tables, maps = mappings_for(batch, layout, seed)
    real = batch.num_real_tokens
    all_slots = torch.cat([maps.per_rank[:, :real], maps.prefix_per_rank], dim=1)
    all_requests = torch.cat([maps.request_index[:real], maps.prefix_request_index])
    for rank in range(layout.dcp_size):
        owned = all_slots[rank] >= 0
        slots = all_slots[rank][owned]
        assert slots.unique().numel() == slots.numel()
        for slot, request in zip(slots.tolist(), all_requests[owned].tolist(), strict=True):
            block, offset = divmod(slot, layout.block_size)
            assert block in tables[request]
            assert 0 <= offset < layout.block_size


@property_test
@given(batch=batches, block_size=st.integers(1, 16), seed=shuffle_seeds)
def test_dcp1_is_the_plain_mapping(batch: Batch, block_size: int, seed: int | None) -> None:
    tables, maps = mappings_for(batch, DcpLayout(block_size, dcp_size=1), seed)
    expected = [
        tables[r][p // block_size] * block_size + p % block_size
        for r, request in enumerate(batch.requests)
        for p in range(request.prefix, request.length)
    ]
    assert maps.per_rank[0].tolist() == expected + [NO_SLOT] * batch.padding
    assert maps.owner[: batch.num_real_tokens].eq(0).all()


@property_test
@given(batch=batches, layout=layouts(), seed=shuffle_seeds)
def test_padding_rows_are_inert(batch: Batch, layout: DcpLayout, seed: int | None) -> None:
    _, maps = mappings_for(batch, layout, seed)
    pad = slice(batch.num_real_tokens, batch.num_tokens)
    assert maps.per_rank.shape == (layout.dcp_size, batch.num_tokens)
    assert maps.per_rank[:, pad].eq(NO_SLOT).all()
    assert maps.owner[pad].eq(-1).all()
    assert maps.request_index[pad].eq(-1).all()
    assert maps.positions[pad].eq(PADDING_POSITION).all()
    for rank in range(layout.dcp_size):
        assert maps.ownership(rank)[pad].eq(PADDING).all()


@property_test
@given(batch=batches, layout=layouts(), seed=shuffle_seeds)
def test_ownership_codes_follow_the_slots(
    batch: Batch, layout: DcpLayout, seed: int | None
) -> None:
    _, maps = mappings_for(batch, layout, seed)
    real = batch.num_real_tokens
    for rank in range(layout.dcp_size):
        codes = maps.ownership(rank)[:real]
        assert ((codes == OWNED) == (maps.per_rank[rank, :real] >= 0)).all()
        assert ((codes == FOREIGN) == (maps.per_rank[rank, :real] == NO_SLOT)).all()


@property_test
@given(batch=batches, layout=layouts(), seed=shuffle_seeds)
def test_owner_is_the_interleave_run_dealt_round_robin(
    batch: Batch, layout: DcpLayout, seed: int | None
) -> None:
    """Because ``I`` divides ``B * n``, runs of ``I`` never straddle a virtual block and the
    owner of position ``p`` is simply ``(p // I) % n`` across the whole sequence."""
    _, maps = mappings_for(batch, layout, seed)
    real = batch.num_real_tokens
    positions = maps.positions[:real]
    assert (
        maps.owner[:real].tolist() == ((positions // layout.interleave) % layout.dcp_size).tolist()
    )


@property_test
@given(batch=batches, block_size=st.integers(1, 16), dcp_size=st.integers(1, 8), seed=shuffle_seeds)
def test_interleave_equal_to_block_size_gives_each_rank_whole_blocks(
    batch: Batch, block_size: int, dcp_size: int, seed: int | None
) -> None:
    """With ``I = B`` rank ``r`` stores the ``r``-th chunk of ``B`` positions of each virtual
    block, unchanged in order: its slot is the plain ``bt[k] * B + p % B``."""
    layout = DcpLayout(block_size, dcp_size, interleave=block_size)
    tables, maps = mappings_for(batch, layout, seed)
    virtual = block_size * dcp_size
    for row, (request, position) in enumerate(
        zip(maps.request_index.tolist(), maps.positions.tolist(), strict=True)
    ):
        if request < 0:
            continue
        owner = (position % virtual) // block_size
        assert maps.owner[row] == owner
        assert maps.per_rank[owner, row] == tables[request][position // virtual] * block_size + (
            position % block_size
        )


# ---------------------------------------------------------------------------------------
# Block tables


@property_test
@given(batch=batches, block_size=st.integers(1, 16), dcp_size=st.integers(1, 8), seed=shuffle_seeds)
def test_block_tables_are_sized_and_distinct(
    batch: Batch, block_size: int, dcp_size: int, seed: int | None
) -> None:
    tables = build_block_tables(batch, block_size, dcp_size, seed)
    assert len(tables) == len(batch.requests)
    for request, table in zip(batch.requests, tables, strict=True):
        assert len(table) == -(-request.length // (block_size * dcp_size))
    ids = [block for table in tables for block in table]
    assert sorted(ids) == list(range(len(ids)))
    assert num_blocks(tables) == len(ids)
    if seed is None:
        assert ids == list(range(len(ids)))


def test_shuffled_block_tables_are_seeded() -> None:
    batch = Batch((Request(prefix=20, new=12), Request(prefix=3, new=1)))
    identity = build_block_tables(batch, 4, 1, shuffle_seed=None)
    assert identity == ((0, 1, 2, 3, 4, 5, 6, 7), (8,))
    first = build_block_tables(batch, 4, 1, shuffle_seed=5)
    assert first == build_block_tables(batch, 4, 1, shuffle_seed=5)
    assert first != identity
    assert first != build_block_tables(batch, 4, 1, shuffle_seed=6)


def test_num_blocks_of_no_tables_is_zero() -> None:
    assert num_blocks(()) == 0
    assert num_blocks(((4, 2), (9,))) == 10


# ---------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    ("block_size", "dcp_size", "interleave", "field", "words"),
    [
        (16, 2, 3, "interleave", "interleave 3 does not divide block_size 16"),
        (4, 2, 8, "interleave", "interleave 8 does not divide block_size 4"),
        (16, 0, 1, "dcp_size", "dcp_size must be an integer >= 1, got 0"),
        (0, 2, 1, "block_size", "block_size must be an integer >= 1, got 0"),
        (-4, 1, 1, "block_size", "block_size must be an integer >= 1, got -4"),
        (16, 2, 0, "interleave", "interleave must be an integer >= 1, got 0"),
        (16, True, 1, "dcp_size", "dcp_size must be an integer >= 1, got True"),
    ],
)
def test_bad_layouts_are_rejected(
    block_size: int, dcp_size: int, interleave: int, field: str, words: str
) -> None:
    with pytest.raises(DcpLayoutError, match=words) as raised:
        DcpLayout(block_size, dcp_size, interleave)
    assert raised.value.field == field
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: Request(prefix=-1, new=1), "prefix"),
        (lambda: Request(prefix=0, new=0), "new"),
        (lambda: Batch((Request(0, 1),), padding=-1), "padding"),
    ],
)
def test_bad_batches_are_rejected(make, field: str) -> None:
    with pytest.raises(BatchError, match=field) as raised:
        make()
    assert raised.value.field == field


def test_block_tables_must_cover_every_request() -> None:
    batch = Batch((Request(prefix=5, new=4),))  # 9 tokens: 3 blocks of 4 at DCP1
    with pytest.raises(DcpLayoutError, match="request 0 needs 3 blocks"):
        slot_mappings(batch, DcpLayout(4, 1), ((0, 1),))
    with pytest.raises(DcpLayoutError, match="2 block tables for 1 requests"):
        slot_mappings(batch, DcpLayout(4, 1), ((0, 1, 2), (3,)))


def test_ownership_rejects_a_rank_outside_the_layout() -> None:
    _, maps = mappings_for(Batch((Request(1, 1),)), DcpLayout(4, 2), None)
    with pytest.raises(IndexError, match="rank 2 out of range for DCP size 2"):
        maps.ownership(2)


def test_a_mapping_asked_for_again_is_the_callers_own() -> None:
    """The last mappings computed are kept (``slot_mappings``): a caller that writes into its
    tensors must not change what the next caller of the same batch and layout gets."""
    batch = Batch((Request(prefix=3, new=2),))
    layout, tables = DcpLayout(block_size=2, dcp_size=2), ((5, 0),)
    first = slot_mappings(batch, layout, tables)
    for name in first.__dataclass_fields__:
        getattr(first, name).fill_(99)
    again = slot_mappings(batch, layout, tables)
    assert again.prefix_per_rank.tolist() == [[10, -1, 11], [-1, 10, -1]]
    assert again.per_rank.tolist() == [[-1, 0], [11, -1]]
    assert again.positions.tolist() == [3, 4]


def test_block_ids_are_checked_even_where_an_equal_table_was_mapped() -> None:
    """``True == 1`` and they hash alike: the check runs before the kept mappings are read."""
    batch = Batch((Request(prefix=0, new=2),))
    slot_mappings(batch, DcpLayout(2, 1), ((1,),))
    with pytest.raises(DcpLayoutError, match="block ids must be integers"):
        slot_mappings(batch, DcpLayout(2, 1), ((True,),))
