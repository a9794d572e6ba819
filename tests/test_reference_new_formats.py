"""The oracle's newer cache formats against hand-computed bytes: nvfp4_ds_mla entries, the
shuffled indexer value layout and MX-packed (UE8M0) indexer scales.

Every expected byte and value here is worked out by hand in the comments next to it, from
the definitions (docs/fused-norm-rope.md): e2m1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 as codes
0..7 with the sign in bit 3, ties to the even code; e4m3 bytes ``S.EEEE.MMM`` with bias 7
(1.0 = 0x38, 448 = 0x7E, 2^-9 = 0x01); scale of tile ``s`` at byte ``8*(s&3) + (s>>2)`` of
the scale region; shuffled offset ``(t//16)*16*I + (c//16)*256 + (t%16)*16 + c%16``; UE8M0
byte = 127 + log2(scale). Property tests decode e4m3 bytes with the bit formula in this
file (:func:`_e4m3_value`), never with the oracle's own decoder.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import reference as ref
from reference.cache_layouts import (
    NVFP4_DS_MLA_ROPE_OFFSET,
    NVFP4_DS_MLA_SCALES_OFFSET,
)

NVFP4 = "nvfp4_ds_mla"
KV, ROPE, INDEX_DIM = 512, 64, 128
SCALES = NVFP4_DS_MLA_SCALES_OFFSET  # 320, checked below against 256 + 64


def _e4m3_value(byte: int) -> float:
    """float8_e4m3fn byte -> value by the bit formula (bias 7, subnormals below exponent 1)."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    if exponent == 0:
        return sign * mantissa * 2.0**-9
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


E4M3_POSITIVE = sorted(
    {_e4m3_value(b) for b in range(0x01, 0x7F)}  # 0x7F is NaN
)


def _entry(kv: torch.Tensor, kpe: torch.Tensor, **kwargs: str) -> list[int]:
    entry = ref.encode_mla_entries(kv[None], kpe[None], NVFP4, torch.bfloat16, None, **kwargs)
    assert entry.dtype == torch.uint8 and entry.shape == (1, 352)
    return entry[0].tolist()


# --- e2m1 --------------------------------------------------------------------------------


def test_e2m1_codes_of_every_representable_value_and_sign():
    magnitudes = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert ref.e2m1_codes(torch.tensor(magnitudes)).tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    negatives = [-m for m in magnitudes]  # -0.0 keeps its sign bit: code 8
    assert ref.e2m1_codes(torch.tensor(negatives)).tolist() == [8, 9, 10, 11, 12, 13, 14, 15]
    decoded = ref.e2m1_values(torch.arange(16, dtype=torch.uint8))
    assert decoded.tolist() == magnitudes + negatives
    assert torch.signbit(decoded[8])  # code 8 is -0, not +0


@pytest.mark.parametrize(
    ("x", "code"),
    [
        # ties go to the even code (mantissa bit 0): 0 (0.0), 2 (1.0), 4 (2.0), 6 (4.0)
        (0.25, 0),  # 0.0 | 0.5
        (0.75, 2),  # 0.5 | 1.0
        (1.25, 2),  # 1.0 | 1.5
        (1.75, 4),  # 1.5 | 2.0
        (2.5, 4),  # 2.0 | 3.0
        (3.5, 6),  # 3.0 | 4.0
        (5.0, 6),  # 4.0 | 6.0
        (-0.25, 8),  # -0
        (-2.5, 12),  # -2.0
        (-5.0, 14),  # -4.0
        # just off a tie: plain nearest
        (0.2500001, 1),
        (0.7499999, 1),
        (4.9999995, 6),
        (5.0000005, 7),
        (1.2500001, 3),
        # saturation to +-6
        (6.5, 7),
        (7.0, 7),
        (100.0, 7),
        (float("inf"), 7),
        (-7.0, 15),
        (float("-inf"), 15),
        # a negative that rounds to zero keeps its sign
        (-0.1, 8),
    ],
)
def test_e2m1_rounding_by_hand(x: float, code: int):
    assert ref.e2m1_codes(torch.tensor([x])).tolist() == [code]


