"""The oracle (``reference/``) against independent formulations of the same math.

Nothing here compares the oracle with itself: norms are checked against
``torch.nn.functional``, interleaved RoPE against complex multiplication, NeoX RoPE
against the rotate-half formulation, fp8 decoding against the e4m3 bit formula, and cache
layouts against bytes indexed by hand (``struct``). Small hand-computed cases pin the
arithmetic where a library could share the oracle's mistake.

Tolerances: fp32 results that are computed in a different order (F.rms_norm, complex
multiplication) agree to a few fp32 ulps, hence ``torch.testing.assert_close``'s fp32
defaults; quantization round trips are bounded by half an fp8 step (relative 2^-4 for
normal values, an absolute 2^-10 * scale for subnormals).
"""

from __future__ import annotations

import math
import struct

import pytest
import torch
import torch.nn.functional as F

import reference as ref
from dcpcheck.ops.fused_norm_rope import contract
from dcpcheck.ops.fused_norm_rope.tolerances import OUTPUT, ulp_distance
from reference.quant import FLT_MIN

ROPE_DIM = 64
HALF = ROPE_DIM // 2
BASE = 10000.0
MAX_POS = 4096
FP8_HALF_STEP_REL = 2.0**-4
"""e4m3 keeps 3 mantissa bits: rounding moves a normal value by at most 2^-4 of it."""
FP8_HALF_SUBNORMAL_STEP = 2.0**-10
"""e4m3 subnormals are spaced 2^-9 apart: rounding moves them by at most 2^-10."""


@pytest.fixture(scope="module")
def cos_sin() -> torch.Tensor:
    return ref.cos_sin_table(MAX_POS, ROPE_DIM, BASE)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _planes(cos_sin: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows = cos_sin[positions]
    return rows[:, :HALF], rows[:, HALF:]


def _complex_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved RoPE as complex multiplication: lanes (2i, 2i+1) are one complex number."""
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(pairs * torch.complex(cos, sin)).flatten(-2)


def _rotate_half_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX RoPE as ``x * cos + rotate_half(x) * sin`` with ``rotate_half = [-x2 | x1]``."""
    half = cos.shape[-1]
    rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * torch.cat([cos, cos], -1) + rotated_half * torch.cat([sin, sin], -1)


# --- norms -------------------------------------------------------------------------------


def test_rms_norm_by_hand():
    # mean of squares of [3, 4] is 12.5; eps 0 keeps the hand computation exact.
    out = ref.rms_norm(torch.tensor([[3.0, 4.0]]), torch.tensor([1.0, 2.0]), eps=0.0)
    expected = torch.tensor([[3.0 / math.sqrt(12.5), 2.0 * 4.0 / math.sqrt(12.5)]])
    torch.testing.assert_close(out, expected)


def test_rms_norm_matches_torch_functional():
    x = torch.randn(17, 256, generator=_gen(0)).to(torch.bfloat16)
    w = (1.0 + 0.1 * torch.randn(256, generator=_gen(1))).to(torch.bfloat16)
    out = ref.rms_norm(x, w, 1e-6)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, F.rms_norm(x.float(), (256,), w.float(), eps=1e-6))


def test_layer_norm_by_hand():
    # [1, 2, 3, 4]: mean 2.5, biased variance 1.25.
    out = ref.layer_norm(
        torch.tensor([[1.0, 2.0, 3.0, 4.0]]), torch.full((4,), 2.0), torch.full((4,), 0.5), 0.0
    )
    centered = torch.tensor([[-1.5, -0.5, 0.5, 1.5]])
    torch.testing.assert_close(out, centered / math.sqrt(1.25) * 2.0 + 0.5)


def test_layer_norm_matches_torch_functional():
    x = (3.0 + torch.randn(17, 128, generator=_gen(2))).to(torch.float16)
    w, b = torch.randn(128, generator=_gen(3)), torch.randn(128, generator=_gen(4))
    out = ref.layer_norm(x, w, b, 1e-6)
    torch.testing.assert_close(out, F.layer_norm(x.float(), (128,), w, b, eps=1e-6))


