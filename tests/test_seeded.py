"""dcpcheck.cases.seeded: Gaussian values with the same bits on every device."""

from __future__ import annotations

import pytest
import torch

from dcpcheck.cases import seeded

CPU = torch.device("cpu")


def lowbias32(x: int) -> int:
    """The hash on Python's unbounded ints, masked to 32 bits by hand (the definition)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_int32_hash_matches_the_unsigned_definition():
    words = [0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xDEADBEEF, 0xFFFFFFFF, 123456789]
    signed = torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)
    got = [v & 0xFFFFFFFF for v in seeded._hash32(signed).tolist()]
    assert got == [lowbias32(w) for w in words]


def test_values_are_standard_normal():
    x = seeded.normal(7, 1, (400, 500), CPU)
    assert x.dtype == torch.float32 and x.shape == (400, 500)
    assert abs(float(x.mean())) < 0.01
    assert abs(float(x.std()) - 1.0) < 0.01
    assert 3.9 < float(x.abs().max()) < 4.4  # the table's outermost quantile is ~4.17
    assert torch.unique(x).numel() > 60_000  # most of the 65,536 quantiles show up


def test_same_seed_and_stream_repeat_other_ones_differ():
    base = seeded.normal(3, 1, (64, 32), CPU)
    assert torch.equal(base, seeded.normal(3, 1, (64, 32), CPU))
    for seed, stream in ((3, 2), (4, 1), (3 + (1 << 32), 1)):
        other = seeded.normal(seed, stream, (64, 32), CPU)
        assert (other != base).float().mean() > 0.99


def test_rows_of_a_batch_are_distinct():
    rows = seeded.normal(0, 1, (4096, 64), CPU)
    assert torch.unique(rows, dim=0).shape[0] == 4096


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_same_bits_on_the_gpu_as_on_the_cpu():
    shape = (1000, 576)
    on_gpu = seeded.normal(11, 5, shape, torch.device("cuda")).cpu()
    assert torch.equal(on_gpu.view(torch.int32), seeded.normal(11, 5, shape, CPU).view(torch.int32))


@pytest.mark.parametrize("key", [0, 1, -1, 0x7FFFFFFF - 1500, -(1 << 31), 0x1234567, -0x55AA55AA])
def test_the_kernel_draws_the_torch_draws_bits(key, device):
    """``seeded_kernel`` against ``draw_by_torch``, through the interpreter on the CPU:
    keys at both ends of int32, so the counter wraps inside the draw."""
    from dcpcheck.cases.seeded_kernel import normal_values

    count = 3000
    got = normal_values(key, count, seeded._quantiles(device), seeded.HASH_MULTIPLIERS)
    want = seeded.draw_by_torch(key, count, device)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_kernel_and_torch_agree_on_every_32_bit_word():
    """Every word ``i + key`` the hash can see, in sixteen draws of 2^28 values."""
    from dcpcheck.cases.seeded_kernel import normal_values

    cuda = torch.device("cuda")
    table = seeded._quantiles(cuda)
    count = 1 << 28
    for part in range(16):
        key = seeded._as_int32(part << 28)
        got = normal_values(key, count, table, seeded.HASH_MULTIPLIERS).view(torch.int32)
        want = seeded.draw_by_torch(key, count, cuda).view(torch.int32)
        assert torch.equal(got, want), f"words {part << 28:#x} to {(part + 1 << 28) - 1:#x}"