# --- nvfp4 tile scale ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("amax", "scale"),
    [
        (0.0, 2.0**-9),  # floor: e4m3(2^-9) is the smallest subnormal, byte 0x01
        (0.003, 2.0**-9),  # 0.0005 < 2^-9: floored
        (6 * 2.0**-8, 2.0**-8),  # a subnormal scale, byte 0x02
        (6.0, 1.0),
        (6.375, 1.0),  # 1.0625 is the 1.0 | 1.125 midpoint: to the even 1.0, never up
        (6.6, 1.125),  # 1.1 -> nearest 1.125
        (2688.0, 448.0),  # 6 * 448: the largest scale exactly
        (2784.0, 448.0),  # 464 is beyond the largest finite e4m3: saturates
        (1e6, 448.0),
        (float("inf"), 448.0),
    ],
)
def test_nvfp4_tile_scale_by_hand(amax: float, scale: float):
    for rule in ref.NVFP4_SCALE_RULES:
        assert ref.nvfp4_tile_scale(torch.tensor([amax]), rule).tolist() == [scale]


def test_nvfp4_scale_rules_differ_where_the_ratio_straddles_a_midpoint():
    # amax = 7.125 - 2^-21 (one fp32 ulp below 6 * 1.1875). amax / 6 rounds to
    # 1.1875 - 2^-23, below the 1.125 | 1.25 midpoint 1.1875: e4m3 1.125. amax * fp32(1/6)
    # is about 2^-25 larger and rounds onto 1.1875 exactly, a tie that goes to the even 1.25.
    amax = torch.tensor([7.125 - 2.0**-21])
    assert ref.nvfp4_tile_scale(amax, "div").tolist() == [1.125]
    assert ref.nvfp4_tile_scale(amax, "mul").tolist() == [1.25]
    assert ref.nvfp4_tile_scale(amax).tolist() == [1.125]  # the documented amax / 6: default
    with pytest.raises(ValueError, match="tile-scale rule"):
        ref.nvfp4_tile_scale(amax, "round_up")


# --- nvfp4_ds_mla entries -----------------------------------------------------------------


def _golden_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    kv = torch.zeros(KV)
    # tile 0, amax 6 -> scale 1.0 (0x38); value i sits at element i
    kv[0:16] = torch.tensor([0.5, 0, 1, 1.5, 2, 3, 4, 6, -0.5, -1, -1.5, -2, -3, -4, -6, 0.25])
    # tile 1 stays all zero -> scale 2^-9 (0x01), nibbles 0
    # tile 2, amax 6.375 -> ratio 1.0625, a tie -> scale 1.0 (0x38)
    kv[32:41] = torch.tensor([6.375, 0.75, -1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 0.2])
    # tile 3, amax 6.6 -> scale 1.125 (0x39); 2.8125 / 1.125 = 2.5 exactly, a tie
    kv[48:51] = torch.tensor([6.6, 2.8125, -0.1])
    # tile 4, amax 1e6 -> scale saturates to 448 (0x7E)
    kv[64:68] = torch.tensor([1e6, 1120.0, -2240.0, 448.0])
    # tile 5: the rules differ (scale 1.125 = 0x39 by "div", 1.25 = 0x3A by "mul")
    kv[80] = 7.125 - 2.0**-21
    # tile 6, amax 6 * 2^-8 -> subnormal scale 2^-8 (0x02)
    kv[96:98] = torch.tensor([0.0234375, -0.01171875])
    # tile 31, amax 0.003 -> floor 2^-9 (0x01)
    kv[496:498] = torch.tensor([0.003, -(2.0**-10)])
    kpe = torch.zeros(ROPE)
    kpe[:13] = torch.tensor(
        [1.0, -2.0, 448.0, 1000.0, -1000.0, 0.0, 1.0625, 2.0**-9, 3.0, 0.5, -0.0, 2.0**-10,
         3 * 2.0**-10]
    )  # fmt: skip
    return kv, kpe