# --- RoPE --------------------------------------------------------------------------------


def test_cos_sin_table_layout(cos_sin):
    assert cos_sin.shape == (MAX_POS, ROPE_DIM) and cos_sin.dtype == torch.float32
    assert torch.equal(cos_sin[0], torch.cat([torch.ones(HALF), torch.zeros(HALF)]))
    for position in (1, 7):
        for plane in (0, 5, HALF - 1):
            angle = position * BASE ** (-plane / HALF)
            assert cos_sin[position, plane].item() == pytest.approx(math.cos(angle), abs=1e-6)
            assert cos_sin[position, HALF + plane].item() == pytest.approx(
                math.sin(angle), abs=1e-6
            )


def test_rope_interleaved_is_complex_multiplication(cos_sin):
    positions = torch.tensor([3, 10, 100, 1000, 4095])
    x = torch.randn(5, ROPE_DIM, generator=_gen(5))
    cos, sin = _planes(cos_sin, positions)
    torch.testing.assert_close(ref.rope_interleaved(x, cos, sin), _complex_rope(x, cos, sin))


def test_rope_neox_is_rotate_half(cos_sin):
    positions = torch.tensor([3, 10, 100, 1000, 4095])
    x = torch.randn(5, ROPE_DIM, generator=_gen(6))
    cos, sin = _planes(cos_sin, positions)
    torch.testing.assert_close(ref.rope_neox(x, cos, sin), _rotate_half_rope(x, cos, sin))


@pytest.mark.parametrize("rope", [ref.rope_interleaved, ref.rope_neox])
def test_rope_at_position_zero_is_identity(rope, cos_sin):
    x = torch.randn(3, ROPE_DIM, generator=_gen(7))
    cos, sin = _planes(cos_sin, torch.zeros(3, dtype=torch.long))
    assert torch.equal(rope(x, cos, sin), x)


def test_rope_conventions_pair_different_lanes(cos_sin):
    # One nonzero lane (lane 1) moves to lane 0 under interleaving, to lane 1 + HALF under NeoX.
    x = torch.zeros(1, ROPE_DIM)
    x[0, 1] = 1.0
    cos, sin = _planes(cos_sin, torch.tensor([1]))
    interleaved, neox = ref.rope_interleaved(x, cos, sin), ref.rope_neox(x, cos, sin)
    assert interleaved[0, 0].item() == pytest.approx(-math.sin(1.0))
    assert neox[0, 0].item() == 0.0
    assert neox[0, 1 + HALF].item() == pytest.approx(math.sin(BASE ** (-1 / HALF)))


def test_rope_rejects_mismatched_widths(cos_sin):
    cos, sin = _planes(cos_sin, torch.tensor([1]))
    with pytest.raises(ValueError, match="lanes"):
        ref.rope_interleaved(torch.zeros(1, ROPE_DIM + 2), cos, sin)


# --- fp8 and scales ----------------------------------------------------------------------