def test_nvfp4_constants():
    assert ref.NVFP4_DS_MLA_ENTRY_BYTES == 352 == 256 + 64 + 32
    assert (NVFP4_DS_MLA_ROPE_OFFSET, NVFP4_DS_MLA_SCALES_OFFSET) == (256, 320)
    assert ref.mla_entry_bytes(NVFP4, KV, ROPE, torch.bfloat16) == 352
    assert ref.mla_entry_bytes("fp8_ds_mla", KV, ROPE, torch.bfloat16) == 656
    assert NVFP4 in ref.MLA_LAYOUTS


def test_nvfp4_entry_nope_bytes_by_hand():
    nope = _entry(*_golden_inputs())[:256]
    # tile 0, codes 1 0 2 3 4 5 6 7 9 10 11 12 13 14 15 0; element 2j in the low nibble
    assert nope[0:8] == [0x01, 0x32, 0x54, 0x76, 0xA9, 0xCB, 0xED, 0x0F]
    assert nope[8:16] == [0] * 8  # tile 1: zeros
    # tile 2 (scale 1.0): 6.375 -> 7 (saturated), 0.75 -> 2, -1.25 -> 10, 1.75 -> 4,
    # 2.5 -> 4, 3.5 -> 6, 5 -> 6, -5 -> 14, 0.2 -> 0
    assert nope[16:24] == [0x27, 0x4A, 0x64, 0xE6, 0, 0, 0, 0]
    # tile 3 (scale 1.125): 6.6/1.125 = 5.87 -> 7, 2.5 -> 4, -0.089 -> 8 (-0)
    assert nope[24:32] == [0x47, 0x08, 0, 0, 0, 0, 0, 0]
    # tile 4 (scale 448): 2232 -> 7, 2.5 -> 4, -5 -> 14, 1 -> 2
    assert nope[32:40] == [0x47, 0x2E, 0, 0, 0, 0, 0, 0]
    # tile 5 (scale 1.125): 6.33 -> 7
    assert nope[40:48] == [0x07, 0, 0, 0, 0, 0, 0, 0]
    # tile 6 (scale 2^-8): 6 -> 7, -3 -> 13
    assert nope[48:56] == [0xD7, 0, 0, 0, 0, 0, 0, 0]
    # tile 31 (scale 2^-9): 0.003 * 512 = 1.536 -> 1.5 (3), -2^-10 * 512 = -0.5 (9)
    assert nope[248:256] == [0x93, 0, 0, 0, 0, 0, 0, 0]
    assert nope[56:248] == [0] * 192


def test_nvfp4_entry_rope_bytes_are_unscaled_e4m3():
    rope = _entry(*_golden_inputs())[256:320]
    # 1.0 0x38, -2.0 0xC0, 448 0x7E, 1000 and -1000 saturate (0x7E, 0xFE), 0 0x00,
    # 1.0625 ties to the even 1.0 (0x38), 2^-9 0x01, 3.0 = 1.5 * 2 0x44, 0.5 0x30, -0 0x80,
    # 2^-10 ties to 0 (0x00), 3 * 2^-10 ties to the even 2^-8 (0x02)
    assert rope[:13] == [0x38, 0xC0, 0x7E, 0x7E, 0xFE, 0x00, 0x38, 0x01, 0x44, 0x30, 0x80,
                         0x00, 0x02]  # fmt: skip
    assert rope[13:] == [0] * 51


def test_nvfp4_entry_scale_bytes_by_hand():
    kv, kpe = _golden_inputs()
    expected = [0x01] * 32  # every zero tile: the 2^-9 floor
    expected[0] = 0x38  # tile 0 -> byte 0
    expected[16] = 0x38  # tile 2 -> 8 * 2 + 0
    expected[24] = 0x39  # tile 3 -> 8 * 3 + 0
    expected[1] = 0x7E  # tile 4 -> 8 * 0 + 1
    expected[9] = 0x39  # tile 5 -> 8 * 1 + 1, "div"
    expected[17] = 0x02  # tile 6 -> 8 * 2 + 1
    assert _entry(kv, kpe)[SCALES:] == expected
    expected[9] = 0x3A  # tile 5 by "mul": 1.25
    assert _entry(kv, kpe, nvfp4_scale="mul")[SCALES:] == expected


def test_nvfp4_scale_byte_permutation():
    # tile s holds one value, 6 * e4m3(0x20 + s), so its scale byte is exactly 0x20 + s;
    # byte 0x20 + s is (1 + (s % 8) / 8) * 2^(4 + s // 8 - 7)
    kv = torch.zeros(KV)
    for s in range(32):
        kv[16 * s] = 6 * (1 + (s % 8) / 8) * 2.0 ** (s // 8 - 3)
    entry = _entry(kv, torch.zeros(ROPE))
    # scale region byte b holds tile 4 * (b % 8) + b // 8
    assert bytes(entry[SCALES:]) == bytes.fromhex(
        "2024282c3034383c 2125292d3135393d 22262a2e32363a3e 23272b2f33373b3f"
    )
    assert entry[SCALES + 0] == 0x20  # tile 0 at byte 0
    assert entry[SCALES + 8] == 0x21  # tile 1 at byte 8
    assert entry[SCALES + 1] == 0x24  # tile 4 at byte 1
    assert entry[SCALES + 31] == 0x3F  # tile 31 at byte 31
    # every tile's value is 6 * its scale: code 7 in the low nibble of byte 8 s
    assert entry[:256] == [0x07 if b % 8 == 0 else 0 for b in range(256)]


def test_nvfp4_decode_by_hand():
    kv, kpe = _golden_inputs()
    entries = ref.encode_mla_entries(kv[None], kpe[None], NVFP4, torch.bfloat16, None)
    dec_kv, dec_kpe = ref.decode_mla_entries(entries, NVFP4, KV, ROPE, torch.bfloat16, None)
    expected = torch.zeros(KV)
    expected[0:16] = torch.tensor([0.5, 0, 1, 1.5, 2, 3, 4, 6, -0.5, -1, -1.5, -2, -3, -4, -6, 0])
    expected[32:41] = torch.tensor([6.0, 1.0, -1.0, 2.0, 2.0, 4.0, 4.0, -4.0, 0.0])
    expected[48:51] = torch.tensor([6.75, 2.25, -0.0])  # 6 * 1.125, 2 * 1.125
    expected[64:68] = torch.tensor([2688.0, 896.0, -1792.0, 448.0])  # 6, 2, -4, 1 times 448
    expected[80] = 6.75
    expected[96:98] = torch.tensor([0.0234375, -0.01171875])
    expected[496:498] = torch.tensor([1.5 * 2.0**-9, -(2.0**-10)])
    assert torch.equal(dec_kv[0], expected)
    expected_kpe = torch.zeros(ROPE)
    expected_kpe[:13] = torch.tensor(
        [1.0, -2.0, 448.0, 448.0, -448.0, 0.0, 1.0, 2.0**-9, 3.0, 0.5, -0.0, 0.0, 2.0**-8]
    )
    assert torch.equal(dec_kpe[0], expected_kpe)
    assert dec_kv.dtype == dec_kpe.dtype == torch.float32


def _half_step(q: float) -> float:
    """Half the gap between the e2m1 neighbours around magnitude ``q <= 6`` (the rounding
    bound): 0.25 below 2, 0.5 below 4, 1 up to 6."""
    if q < 2:
        return 0.25
    if q < 4:
        return 0.5
    return 1.0


def test_nvfp4_round_trip_within_half_an_e2m1_step():
    gen = torch.Generator().manual_seed(21)
    tokens = 6
    octaves = torch.randint(-14, 11, (tokens, 32, 1), generator=gen).float()
    kv = (torch.randn(tokens, 32, 16, generator=gen) * torch.exp2(octaves)).reshape(tokens, KV)
    kv[0, :16] = 0.0  # one all-zero tile
    kpe = torch.randn(tokens, ROPE, generator=gen) * 30
    entries = ref.encode_mla_entries(kv, kpe, NVFP4, torch.float16, None)
    dec_kv, dec_kpe = ref.decode_mla_entries(entries, NVFP4, KV, ROPE, torch.float16, None)
    for t, s in itertools.product(range(tokens), range(32)):
        tile = kv[t, 16 * s : 16 * s + 16].double()
        scale = _e4m3_value(int(entries[t, SCALES + 8 * (s & 3) + (s >> 2)]))
        # the stored scale is the e4m3 value nearest max(amax / 6, 2^-9)
        ratio = max(float(tile.abs().max()) / 6, 2.0**-9)
        assert abs(scale - ratio) <= min(abs(v - ratio) for v in E4M3_POSITIVE) * (1 + 1e-6)
        for x, d in zip(tile.tolist(), dec_kv[t, 16 * s : 16 * s + 16].tolist(), strict=True):
            if abs(x) / scale > 6:
                # Saturated. With a normal scale (nearest e4m3, 3 mantissa bits) amax / scale
                # stays within 6 * (1 + 2^-4), but a subnormal scale is coarse: amax / 6 =
                # 1.4 * 2^-9 stores 2^-9, and amax / scale is 8.4. Either way: +-6 * scale.
                assert d == (6 * scale if x > 0 else -6 * scale), (t, s, x, d)
            else:
                assert abs(d - x) <= _half_step(abs(x) / scale) * scale * (1 + 1e-6), (t, s, x, d)
    # RoPE: e4m3 keeps 3 mantissa bits, so half a step is 2^-4 relative (2^-10 subnormal)
    assert ((dec_kpe - kpe).abs() <= kpe.abs() * 2.0**-4 + 2.0**-10).all()


@pytest.mark.parametrize("layout", ["auto", "fp8_ds_mla", NVFP4])
def test_no_tokens_encode_to_no_entries(layout):
    """A batch without a cached prefix encodes zero prefix rows (the property search's
    nvfp4 examples hit this first: packing e2m1 pairs of zero rows)."""
    kv, kpe = torch.zeros(0, KV), torch.zeros(0, ROPE)
    entries = ref.encode_mla_entries(kv, kpe, layout, torch.bfloat16, None)
    assert entries.shape[0] == 0 and entries.dtype == torch.uint8


def test_nvfp4_layout_checks():
    kv, kpe = torch.zeros(1, KV), torch.zeros(1, ROPE)
    with pytest.raises(ValueError, match="nvfp4_ds_mla needs kv dim 512"):
        ref.encode_mla_entries(torch.zeros(1, 256), kpe, NVFP4, torch.bfloat16, None)
    with pytest.raises(ValueError, match="no per-tensor scale"):
        ref.encode_mla_entries(kv, kpe, NVFP4, torch.bfloat16, 0.5)
    with pytest.raises(ValueError, match="tile-scale rule"):
        ref.encode_mla_entries(kv, kpe, NVFP4, torch.bfloat16, None, nvfp4_scale="up")
    with pytest.raises(ValueError, match=r"uint8 \[T, 352\]"):
        ref.decode_mla_entries(
            torch.zeros(1, 656, dtype=torch.uint8), NVFP4, KV, ROPE, torch.bfloat16, None
        )
    with pytest.raises(ValueError, match="nvfp4_ds_mla needs kv dim 512"):
        ref.mla_entry_bytes(NVFP4, 256, ROPE, torch.bfloat16)


def _fused_inputs(tokens: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "q_c": torch.randn(tokens, 64, generator=gen).to(torch.bfloat16),
        "q_weight": torch.rand(64, generator=gen).to(torch.bfloat16),
        "kv_c": torch.randn(tokens, KV, generator=gen).to(torch.bfloat16),
        "kv_weight": torch.rand(KV, generator=gen).to(torch.bfloat16),
        "k_pe": torch.randn(tokens, ROPE, generator=gen).to(torch.bfloat16),
        "positions": torch.randint(1, 100, (tokens,), generator=gen),
        "index_k": torch.randn(tokens, INDEX_DIM, generator=gen).to(torch.bfloat16),
        "index_weight": torch.rand(INDEX_DIM, generator=gen).to(torch.bfloat16),
        "index_bias": torch.randn(INDEX_DIM, generator=gen).to(torch.bfloat16),
    }


def _fused(x: dict[str, torch.Tensor], **kwargs: str) -> ref.FusedReference:
    cos_sin = ref.cos_sin_table(128, ROPE, 10000.0)
    return ref.fused_norm_rope(
        x["q_c"], x["q_weight"], x["kv_c"], x["kv_weight"], x["k_pe"], x["positions"],
        cos_sin, 1e-6, cache_layout=NVFP4, index_k=x["index_k"],
        index_weight=x["index_weight"], index_bias=x["index_bias"], **kwargs,
    )  # fmt: skip


def test_nvfp4_flows_through_fused_norm_rope_and_expected_caches():
    x = _fused_inputs(3, 5)
    out = _fused(x)
    assert out.mla_entries.shape == (3, 352)
    # the entries are the fp32 results encoded (never the bf16 outputs)
    for rule in ref.NVFP4_SCALE_RULES:
        encoded = ref.encode_mla_entries(
            _fused(x, nvfp4_scale=rule).kv_fp32, out.kpe_fp32, NVFP4, torch.bfloat16, None,
            nvfp4_scale=rule,
        )  # fmt: skip
        assert torch.equal(_fused(x, nvfp4_scale=rule).mla_entries, encoded)
    with pytest.raises(ValueError, match="tile-scale rule"):
        _fused(x, nvfp4_scale="nope")
    gen = torch.Generator().manual_seed(9)
    mla = torch.randint(0, 256, (2, 4, 352), dtype=torch.uint8, generator=gen)
    index = torch.zeros(2, 16, INDEX_DIM + 4, dtype=torch.uint8)
    slots = torch.tensor([5, -1, 0])
    new_mla, _ = ref.expected_caches(mla, index, slots, slots, out)
    assert torch.equal(new_mla[1, 1], out.mla_entries[0])
    assert torch.equal(new_mla[0, 0], out.mla_entries[2])
    changed = (new_mla != mla).any(-1).nonzero().tolist()
    assert changed == [[0, 0], [1, 1]]


# --- shuffled indexer layout --------------------------------------------------------------

BLOCK = 32
BLOCK_BYTES = BLOCK * (INDEX_DIM + 4)  # 4224


@pytest.mark.parametrize(
    ("token", "lane", "offset"),
    [
        # (t // 16) * 2048 + (c // 16) * 256 + (t % 16) * 16 + c % 16, for I = 128
        (0, 0, 0),
        (0, 15, 15),
        (0, 16, 256),
        (1, 0, 16),
        (15, 15, 255),
        (16, 0, 2048),
        (5, 100, 1620),  # 6 * 256 + 5 * 16 + 4
        (17, 33, 2577),  # 2048 + 2 * 256 + 16 + 1
        (31, 127, 4095),  # 2048 + 7 * 256 + 15 * 16 + 15: the block's last value byte
    ],
)
@pytest.mark.parametrize("block", [0, 1])
def test_shuffled_value_offsets_by_hand(block: int, token: int, lane: int, offset: int):
    values = torch.zeros(1, INDEX_DIM, dtype=torch.uint8)
    values[0, lane] = 0xAB
    cache = torch.zeros(2, BLOCK, INDEX_DIM + 4, dtype=torch.uint8)
    slot = torch.tensor([block * BLOCK + token])
    written = ref.write_index_cache(cache, slot, values, torch.tensor([0.0]), shuffled=True)
    assert written.view(-1).nonzero().flatten().tolist() == [block * BLOCK_BYTES + offset]
    read_values, _ = ref.read_index_cache(written, slot, INDEX_DIM, shuffled=True)
    assert torch.equal(read_values, values)


def _index_rows(tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(0, 256, (tokens, INDEX_DIM), dtype=torch.uint8, generator=gen)
    scales = torch.exp2(torch.randint(-20, 5, (tokens,), generator=gen).float())
    return values, scales


def test_shuffled_scales_follow_the_values_as_in_the_plain_layout():
    values, scales = _index_rows(1, 3)
    cache = torch.zeros(2, BLOCK, INDEX_DIM + 4, dtype=torch.uint8)
    written = ref.write_index_cache(cache, torch.tensor([BLOCK + 7]), values, scales, shuffled=True)
    start = BLOCK_BYTES + BLOCK * INDEX_DIM + 4 * 7  # block 1, after 4096 value bytes, token 7
    assert written.view(-1)[start : start + 4].tolist() == list(
        scales.numpy().astype("<f4").tobytes()
    )


def test_shuffled_round_trip_and_permutation_of_the_plain_layout():
    values, scales = _index_rows(2 * BLOCK, 4)
    slots = torch.randperm(2 * BLOCK, generator=torch.Generator().manual_seed(5))
    cache = torch.zeros(2, BLOCK, INDEX_DIM + 4, dtype=torch.uint8)
    shuffled = ref.write_index_cache(cache, slots, values, scales, shuffled=True)
    plain = ref.write_index_cache(cache, slots, values, scales)
    read_values, read_scales = ref.read_index_cache(shuffled, slots, INDEX_DIM, shuffled=True)
    assert torch.equal(read_values, values) and torch.equal(read_scales, scales)
    for block in range(2):
        s_block = shuffled.view(2, -1)[block].tolist()
        p_block = plain.view(2, -1)[block].tolist()
        for t, c in itertools.product(range(BLOCK), range(INDEX_DIM)):
            offset = (t // 16) * 16 * INDEX_DIM + (c // 16) * 256 + (t % 16) * 16 + c % 16
            assert s_block[offset] == p_block[t * INDEX_DIM + c], (block, t, c)
        assert s_block[BLOCK * INDEX_DIM :] == p_block[BLOCK * INDEX_DIM :]  # scales identical
    # the same permutation, as a tensor transpose: [B/16, 16, I/16, 16] -> [B/16, I/16, 16, 16]
    plain_values = plain.view(2, -1)[:, : BLOCK * INDEX_DIM].reshape(2, 2, 16, 8, 16)
    shuffled_values = shuffled.view(2, -1)[:, : BLOCK * INDEX_DIM].reshape(2, 2, 8, 16, 16)
    assert torch.equal(shuffled_values, plain_values.transpose(2, 3))


@pytest.mark.parametrize("block_size", [8, 24])
def test_shuffled_needs_blocks_of_16(block_size: int):
    values, scales = _index_rows(1, 6)
    cache = torch.zeros(2, block_size, INDEX_DIM + 4, dtype=torch.uint8)
    slot = torch.tensor([1])
    with pytest.raises(ValueError, match="multiples of 16"):
        ref.write_index_cache(cache, slot, values, scales, shuffled=True)
    with pytest.raises(ValueError, match="multiples of 16"):
        ref.read_index_cache(cache, slot, INDEX_DIM, shuffled=True)
    ref.write_index_cache(cache, slot, values, scales)  # the plain layout takes any block size


# --- MX-packed indexer scales -------------------------------------------------------------


def test_mx_scale_bytes_by_hand():
    # UE8M0 byte = 127 + log2(scale): 2^-5 -> 122 (0x7A), 1 -> 127 (0x7F), 2^-22 -> 105
    # (0x69, the indexer's smallest scale), 8 -> 130 (0x82)
    scales = torch.tensor([2.0**-5, 1.0, 2.0**-22, 8.0])
    encoded = ref.encode_index_scales(scales, "mx")
    assert encoded.tolist() == [[0x7A] * 4, [0x7F] * 4, [0x69] * 4, [0x82] * 4]
    assert [int.from_bytes(bytes(row), "little") for row in encoded.tolist()] == [
        0x7A7A7A7A, 0x7F7F7F7F, 0x69696969, 0x82828282,
    ]  # fmt: skip
    assert torch.equal(ref.decode_index_scales(encoded, "mx"), scales)
    # the fp32 format is the scale's own bytes: 2^-5 = 0x3D000000
    assert ref.encode_index_scales(scales[:1], "fp32").tolist() == [[0x00, 0x00, 0x00, 0x3D]]


def test_mx_scale_of_the_oracle_indexer_encoding():
    # a row with amax 1.0: 2^ceil(log2(1 / 448)) = 2^-8 (448 < 512), byte 119 (0x77)
    row = torch.zeros(1, INDEX_DIM)
    row[0, 3] = -1.0
    _, scales = ref.encode_index_entries(row)
    assert scales.tolist() == [2.0**-8]
    assert ref.encode_index_scales(scales, "mx").tolist() == [[0x77] * 4]


def test_mx_write_and_read_in_the_cache():
    values, _ = _index_rows(2, 7)
    scales = torch.tensor([2.0**-5, 2.0**-12])  # bytes 0x7A and 115 (0x73)
    cache = torch.zeros(1, 16, INDEX_DIM + 4, dtype=torch.uint8)
    slots = torch.tensor([3, 9])
    for shuffled in (False, True):
        written = ref.write_index_cache(
            cache, slots, values, scales, shuffled=shuffled, scale_format="mx"
        )
        flat = written.view(-1).tolist()
        assert flat[16 * INDEX_DIM + 12 : 16 * INDEX_DIM + 16] == [0x7A] * 4  # token 3
        assert flat[16 * INDEX_DIM + 36 : 16 * INDEX_DIM + 40] == [0x73] * 4  # token 9
        read_values, read_scales = ref.read_index_cache(
            written, slots, INDEX_DIM, shuffled=shuffled, scale_format="mx"
        )
        assert torch.equal(read_values, values) and torch.equal(read_scales, scales)


def test_mx_rejects_and_flags_bad_scales():
    for bad in (0.75, 0.0, -0.5, 2.0**-130):  # not a power of two, zero, negative, subnormal
        with pytest.raises(ValueError, match="power of two"):
            ref.encode_index_scales(torch.tensor([bad]), "mx")
    assert ref.encode_index_scales(torch.tensor([float("inf")]), "mx").tolist() == [[0xFF] * 4]
    words = torch.tensor([[0xFF] * 4, [0x7A, 0x7A, 0x7B, 0x7A], [0x00] * 4], dtype=torch.uint8)
    decoded = ref.decode_index_scales(words, "mx")
    assert decoded[:2].isnan().all()  # the NaN byte, and a word that is not one byte x4
    assert decoded[2].item() == 2.0**-127
    with pytest.raises(ValueError, match="unknown indexer scale format"):
        ref.encode_index_scales(torch.tensor([1.0]), "e8m0")
    with pytest.raises(ValueError, match="unknown indexer scale format"):
        ref.read_index_cache(
            torch.zeros(1, 16, INDEX_DIM + 4, dtype=torch.uint8), torch.tensor([0]), INDEX_DIM,
            scale_format="ue8m0",
        )  # fmt: skip


def test_expected_caches_take_the_indexer_layout_and_scale_format():
    x = _fused_inputs(3, 8)
    out = _fused(x)
    mla = torch.zeros(2, 16, 352, dtype=torch.uint8)
    index = torch.zeros(2, 16, INDEX_DIM + 4, dtype=torch.uint8)
    slots, index_slots = torch.tensor([0, 17, -1]), torch.tensor([18, -1, 1])
    _, new_index = ref.expected_caches(
        mla, index, slots, index_slots, out, index_shuffled=True, index_scale_format="mx"
    )
    direct = ref.write_index_cache(
        index, index_slots, out.index_values, out.index_scales, shuffled=True, scale_format="mx"
    )
    assert torch.equal(new_index, direct)
    # token 0 at slot 18 = block 1 offset 2: lane 0 at 2 * 16, its scale at 2048 + 8
    block1 = new_index.view(2, -1)[1]
    assert block1[32].item() == out.index_values[0, 0].item()
    exponent = 127 + int(torch.log2(out.index_scales[0]).item())
    assert block1[2048 + 8 : 2048 + 12].tolist() == [exponent] * 4
    _, plain = ref.expected_caches(mla, index, slots, index_slots, out)
    assert not torch.equal(plain, new_index)