def _e4m3_by_formula(byte: int) -> float:
    """The value of an e4m3fn byte from its bit fields: 1 sign, 4 exponent (bias 7),
    3 mantissa bits; exponent 0 is subnormal; S.1111.111 is NaN (there is no infinity)."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return math.nan
    if exponent == 0:
        return sign * mantissa / 8 * 2.0**-6
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def test_fp8_values_follow_the_e4m3_bit_formula():
    all_bytes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    values = ref.fp8_e4m3_values(all_bytes)
    expected = torch.tensor([_e4m3_by_formula(b) for b in range(256)])
    torch.testing.assert_close(values, expected, rtol=0, atol=0, equal_nan=True)


def test_fp8_bytes_round_trip_every_finite_value():
    all_bytes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    finite = all_bytes[(all_bytes & 0x7F) != 0x7F]
    assert torch.equal(ref.fp8_e4m3_bytes(ref.fp8_e4m3_values(finite)), finite)


def test_fp8_bytes_known_encodings_and_saturation():
    x = torch.tensor([1.0, 448.0, -448.0, 0.0, 449.0, 1e9, -math.inf, 2.0**-9])
    assert ref.fp8_e4m3_bytes(x).tolist() == [0x38, 0x7E, 0xFE, 0x00, 0x7E, 0x7E, 0xFE, 0x01]
    assert ref.fp8_e4m3_bytes(torch.tensor([math.nan])).item() & 0x7F == 0x7F


def test_ue8m0_scale_is_the_smallest_power_of_two_covering_amax():
    amax = torch.rand(4096, generator=_gen(8)) * torch.logspace(-3, 4, 4096)
    # values just above and exactly at powers of two times 448, where a float log2 slips
    at_power = 448.0 * torch.tensor([2.0**k for k in range(-12, 8)])
    amax = torch.cat([amax, at_power, torch.nextafter(at_power, torch.tensor(math.inf))])
    scale = ref.ue8m0_scale(amax)
    mantissa, _ = torch.frexp(scale)
    assert torch.all(mantissa == 0.5), "not a power of two"
    ratio = amax.clamp_min(1e-4) / 448.0
    assert torch.all(scale >= ratio)
    assert torch.all(scale / 2 < ratio)


def test_ue8m0_scale_floors_zero_rows():
    scale = ref.ue8m0_scale(torch.zeros(2))
    assert torch.equal(scale, torch.full((2,), 2.0 ** math.ceil(math.log2(1e-4 / 448))))


def test_ds_mla_tile_scale_multiplies_by_fp32_reciprocal():
    amax = torch.tensor([448.0, 1.0, 3.0, 0.0])
    inv_448 = struct.unpack("<f", struct.pack("<f", 1 / 448))[0]  # 1/448 rounded to fp32
    expected = [448.0 * inv_448, inv_448, 3.0 * inv_448, FLT_MIN]
    assert ref.ds_mla_tile_scale(amax).tolist() == [
        struct.unpack("<f", struct.pack("<f", v))[0] for v in expected
    ]


# --- MLA entries -------------------------------------------------------------------------


def _kv_kpe(num_tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    kv = torch.randn(num_tokens, 512, generator=_gen(seed)) * torch.logspace(-2, 1, 512)
    kpe = torch.randn(num_tokens, ROPE_DIM, generator=_gen(seed + 1))
    return kv, kpe


def _assert_within_fp8_rounding(decoded, exact, scale):
    bound = FP8_HALF_STEP_REL * exact.abs() + FP8_HALF_SUBNORMAL_STEP * scale
    assert torch.all((decoded - exact).abs() <= bound)


@pytest.mark.parametrize("act_dtype", [torch.bfloat16, torch.float16])
def test_auto_entries_are_the_rounded_values(act_dtype):
    kv, kpe = _kv_kpe(5, 10)
    entries = ref.encode_mla_entries(kv, kpe, "auto", act_dtype, None)
    assert entries.shape == (5, (512 + ROPE_DIM) * act_dtype.itemsize)
    kv_back, kpe_back = ref.decode_mla_entries(entries, "auto", 512, ROPE_DIM, act_dtype, None)
    assert torch.equal(kv_back, kv.to(act_dtype).float())
    assert torch.equal(kpe_back, kpe.to(act_dtype).float())


def test_fp8_entries_round_trip_within_half_a_step():
    kv, kpe = _kv_kpe(5, 12)
    entries = ref.encode_mla_entries(kv, kpe, "fp8", torch.bfloat16, 0.05)
    assert entries.shape == (5, 512 + ROPE_DIM)
    kv_back, kpe_back = ref.decode_mla_entries(entries, "fp8", 512, ROPE_DIM, torch.bfloat16, 0.05)
    _assert_within_fp8_rounding(kv_back, kv, 0.05)
    _assert_within_fp8_rounding(kpe_back, kpe, 0.05)


def test_fp8_entries_saturate_beyond_the_scaled_range():
    kv = torch.full((1, 4), 1000.0)
    entries = ref.encode_mla_entries(kv, -kv[:, :2], "fp8", torch.bfloat16, 1.0)
    assert entries.tolist() == [[0x7E] * 4 + [0xFE] * 2]


def test_ds_mla_entry_layout_by_hand():
    kv, kpe = _kv_kpe(2, 14)
    kv[1, 128:256] = 0.0  # an all-zero tile
    entries = ref.encode_mla_entries(kv, kpe, "fp8_ds_mla", torch.bfloat16, None)
    assert entries.shape == (2, 656) and ref.DS_MLA_ENTRY_BYTES == 656
    for token in range(2):
        row = bytes(entries[token].tolist())
        scales = struct.unpack("<4f", row[512:528])
        for tile in range(4):
            amax = kv[token, 128 * tile : 128 * (tile + 1)].abs().max().item()
            assert scales[tile] == pytest.approx(max(amax / 448, FLT_MIN), rel=1e-7)
        rope = torch.tensor(list(row[528:656]), dtype=torch.uint8).view(torch.bfloat16)
        assert torch.equal(rope, kpe[token].to(torch.bfloat16))
    assert struct.unpack("<f", bytes(entries[1, 516:520].tolist()))[0] == FLT_MIN
    assert torch.all(entries[1, 128:256] == 0)
    # each tile's largest magnitude lands on (or next to) +-448
    largest = ref.fp8_e4m3_values(entries[0, :512]).view(4, 128).abs().amax(-1)
    assert torch.all(largest >= 416.0)  # 416 is the fp8 step below 448


def test_ds_mla_entries_round_trip_within_half_a_step():
    kv, kpe = _kv_kpe(3, 16)
    entries = ref.encode_mla_entries(kv, kpe, "fp8_ds_mla", torch.bfloat16, None)
    kv_back, kpe_back = ref.decode_mla_entries(
        entries, "fp8_ds_mla", 512, ROPE_DIM, torch.bfloat16, None
    )
    tile_scale = (kv.view(3, 4, 128).abs().amax(-1) / 448).repeat_interleave(128, dim=-1)
    _assert_within_fp8_rounding(kv_back, kv, tile_scale)
    assert torch.equal(kpe_back, kpe.to(torch.bfloat16).float())


@pytest.mark.parametrize(
    ("layout", "scale", "match"),
    [("fp8", None, "needs"), ("auto", 1.0, "takes no"), ("bf16", None, "unknown")],
)
def test_encode_rejects_bad_layout_or_scale(layout, scale, match):
    kv, kpe = _kv_kpe(1, 18)
    with pytest.raises(ValueError, match=match):
        ref.encode_mla_entries(kv, kpe, layout, torch.bfloat16, scale)


def test_ds_mla_needs_512_plus_64():
    with pytest.raises(ValueError, match="fp8_ds_mla"):
        ref.encode_mla_entries(
            torch.ones(1, 256), torch.ones(1, 64), "fp8_ds_mla", torch.bfloat16, None
        )


# --- indexer entries ---------------------------------------------------------------------


def test_index_entries_round_trip_with_power_of_two_scales():
    index_k = (
        torch.randn(6, 128, generator=_gen(20))
        * torch.tensor([1e-3, 0.1, 1, 10, 100, 3e3])[:, None]
    )
    values, scales = ref.encode_index_entries(index_k)
    assert values.shape == (6, 128) and values.dtype == torch.uint8 and scales.shape == (6,)
    assert torch.all(torch.frexp(scales)[0] == 0.5)
    assert torch.all(scales >= index_k.abs().amax(-1) / 448)
    _assert_within_fp8_rounding(ref.decode_index_entries(values, scales), index_k, scales[:, None])


def test_all_zero_index_rows_have_finite_scales_and_zero_values():
    values, scales = ref.encode_index_entries(torch.zeros(2, 128))
    assert torch.all(torch.isfinite(scales)) and torch.all(scales > 0)
    assert torch.all(values == 0)


# --- paged caches ------------------------------------------------------------------------


def _random_bytes(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=_gen(seed), dtype=torch.int32).to(torch.uint8)


def test_write_mla_cache_changes_only_owned_slots():
    cache = _random_bytes((3, 4, 10), 30)
    before = cache.clone()
    entries = _random_bytes((4, 10), 31)
    slots = torch.tensor([5, -1, 11, 0])
    written = ref.write_mla_cache(cache, slots, entries)
    assert torch.equal(cache, before), "the input cache was modified"
    assert torch.equal(written[1, 1], entries[0])  # slot 5 = block 1, offset 1
    assert torch.equal(written[2, 3], entries[2])  # slot 11
    assert torch.equal(written[0, 0], entries[3])
    untouched = torch.ones(3, 4, dtype=torch.bool)
    untouched[1, 1] = untouched[2, 3] = untouched[0, 0] = False
    assert torch.equal(written[untouched], before[untouched])
    assert torch.equal(ref.read_mla_cache(written, torch.tensor([11, 5])), entries[[2, 0]])


def test_write_mla_cache_with_no_owned_slot_is_a_copy():
    cache = _random_bytes((2, 4, 6), 32)
    written = ref.write_mla_cache(cache, torch.full((3,), -1), _random_bytes((3, 6), 33))
    assert torch.equal(written, cache) and written.data_ptr() != cache.data_ptr()


def test_mla_cache_rejects_bad_slots():
    cache = _random_bytes((2, 4, 6), 34)
    with pytest.raises(ValueError, match="negative"):
        ref.read_mla_cache(cache, torch.tensor([1, -1]))
    with pytest.raises(ValueError, match="beyond"):
        ref.write_mla_cache(cache, torch.tensor([8]), _random_bytes((1, 6), 35))
    with pytest.raises(ValueError, match="same slot"):
        ref.write_mla_cache(cache, torch.tensor([3, 3]), _random_bytes((2, 6), 36))


def test_index_cache_packs_values_then_scales_per_block():
    block_size, index_dim = 4, 8
    cache = _random_bytes((3, block_size, index_dim + 4), 40)
    before = bytes(cache.flatten().tolist())
    values = _random_bytes((2, index_dim), 41)
    scales = torch.tensor([0.25, 2.0**-9])
    written = ref.write_index_cache(cache, torch.tensor([6, -1]), values, scales)

    # slot 6 = block 1, offset 2; a block is 4 * 12 = 48 bytes: 32 value bytes, 16 scale bytes
    flat = bytes(written.flatten().tolist())
    block = 48
    value_start, scale_start = block + 2 * index_dim, block + block_size * index_dim + 2 * 4
    assert list(flat[value_start : value_start + index_dim]) == values[0].tolist()
    assert struct.unpack("<f", flat[scale_start : scale_start + 4])[0] == 0.25
    changed = {i for i in range(len(flat)) if flat[i] != before[i]}
    written_bytes = set(range(value_start, value_start + index_dim)) | set(
        range(scale_start, scale_start + 4)
    )
    assert changed <= written_bytes

    read_values, read_scales = ref.read_index_cache(written, torch.tensor([6]), index_dim)
    assert torch.equal(read_values, values[:1]) and read_scales.tolist() == [0.25]


# --- the fused op ------------------------------------------------------------------------


def _fused_inputs(num_tokens: int, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    g = _gen(seed)
    return {
        "q_c": torch.randn(num_tokens, 256, generator=g).to(dtype),
        "q_weight": (1 + 0.1 * torch.randn(256, generator=g)).to(dtype),
        "kv_c": torch.randn(num_tokens, 512, generator=g).to(dtype),
        "kv_weight": (1 + 0.1 * torch.randn(512, generator=g)).to(dtype),
        "k_pe": torch.randn(num_tokens, ROPE_DIM, generator=g).to(dtype),
        "positions": torch.randint(1, MAX_POS, (num_tokens,), generator=g),
        "index_k": torch.randn(num_tokens, 128, generator=g).to(dtype),
        "index_weight": 1 + 0.1 * torch.randn(128, generator=g),
        "index_bias": 0.1 * torch.randn(128, generator=g),
    }


@pytest.mark.parametrize("interleaved", [False, True])
def test_fused_outputs_match_independent_formulations(interleaved, cos_sin):
    x = _fused_inputs(7, torch.bfloat16, 50)
    out = ref.fused_norm_rope(
        x["q_c"], x["q_weight"], x["kv_c"], x["kv_weight"], x["k_pe"], x["positions"],
        cos_sin, 1e-6, cache_layout="auto", index_k=x["index_k"],
        index_weight=x["index_weight"], index_bias=x["index_bias"],
        index_rope_interleaved=interleaved,
    )  # fmt: skip
    q = F.rms_norm(x["q_c"].float(), (256,), x["q_weight"].float(), eps=1e-6)
    kv = F.rms_norm(x["kv_c"].float(), (512,), x["kv_weight"].float(), eps=1e-6)
    cos, sin = _planes(cos_sin, x["positions"])
    kpe = _complex_rope(x["k_pe"].float(), cos, sin)
    normed = F.layer_norm(x["index_k"].float(), (128,), x["index_weight"], x["index_bias"], 1e-6)
    rope = _complex_rope if interleaved else _rotate_half_rope
    index_k = torch.cat([rope(normed[:, :ROPE_DIM], cos, sin), normed[:, ROPE_DIM:]], -1)

    torch.testing.assert_close(out.kv_fp32, kv)
    torch.testing.assert_close(out.kpe_fp32, kpe)
    torch.testing.assert_close(out.index_k_fp32, index_k)
    # outputs are the fp32 results rounded once; where the independent fp32 result sits a few
    # fp32 ulps away across a bf16 rounding tie, the two roundings differ by one bf16 step
    pairs = ((out.q_out, q), (out.kv_out, kv), (out.kpe_out, kpe), (out.index_k_out, index_k))
    for got, exact in pairs:
        assert got.dtype == torch.bfloat16
        assert int(ulp_distance(got, exact.to(torch.bfloat16)).max()) <= OUTPUT.max_steps
    # the auto entry is [kv_out | kpe_out] as bytes
    assert torch.equal(out.mla_entries, torch.cat([out.kv_out, out.kpe_out], -1).view(torch.uint8))


def test_fused_cache_encodings_start_from_fp32(cos_sin):
    x = _fused_inputs(17, torch.bfloat16, 51)
    out = ref.fused_norm_rope(
        x["q_c"], x["q_weight"], x["kv_c"], x["kv_weight"], x["k_pe"], x["positions"],
        cos_sin, 1e-6, cache_layout="fp8", mla_scale=0.02,
    )  # fmt: skip
    from_fp32 = (out.kv_fp32 / 0.02).to(torch.float8_e4m3fn).view(torch.uint8)
    from_bf16 = (out.kv_out.float() / 0.02).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(out.mla_entries[:, :512], from_fp32)
    assert not torch.equal(from_fp32, from_bf16), "inputs too tame to tell the two apart"
    assert out.index_k_out is None and out.index_values is None and out.index_scales is None


def test_fused_requires_indexer_norm_parameters(cos_sin):
    x = _fused_inputs(1, torch.bfloat16, 52)
    with pytest.raises(ValueError, match="index_weight"):
        ref.fused_norm_rope(
            x["q_c"], x["q_weight"], x["kv_c"], x["kv_weight"], x["k_pe"], x["positions"],
            cos_sin, 1e-6, cache_layout="auto", index_k=x["index_k"],
        )  # fmt: skip


# --- expected caches ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def indexer_reference(cos_sin) -> ref.FusedReference:
    x = _fused_inputs(3, torch.bfloat16, 60)
    return ref.fused_norm_rope(
        x["q_c"], x["q_weight"], x["kv_c"], x["kv_weight"], x["k_pe"], x["positions"],
        cos_sin, 1e-6, cache_layout="fp8_ds_mla", index_k=x["index_k"],
        index_weight=x["index_weight"], index_bias=x["index_bias"],
    )  # fmt: skip


def test_expected_caches_of_a_profiling_call_are_unchanged(indexer_reference):
    mla, index = _random_bytes((2, 4, 656), 61), _random_bytes((2, 4, 132), 62)
    new_mla, new_index = ref.expected_caches(mla, index, None, None, indexer_reference)
    assert torch.equal(new_mla, mla) and torch.equal(new_index, index)
    assert new_mla.data_ptr() != mla.data_ptr()


def test_expected_caches_follow_each_mapping(indexer_reference):
    mla, index = _random_bytes((2, 4, 656), 63), _random_bytes((2, 4, 132), 64)
    slots, index_slots = torch.tensor([-1, 6, -1]), torch.tensor([0, 6, 3])
    new_mla, new_index = ref.expected_caches(mla, index, slots, index_slots, indexer_reference)
    assert torch.equal(new_mla[1, 2], indexer_reference.mla_entries[1])
    mla_rows_changed = (new_mla != mla).any(-1).nonzero().tolist()
    assert mla_rows_changed == [[1, 2]]
    # indexer: value bytes of slot 3 sit at block 0, bytes 3*128 .. 4*128
    assert torch.equal(new_index.view(2, -1)[0, 384:512], indexer_reference.index_values[2])
    scales = new_index.view(2, -1)[:, 512:].contiguous().view(torch.float32)
    assert scales[0, 0] == indexer_reference.index_scales[0]
    assert scales[1, 2] == indexer_reference.index_scales[1]


def test_expected_caches_with_no_local_slot_are_unchanged(indexer_reference):
    # DCPn decode: a rank owning none of the tokens must leave both caches alone
    mla, index = _random_bytes((2, 4, 656), 65), _random_bytes((2, 4, 132), 66)
    none_owned = torch.full((3,), -1)
    new_mla, new_index = ref.expected_caches(mla, index, none_owned, none_owned, indexer_reference)
    assert torch.equal(new_mla, mla) and torch.equal(new_index, index)


def test_expected_caches_without_indexer_leave_index_cache(cos_sin):
    x = _fused_inputs(2, torch.float16, 67)
    no_indexer = ref.fused_norm_rope(
        x["q_c"], x["q_weight"], x["kv_c"], x["kv_weight"], x["k_pe"], x["positions"],
        cos_sin, 1e-6, cache_layout="auto",
    )  # fmt: skip
    mla, index = _random_bytes((2, 4, 1152), 68), _random_bytes((2, 4, 132), 69)
    slots = torch.tensor([1, 2])
    new_mla, new_index = ref.expected_caches(mla, index, slots, slots, no_indexer)
    assert torch.equal(new_index, index)
    assert torch.equal(new_mla[0, 1:3], no_indexer.mla_entries)
    assert ref.expected_caches(mla, None, slots, slots, no_indexer)[1] is None


def test_layout_constants_agree_with_the_contract():
    """reference/ restates a few layout facts because it may not import dcpcheck."""
    assert ref.DS_MLA_ENTRY_BYTES == contract.DS_MLA_ENTRY_BYTES == 656
    assert ref.FP8_E4M3_MAX == contract.FP8_E4M3_MAX
    assert ref.NVFP4_DS_MLA_ENTRY_BYTES == contract.NVFP4_DS_MLA_ENTRY_BYTES == 352
    assert ref.E2M1_MAX == contract.E2M1_MAX
    assert ref.cache_layouts.NVFP4_DS_MLA_ROPE_OFFSET == contract.NVFP4_DS_MLA_ROPE_OFFSET
    assert ref.cache_layouts.NVFP4_DS_MLA_SCALES_OFFSET == contract.NVFP4_DS_MLA_SCALES_OFFSET
    positions = [contract.nvfp4_scale_position(s) for s in range(contract.NVFP4_DS_MLA_NUM_TILES)]
    assert list(ref.cache_layouts.NVFP4_DS_MLA_SCALE_POSITIONS) == positions
    assert ref.quant.NVFP4_SCALE_FLOOR == contract.NVFP4_SCALE_FLOOR
    assert {
        ref.LAYOUT_AUTO,
        ref.LAYOUT_FP8,
        ref.LAYOUT_FP8_DS_MLA,
        ref.LAYOUT_NVFP4_DS_MLA,
    } == {layout.value for layout in contract.CacheLayout}
