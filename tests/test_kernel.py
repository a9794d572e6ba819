"""The project's Triton kernel against the oracle (``reference/``), field by field.

What is compared with what: every output of ``dcpcheck.ops.fused_norm_rope.kernel`` with
``reference.fused_norm_rope`` and every cache byte with ``reference.expected_caches``,
within the per-field tolerances of ``dcpcheck.ops.fused_norm_rope.tolerances`` (one step of
the stored format for bf16/fp16 outputs and fp8 values, two fp32 ulps for ds_mla tile
scales, UE8M0 scales exactly), and cache bytes outside the owned entries bitwise. Why those
tolerances: the op rounds an fp32 pipeline once, and on the CPU Triton's interpreter
truncates fp32 to bf16 where the oracle rounds to nearest even
(``tests/vectors/README.md``).

The DCP cases are the point: outputs are poisoned with NaN and caches filled with seeded
random bytes (with guard blocks on each side) before every launch, so an unwritten row
or a stray write cannot pass by luck; slot mappings mix owned slots with -1, and
positions stay away from 0 (RoPE at position 0 is the identity).

On the CPU every launch goes through Triton's interpreter, so token counts stay small
(1, 5, 17); real model shapes and large token counts run on a GPU only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch
import triton
import triton.language as tl

import reference
from dcpcheck.kernels.loading import KernelLoadError
from dcpcheck.ops.fused_norm_rope.cache_entries import index_entry_parts, mla_entry_parts
from dcpcheck.ops.fused_norm_rope.case import TOPK_SENTINEL, oracle_for
from dcpcheck.ops.fused_norm_rope.comparison import part_violations, row_violations
from dcpcheck.ops.fused_norm_rope.contract import (
    DS_MLA_ENTRY_BYTES,
    DS_MLA_NOPE_DIM,
    DS_MLA_ROPE_OFFSET,
    DS_MLA_SCALES_OFFSET,
    NVFP4_DS_MLA_ENTRY_BYTES,
    NVFP4_DS_MLA_SCALES_OFFSET,
    PRESETS,
    CacheLayout,
    FusedOpCaches,
    FusedOpInputs,
    FusedOpOutputs,
    ModelPreset,
    index_entry_bytes,
    mla_entry_bytes,
)
from dcpcheck.ops.fused_norm_rope.entry_checks import mla_part_slack
from dcpcheck.ops.fused_norm_rope.fp8_codes import (
    e2m1_codes,
    fp8_e4m3_codes,
    fp8_e4m3_values,
    ue8m0_scale,
)
from dcpcheck.ops.fused_norm_rope.guarded_cache import GUARD_BLOCKS
from dcpcheck.ops.fused_norm_rope.kernels import KERNELS, load_kernel
from dcpcheck.ops.fused_norm_rope.launcher import fused_norm_rope
from dcpcheck.ops.fused_norm_rope.tolerances import OUTPUT_TOLERANCES, UE8M0_SCALE, ulp_distance
from dcpcheck.ops.fused_norm_rope.variants import REGRESSIONS, VARIANTS
from tests.conftest import requires_cuda

SMALL = PRESETS["small-neox"]
FP8_SATURATING_SCALE = 0.004
"""Per-tensor fp8 scale small enough that the larger normalized values (|kv| > 1.8)
exceed 448 after division: the kernel must clamp them, as production does."""

DS_MLA_SCALES = slice(DS_MLA_SCALES_OFFSET, DS_MLA_ROPE_OFFSET)
DS_MLA_ROPE = slice(DS_MLA_ROPE_OFFSET, None)


# ----------------------------------------------------------------------------------------
# Building one launch
# ----------------------------------------------------------------------------------------


@dataclass
class Launch:
    """Inputs, poisoned outputs and random caches of one launch, plus the pristine copies
    the checks compare against. ``*_storage`` include the guard blocks."""

    inputs: FusedOpInputs
    outputs: FusedOpOutputs
    caches: FusedOpCaches
    mla_storage: torch.Tensor
    index_storage: torch.Tensor | None
    mla_before: torch.Tensor
    index_before: torch.Tensor | None


def _random_slots(
    num_tokens: int, entries: int, owned_fraction: float, gen: torch.Generator
) -> torch.Tensor:
    """Distinct slots in ``[0, entries)``, about ``owned_fraction`` of them kept and the
    rest set to -1 (owned by another rank); at least one of each when there are 2+ tokens."""
    slots = torch.randperm(entries, generator=gen)[:num_tokens]
    owned = torch.rand(num_tokens, generator=gen) < owned_fraction
    if num_tokens >= 2 and 0.0 < owned_fraction < 1.0:
        owned[0], owned[-1] = True, False
    return torch.where(owned, slots, torch.full_like(slots, -1))


def _paged_storage(
    num_blocks: int, block_size: int, entry_bytes: int, gen: torch.Generator
) -> torch.Tensor:
    shape = (num_blocks + 2 * GUARD_BLOCKS, block_size, entry_bytes)
    return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)


def build_launch(
    device: torch.device,
    *,
    num_tokens: int = 17,
    preset: ModelPreset = SMALL,
    act_dtype: torch.dtype = torch.bfloat16,
    layout: CacheLayout = CacheLayout.AUTO,
    indexer: bool = True,
    index_rope_interleaved: bool | None = None,
    owned_fraction: float = 0.5,
    index_owned_fraction: float = 0.5,
    profiling: bool = False,
    fused_projection: bool = False,
    block_size: int = 4,
    seed: int = 0,
) -> Launch:
    """One seeded launch of the op. ``owned_fraction`` 1.0 owns every slot, 0.0 none;
    the indexer draws its own slots (``index_owned_fraction``). ``fused_projection`` makes
    ``q_c``, ``kv_c`` and ``k_pe`` slices of one wider row, as a fused projection's output
    is (row stride wider than the row)."""
    gen = torch.Generator().manual_seed(seed)
    q_dim, kv_dim, rope_dim, index_dim = (
        preset.q_lora_rank,
        preset.kv_lora_rank,
        preset.rope_dim,
        preset.index_head_dim,
    )

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    if fused_projection:
        projection = randn(num_tokens, q_dim + kv_dim + rope_dim + 8).to(act_dtype)
        q_c = projection[:, :q_dim]
        kv_c = projection[:, q_dim : q_dim + kv_dim]
        k_pe = projection[:, q_dim + kv_dim : q_dim + kv_dim + rope_dim]
    else:
        q_c = randn(num_tokens, q_dim).to(act_dtype)
        kv_c = randn(num_tokens, kv_dim, scale=2.0).to(act_dtype)
        k_pe = randn(num_tokens, rope_dim).to(act_dtype)
    entries_needed = max(num_tokens, 1)
    num_blocks = 2 * triton.cdiv(entries_needed, block_size) + 1
    entries = num_blocks * block_size
    mla_bytes = mla_entry_bytes(layout, kv_dim, rope_dim, act_dtype)
    mla_storage = _paged_storage(num_blocks, block_size, mla_bytes, gen)
    index_storage = None
    if indexer:
        index_storage = _paged_storage(num_blocks, block_size, index_entry_bytes(index_dim), gen)
    slot_mapping = _random_slots(num_tokens, entries, owned_fraction, gen)
    index_slot_mapping = _random_slots(num_tokens, entries, index_owned_fraction, gen)

    interleaved = (
        preset.index_rope_interleaved if index_rope_interleaved is None else index_rope_interleaved
    )
    inputs = FusedOpInputs(
        q_c=q_c,
        q_weight=(1.0 + randn(q_dim, scale=0.1)).to(act_dtype),
        kv_c=kv_c,
        kv_weight=(1.0 + randn(kv_dim, scale=0.1)).to(act_dtype),
        k_pe=k_pe,
        positions=torch.randint(1, preset.max_position, (num_tokens,), generator=gen),
        cos_sin=reference.cos_sin_table(preset.max_position, rope_dim, preset.rope_base),
        eps=preset.eps,
        block_size=block_size,
        cache_layout=layout,
        mla_scale=FP8_SATURATING_SCALE if layout is CacheLayout.FP8 else None,
        slot_mapping=None if profiling else slot_mapping,
        index_k=randn(num_tokens, index_dim, scale=3.0).to(act_dtype) if indexer else None,
        index_weight=1.0 + randn(index_dim, scale=0.1) if indexer else None,
        index_bias=randn(index_dim, scale=0.1) if indexer else None,
        index_rope_interleaved=interleaved,
        index_slot_mapping=None if profiling or not indexer else index_slot_mapping,
    )
    inputs = _to_device(inputs, device)
    nan = float("nan")
    outputs = FusedOpOutputs(
        q_out=torch.full((num_tokens, q_dim), nan, dtype=act_dtype, device=device),
        kv_out=torch.full((num_tokens, kv_dim), nan, dtype=act_dtype, device=device),
        kpe_out=torch.full((num_tokens, rope_dim), nan, dtype=act_dtype, device=device),
        topk_indices=torch.full(
            (num_tokens, preset.topk), TOPK_SENTINEL, dtype=torch.int32, device=device
        ),
        index_k_out=(
            torch.full((num_tokens, index_dim), nan, dtype=act_dtype, device=device)
            if indexer
            else None
        ),
    )
    mla_storage = mla_storage.to(device)
    index_storage = None if index_storage is None else index_storage.to(device)
    inner = slice(GUARD_BLOCKS, -GUARD_BLOCKS)
    caches = FusedOpCaches(
        mla=mla_storage[inner], index=None if index_storage is None else index_storage[inner]
    )
    return Launch(
        inputs=inputs,
        outputs=outputs,
        caches=caches,
        mla_storage=mla_storage,
        index_storage=index_storage,
        mla_before=mla_storage.clone(),
        index_before=None if index_storage is None else index_storage.clone(),
    )


def _to_device(inputs: FusedOpInputs, device: torch.device) -> FusedOpInputs:
    """Move every tensor field, keeping views of one projection views of one buffer."""
    moved: dict[int, torch.Tensor] = {}

    def move(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        base = t._base if t._base is not None else t
        if id(base) not in moved:
            moved[id(base)] = base.to(device)
        return moved[id(base)].as_strided(t.shape, t.stride(), t.storage_offset())

    tensors = {
        name: move(getattr(inputs, name))
        for name in (
            "q_c", "q_weight", "kv_c", "kv_weight", "k_pe", "positions", "cos_sin",
            "slot_mapping", "index_k", "index_weight", "index_bias", "index_slot_mapping",
        )
    }  # fmt: skip
    return replace(inputs, **tensors)


oracle = oracle_for
"""The oracle on a launch's inputs."""


# ----------------------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------------------


def assert_rows_close(
    field: str, actual: torch.Tensor, expected: torch.Tensor, unwritten: torch.Tensor | None = None
) -> None:
    """``actual`` within OUTPUT ulps of ``expected`` on every row, except that rows in
    ``unwritten`` (a regression variant's skipped rows) must still hold the NaN poison."""
    written = torch.ones(actual.shape[0], dtype=torch.bool, device=actual.device)
    if unwritten is not None:
        written = ~unwritten
        assert actual[unwritten].isnan().all(), f"{field}: skipped rows were written"
    bad, worst = row_violations(actual[written], expected[written], OUTPUT_TOLERANCES[field])
    assert not bad.any(), f"{field}: {int(worst.max())} ulps from the oracle"


def assert_outputs_match(
    launch: Launch, ref: reference.FusedReference, unwritten: dict[str, torch.Tensor] | None = None
) -> None:
    unwritten = unwritten or {}
    out = launch.outputs
    for field in ("q_out", "kv_out", "kpe_out", "index_k_out"):
        actual = getattr(out, field)
        if actual is None:
            continue
        assert_rows_close(field, actual, getattr(ref, field), unwritten.get(field))
    if launch.inputs.has_indexer:
        assert (out.topk_indices == -1).all(), "topk_indices: not filled with -1"
    else:
        assert (out.topk_indices == TOPK_SENTINEL).all(), "topk_indices: touched on a shared layer"


def _owned_slots(slots: torch.Tensor | None) -> torch.Tensor:
    if slots is None:
        return torch.empty(0, dtype=torch.int64)
    return slots[slots >= 0]


def assert_mla_entries_close(layout: CacheLayout, act_dtype: torch.dtype,
                             actual: torch.Tensor, expected: torch.Tensor,
                             kv_fp32: torch.Tensor) -> None:
    """Owned MLA entries (``[N, E]`` uint8), part by part in the layout's formats, with
    the harness's per-part tolerances (and its slack, from the oracle's ``kv_fp32`` of
    the entries' tokens)."""
    kv_dim = DS_MLA_NOPE_DIM  # every preset here has kv_lora_rank 512 and rope_dim 64
    slack = mla_part_slack(layout, kv_fp32)
    for part in mla_entry_parts(layout, kv_dim, 64, act_dtype):
        bad, worst = part_violations(actual, expected, part, slack.get(part.name))
        assert not bad.any(), f"mla {layout.value} {part.name}: {int(worst.max())} steps"


def assert_caches_match(launch: Launch, ref: reference.FusedReference) -> None:
    """Owned entries equal the oracle's encoding within tolerance; every other byte,
    guard blocks included, is unchanged bitwise."""
    inputs = launch.inputs
    inner = slice(GUARD_BLOCKS, -GUARD_BLOCKS)
    expected_mla, expected_index = reference.expected_caches(
        launch.mla_before[inner].cpu(),
        None if launch.index_before is None else launch.index_before[inner].cpu(),
        None if inputs.slot_mapping is None else inputs.slot_mapping.cpu(),
        None if inputs.index_slot_mapping is None else inputs.index_slot_mapping.cpu(),
        _cpu(ref),
    )
    mla_after = launch.mla_storage.cpu()
    assert torch.equal(mla_after[:GUARD_BLOCKS], launch.mla_before[:GUARD_BLOCKS].cpu())
    assert torch.equal(mla_after[-GUARD_BLOCKS:], launch.mla_before[-GUARD_BLOCKS:].cpu())
    mla_owned = _owned_slots(None if inputs.slot_mapping is None else inputs.slot_mapping.cpu())
    entries = mla_after[inner].reshape(-1, mla_after.shape[-1])
    expected_entries = expected_mla.reshape(-1, mla_after.shape[-1])
    others = torch.ones(entries.shape[0], dtype=torch.bool)
    others[mla_owned] = False
    assert torch.equal(entries[others], expected_entries[others]), "mla cache: foreign bytes"
    if mla_owned.numel():
        owned_tokens = torch.nonzero(inputs.slot_mapping.cpu() >= 0).flatten()
        assert_mla_entries_close(
            inputs.cache_layout, inputs.q_c.dtype, entries[mla_owned], expected_entries[mla_owned],
            ref.kv_fp32.cpu()[owned_tokens],
        )

    if launch.index_storage is None:
        return
    index_after = launch.index_storage.cpu()
    index_dim = index_after.shape[-1] - 4
    index_slots = inputs.index_slot_mapping
    index_owned = _owned_slots(None if index_slots is None else index_slots.cpu())
    values, scales = reference.read_index_cache(index_after[inner], index_owned, index_dim)
    expected_values, expected_scales = reference.read_index_cache(
        expected_index, index_owned, index_dim
    )
    value_part = index_entry_parts(index_dim)[0]
    bad, worst = row_violations(values, expected_values, value_part.tolerance)
    assert not bad.any(), f"indexer fp8 values: {int(worst.max())} steps"
    scale_ulps = ulp_distance(scales, expected_scales)
    assert scale_ulps.numel() == 0 or int(scale_ulps.max()) <= UE8M0_SCALE.max_steps, (
        "indexer UE8M0 scales"
    )
    # Every byte outside the owned entries, guards included: patch the owned entries of
    # the expected cache with the kernel's own bytes, then require bitwise equality.
    patched = expected_index.clone()
    written = reference.write_index_cache(patched, index_owned, values, scales)
    assert torch.equal(index_after[inner], written), "indexer cache: foreign bytes"
    assert torch.equal(index_after[:GUARD_BLOCKS], launch.index_before[:GUARD_BLOCKS].cpu())
    assert torch.equal(index_after[-GUARD_BLOCKS:], launch.index_before[-GUARD_BLOCKS:].cpu())


def _cpu(ref: reference.FusedReference) -> reference.FusedReference:
    return reference.FusedReference(
        **{
            name: None if value is None else value.cpu()
            for name, value in vars(ref).items()
        }
    )


def run_and_check(launch: Launch, **kernel_options: object) -> reference.FusedReference:
    fused_norm_rope(launch.inputs, launch.outputs, launch.caches, **kernel_options)
    ref = oracle(launch.inputs)
    assert_outputs_match(launch, ref)
    assert_caches_match(launch, ref)
    return ref


# ----------------------------------------------------------------------------------------
# The correct kernel
# ----------------------------------------------------------------------------------------

LAYOUTS = list(CacheLayout)
INDEXERS = {"shared": (False, None), "neox": (True, False), "interleaved": (True, True)}


@pytest.mark.parametrize("indexer", list(INDEXERS))
@pytest.mark.parametrize("act_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=[x.value for x in LAYOUTS])
def test_mixed_slots_match_oracle(device, layout, act_dtype, indexer):
    """17 tokens, about half owned on this rank (MLA and indexer drawn separately):
    every output row right, owned entries right, every other cache byte unchanged."""
    has_indexer, interleaved = INDEXERS[indexer]
    launch = build_launch(
        device,
        layout=layout,
        act_dtype=act_dtype,
        indexer=has_indexer,
        index_rope_interleaved=interleaved,
    )
    run_and_check(launch)


@pytest.mark.parametrize("num_tokens", [1, 5])
def test_few_tokens_all_owned(device, num_tokens):
    run_and_check(build_launch(device, num_tokens=num_tokens, owned_fraction=1.0,
                               index_owned_fraction=1.0, layout=CacheLayout.FP8_DS_MLA))


@pytest.mark.parametrize("layout", LAYOUTS, ids=[x.value for x in LAYOUTS])
def test_profiling_call_writes_no_cache(device, layout):
    """``slot_mapping is None``: outputs still right, both caches unchanged bytewise."""
    launch = build_launch(device, layout=layout, profiling=True)
    fused_norm_rope(launch.inputs, launch.outputs, launch.caches)
    assert_outputs_match(launch, oracle(launch.inputs))
    assert torch.equal(launch.mla_storage, launch.mla_before)
    assert torch.equal(launch.index_storage, launch.index_before)


@pytest.mark.parametrize("num_tokens", [1, 17])
def test_all_negative_slots_write_nothing(device, num_tokens):
    """A rank that owns none of the batch (one decode token under DCP4 on three ranks)
    still produces every output, and writes no cache byte."""
    launch = build_launch(
        device, num_tokens=num_tokens, owned_fraction=0.0, index_owned_fraction=0.0
    )
    run_and_check(launch)
    assert torch.equal(launch.mla_storage, launch.mla_before)
    assert torch.equal(launch.index_storage, launch.index_before)


def test_indexer_uses_its_own_slot_mapping(device):
    """MLA cache sharded (half owned), indexer cache replicated (every token owned, at
    different slots): each cache follows its own mapping."""
    launch = build_launch(device, owned_fraction=0.5, index_owned_fraction=1.0)
    mla_slots, index_slots = launch.inputs.slot_mapping, launch.inputs.index_slot_mapping
    assert not torch.equal(mla_slots, index_slots)
    run_and_check(launch)


def test_strided_rows_of_a_fused_projection(device):
    """q_c, kv_c and k_pe as column slices of one projection output: row strides are
    read from the tensors, not assumed equal to the row width."""
    launch = build_launch(device, fused_projection=True, layout=CacheLayout.FP8)
    assert launch.inputs.q_c.stride(0) != launch.inputs.q_c.shape[1]
    run_and_check(launch)


@pytest.mark.parametrize("block_tokens", [1, 4])
def test_tiles_ending_past_the_last_token(device, block_tokens):
    """17 tokens in tiles of 1 and 4 (the last tile mostly past the end): the token
    mask, not the tile size, decides what is written."""
    launch = build_launch(device, layout=CacheLayout.FP8_DS_MLA, seed=3)
    run_and_check(launch, block_tokens=block_tokens)


def test_block_size_one_and_large_positions(device):
    launch = build_launch(device, block_size=1, seed=5)
    launch.inputs.positions[:] = SMALL.max_position - 1 - torch.arange(17, device=device)
    run_and_check(launch)


# ----------------------------------------------------------------------------------------
# Q launched apart (launcher.GPU_Q_APART_FROM_TOKENS)
# ----------------------------------------------------------------------------------------


def _written_bytes(launch: Launch) -> dict[str, torch.Tensor]:
    """Every buffer a launch may write, guards included, as CPU tensors."""
    written = {
        name: value.cpu()
        for name, value in vars(launch.outputs).items()
        if isinstance(value, torch.Tensor)
    }
    written["mla_cache"] = launch.mla_storage.cpu()
    if launch.index_storage is not None:
        written["index_cache"] = launch.index_storage.cpu()
    return written


RACING_CACHE_WRITES = {"mutant/foreign-rows-write-cache", "mutant/negative-slot-wraps"}
"""Mutants whose unowned tokens all store to one MLA entry (entry 0, or the slot -1 wraps
to): which store lands last depends on the GPU's program order, so their MLA cache bytes
differ from run to run of one launch as well (seen on the H200)."""


@pytest.mark.parametrize("indexer", [True, False], ids=["indexer", "shared"])
@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_q_launched_apart_writes_the_bytes_of_one_launch(device, variant, indexer):
    """The two launches of a large batch on a GPU (the sub-tasks up to KV, then Q alone)
    write exactly what one launch of every sub-task writes, for the correct kernel and
    every mutant: only the dispatch moved. Both ways are run explicitly. A fp8_ds_mla
    cache so the layout's own mutants act. The MLA cache of a mutant in
    ``RACING_CACHE_WRITES`` is left out on a GPU, where its bytes are a race."""
    written = {}
    for apart in (False, True):
        launch = build_launch(
            device, num_tokens=5, layout=CacheLayout.FP8_DS_MLA, indexer=indexer, seed=21
        )
        fused_norm_rope(
            launch.inputs, launch.outputs, launch.caches, variant=variant, q_apart=apart
        )
        written[apart] = _written_bytes(launch)
    for name, one_launch in written[False].items():
        racing = variant.name in RACING_CACHE_WRITES and device.type == "cuda"
        if racing and name == "mla_cache":
            continue
        assert torch.equal(one_launch.view(torch.uint8), written[True][name].view(torch.uint8)), (
            f"{name} differs when Q is launched apart"
        )


@pytest.mark.parametrize(
    ("q_apart", "from_tokens"),
    [(None, 3), (None, 4), (False, 3), (True, 4)],
    ids=["default-at-threshold", "default-below", "one", "apart"],
)
def test_the_launches_of_each_plan(device, monkeypatch, q_apart, from_tokens):
    """Q apart: two launches, the sub-tasks up to KV (from the indexer's on an indexer
    layer), then Q alone; otherwise one launch of every sub-task. By default a GPU
    launches Q apart from ``GPU_Q_APART_FROM_TOKENS`` tokens; the interpreter never. The
    grid is 1-D, one program per sub-task and block of tokens (one block of the 3 tokens
    when interpreted, one token each on a GPU)."""
    from dcpcheck.backend import current_backend
    from dcpcheck.ops.fused_norm_rope import launcher
    from dcpcheck.ops.fused_norm_rope.kernel import TASK_INDEXER_K, TASK_KV, TASK_Q

    kernel, ranges = launcher.kernel_of(launcher.DEFAULT_VARIANT), []

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                ranges.append((kwargs["FIRST_TASK"], kwargs["LAST_TASK"], grid))
                return kernel[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(launcher, "kernel_of", lambda variant: Recorder())
    monkeypatch.setattr(launcher, "GPU_Q_APART_FROM_TOKENS", from_tokens)
    for indexer in (True, False):
        launch = build_launch(device, num_tokens=3, indexer=indexer)
        fused_norm_rope(launch.inputs, launch.outputs, launch.caches, q_apart=q_apart)
    by_default = not current_backend().interpreted and from_tokens <= 3
    apart = by_default if q_apart is None else q_apart
    q, kv = TASK_Q.value, TASK_KV.value
    blocks = 1 if current_backend().interpreted else 3
    expected = []
    for first in (TASK_INDEXER_K.value, kv):
        if apart:
            expected += [(first, kv, ((kv - first + 1) * blocks,)), (q, q, (blocks,))]
        else:
            expected += [(first, q, ((q - first + 1) * blocks,))]
    assert ranges == expected


# ----------------------------------------------------------------------------------------
# Regression variants
# ----------------------------------------------------------------------------------------

SKIPPED_FIELDS = {
    "regress/pre-50005": ("q_out",),
    "regress/pre-54908": ("kv_out", "kpe_out"),
}


@pytest.mark.parametrize("variant", REGRESSIONS, ids=[v.name for v in REGRESSIONS])
@pytest.mark.parametrize("layout", LAYOUTS, ids=[x.value for x in LAYOUTS])
def test_regression_skips_exactly_the_unowned_rows(device, variant, layout):
    """The variant leaves its fields NaN on exactly the rows without a local slot, and
    matches the oracle everywhere else: other rows, other fields, both caches."""
    launch = build_launch(device, layout=layout, seed=11)
    load_kernel(variant.name)(launch.inputs, launch.outputs, launch.caches)
    ref = oracle(launch.inputs)
    unowned = launch.inputs.slot_mapping < 0
    assert unowned.any() and (~unowned).any()
    skipped = {field: unowned for field in SKIPPED_FIELDS[variant.name]}
    assert_outputs_match(launch, ref, unwritten=skipped)
    assert_caches_match(launch, ref)


@pytest.mark.parametrize("variant", REGRESSIONS, ids=[v.name for v in REGRESSIONS])
def test_regression_invisible_when_every_slot_is_owned(device, variant):
    """DCP1: every token owned, so the bug does not show; this is why it shipped."""
    launch = build_launch(device, owned_fraction=1.0, index_owned_fraction=1.0, seed=12)
    load_kernel(variant.name)(launch.inputs, launch.outputs, launch.caches)
    ref = oracle(launch.inputs)
    assert_outputs_match(launch, ref)
    assert_caches_match(launch, ref)


# ----------------------------------------------------------------------------------------
# Registry and argument checks
# ----------------------------------------------------------------------------------------


def test_registry_names_and_unknown_kernel():
    assert {"default", "regress/pre-50005", "regress/pre-54908"} <= set(KERNELS)
    assert set(KERNELS) == {v.name for v in VARIANTS}
    with pytest.raises(KernelLoadError) as excinfo:
        load_kernel("regress/nope")
    message = str(excinfo.value)
    assert "regress/nope" in message and "regress/pre-" in message  # the closest names
    assert "dcpcheck list kernels" in message


def test_default_kernel_from_registry(device):
    launch = build_launch(device, seed=21)
    kernel = load_kernel("default")
    kernel(launch.inputs, launch.outputs, launch.caches)
    ref = oracle(launch.inputs)
    assert_outputs_match(launch, ref)
    assert_caches_match(launch, ref)


def _shrink_kv_out(launch: Launch) -> None:
    launch.outputs.kv_out = launch.outputs.kv_out[:, :256]


def _int32_slots(launch: Launch) -> None:
    launch.inputs.slot_mapping = launch.inputs.slot_mapping.to(torch.int32)


def _slot_past_the_cache(launch: Launch) -> None:
    launch.inputs.slot_mapping[0] = launch.caches.mla.shape[0] * launch.caches.mla.shape[1]


def _fp8_without_scale(launch: Launch) -> None:
    launch.inputs.mla_scale = None


def _index_slots_missing(launch: Launch) -> None:
    launch.inputs.index_slot_mapping = None


def _position_past_the_table(launch: Launch) -> None:
    launch.inputs.positions[3] = launch.inputs.cos_sin.shape[0]


def _wrong_entry_bytes(launch: Launch) -> None:
    launch.caches.mla = launch.caches.mla[:, :, :-4]


def _fp32_activations(launch: Launch) -> None:
    launch.inputs.q_c = launch.inputs.q_c.float()


BAD_LAUNCHES = {
    "kv_out: expected shape (17, 512), got (17, 256)": _shrink_kv_out,
    "slot_mapping: expected dtype torch.int64, got torch.int32": _int32_slots,
    "slot_mapping: slot 44 is outside the cache's 44 entries": _slot_past_the_cache,
    "mla_scale: the fp8 layout needs a finite scale > 0, got None": _fp8_without_scale,
    "index_slot_mapping: required on indexer layers": _index_slots_missing,
    "positions: range": _position_past_the_table,
    "caches.mla: expected shape (num_blocks, 4, 576)": _wrong_entry_bytes,
    "q_c: expected dtype torch.bfloat16 or torch.float16, got torch.float32": _fp32_activations,
}


@pytest.mark.parametrize("message", list(BAD_LAUNCHES))
def test_bad_launch_is_refused_with_a_precise_message(device, message):
    launch = build_launch(device, layout=CacheLayout.FP8)
    BAD_LAUNCHES[message](launch)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        fused_norm_rope(launch.inputs, launch.outputs, launch.caches)
    assert torch.equal(launch.mla_storage, launch.mla_before), "a refused launch wrote"


# ----------------------------------------------------------------------------------------
# fp8 / UE8M0 encoders, on their own
# ----------------------------------------------------------------------------------------


@triton.jit
def _encode_kernel(x_ptr, codes_ptr, amax_ptr, scales_ptr, N: tl.constexpr):
    lanes = tl.arange(0, N)
    x = tl.load(x_ptr + lanes)
    tl.store(codes_ptr + lanes, fp8_e4m3_codes(x).to(tl.uint8))
    tl.store(scales_ptr + lanes, ue8m0_scale(tl.load(amax_ptr + lanes)))


def _fp8_probe_values() -> torch.Tensor:
    """Every finite e4m3 value, the midpoints between neighbours (ties, which must go to
    the even code), one fp32 ulp either side of each midpoint, values past 448 and the
    subnormal range, with both signs."""
    codes = torch.arange(256, dtype=torch.uint8)
    values = codes.view(torch.float8_e4m3fn).float()
    values = values[values.isfinite()].unique()
    mids = (values[1:] + values[:-1]) / 2
    above = torch.nextafter(mids, torch.full_like(mids, float("inf")))
    below = torch.nextafter(mids, torch.full_like(mids, -float("inf")))
    extremes = torch.tensor([448.5, 464.0, 500.0, 1e6, float("inf"), 1e-30, 2.0**-10, 3e-3])
    probe = torch.cat([values, mids, above, below, extremes])
    return torch.cat([probe, -probe])


def test_fp8_and_ue8m0_encoders_match_torch(device):
    """The integer fp8 encoder equals torch's round-to-nearest-even cast after clamping to
    +-448 on every probe; UE8M0 scales equal the oracle's exact ceil-log2 rule, including
    ratios that are exact powers of two and one ulp above them."""
    x = _fp8_probe_values()
    powers = torch.tensor([2.0**k for k in range(-12, 8)]) * 448.0
    amax = torch.cat([powers, torch.nextafter(powers, powers * 2), torch.rand(100) * 100,
                      torch.tensor([0.0, 1e-5, 1e-4])])
    n = triton.next_power_of_2(max(x.numel(), amax.numel()))
    x = torch.cat([x, torch.zeros(n - x.numel())]).to(device)
    amax = torch.cat([amax, torch.ones(n - amax.numel())]).to(device)
    codes = torch.empty(n, dtype=torch.uint8, device=device)
    scales = torch.empty(n, dtype=torch.float32, device=device)
    _encode_kernel[(1,)](x, codes, amax, scales, n)
    assert torch.equal(codes.cpu(), reference.fp8_e4m3_bytes(x.cpu()))
    assert torch.equal(scales.cpu(), reference.ue8m0_scale(amax.cpu()))


@triton.jit
def _nvfp4_codes_kernel(x_ptr, e2m1_ptr, fp8_ptr, fp8_values_ptr, N: tl.constexpr):
    lanes = tl.arange(0, N)
    tl.store(e2m1_ptr + lanes, e2m1_codes(tl.load(x_ptr + lanes)).to(tl.uint8))
    fp8 = tl.load(fp8_ptr + lanes, mask=lanes < 256, other=0).to(tl.int32)
    tl.store(fp8_values_ptr + lanes, fp8_e4m3_values(fp8), mask=lanes < 256)


def _e2m1_probe_values() -> torch.Tensor:
    """Every e2m1 magnitude, the midpoints between neighbours (ties, which go to the even
    code), one fp32 ulp either side of each, values past 6, and both signs of each."""
    magnitudes = torch.tensor(reference.quant.E2M1_MAGNITUDES)
    mids = (magnitudes[1:] + magnitudes[:-1]) / 2
    above = torch.nextafter(mids, torch.full_like(mids, float("inf")))
    below = torch.nextafter(mids, torch.full_like(mids, -float("inf")))
    extremes = torch.tensor([6.5, 7.0, 1e6, float("inf"), 1e-30, 0.1])
    probe = torch.cat([magnitudes, mids, above, below, extremes])
    return torch.cat([probe, -probe])


def test_e2m1_encoder_and_e4m3_decoder_match_the_oracle(device):
    """The comparison-based e2m1 encoder equals the oracle's round-to-nearest-even,
    saturating one on every probe (ties, one ulp either side, -0); the e4m3 decoder
    returns every finite byte's exact value."""
    x = _e2m1_probe_values()
    n = triton.next_power_of_2(max(x.numel(), 256))
    x = torch.cat([x, torch.zeros(n - x.numel())]).to(device)
    fp8 = torch.arange(256, dtype=torch.uint8)
    finite = (fp8 & 0x7F) != 0x7F
    e2m1 = torch.empty(n, dtype=torch.uint8, device=device)
    values = torch.empty(256, dtype=torch.float32, device=device)
    _nvfp4_codes_kernel[(1,)](x, e2m1, fp8.to(device), values, n)
    assert torch.equal(e2m1.cpu(), reference.quant.e2m1_codes(x.cpu()))
    assert torch.equal(values.cpu()[finite], reference.fp8_e4m3_values(fp8)[finite])


@pytest.mark.parametrize("act_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nvfp4_ds_mla_entries_equal_the_oracle_bytewise(device, seed, act_dtype):
    """Every owned nvfp4_ds_mla entry equals the oracle's byte for byte: e2m1 codes and
    their nibble order, unscaled e4m3 RoPE bytes, e4m3 tile scales at their permuted
    bytes. One token's latent is all zeros, so its tiles take the 2^-9 floor scale."""
    launch = build_launch(device, layout=CacheLayout.NVFP4_DS_MLA, act_dtype=act_dtype,
                          owned_fraction=1.0, seed=seed)
    launch.inputs.kv_c[3] = 0.0
    fused_norm_rope(launch.inputs, launch.outputs, launch.caches)
    ref = oracle(launch.inputs)
    written = reference.read_mla_cache(launch.caches.mla, launch.inputs.slot_mapping).cpu()
    assert written.shape[1] == NVFP4_DS_MLA_ENTRY_BYTES
    assert torch.equal(written, ref.mla_entries.cpu())
    floor_scales = written[3, NVFP4_DS_MLA_SCALES_OFFSET:]
    assert torch.equal(floor_scales, torch.ones_like(floor_scales))  # e4m3 byte of 2^-9


# ----------------------------------------------------------------------------------------
# Real shapes, large token counts and 64-bit addressing: GPU only
# ----------------------------------------------------------------------------------------

REAL_PRESETS = [PRESETS["deepseek-v3.2"], PRESETS["glm-5"]]


@requires_cuda
@pytest.mark.slow
@pytest.mark.parametrize("num_tokens", [1, 17, 4096, 65536])
@pytest.mark.parametrize("layout", LAYOUTS, ids=[x.value for x in LAYOUTS])
@pytest.mark.parametrize("preset", REAL_PRESETS, ids=[p.name for p in REAL_PRESETS])
def test_real_shapes_on_gpu(device, preset, layout, num_tokens):
    """Non-power-of-two q_lora (1536, 2048 is fine too), up to 65,536 tokens (a program
    per sub-task and token on the 1-D grid: 196,608 in the first launch)."""
    launch = build_launch(
        device, num_tokens=num_tokens, preset=preset, layout=layout, block_size=64, seed=31
    )
    run_and_check(launch)


@requires_cuda
@pytest.mark.slow
def test_addresses_past_int32_on_gpu(device):
    """A ds_mla cache of 3.4M slots (2.2 GB): slot * 656 passes 2^31 for the last ones,
    and q_c rows 1.2G elements apart put token 2's row past 2^31 elements. 32-bit address
    arithmetic would wrap these writes/reads to negative offsets."""
    block_size = 64
    num_blocks = 53_000
    entries = num_blocks * block_size
    assert (entries - 70) * DS_MLA_ENTRY_BYTES > 2**31
    needed = 2.2e9 + 2 * 1.2e9 * 2 + 1e9
    if torch.cuda.mem_get_info(device)[0] < needed:
        pytest.skip(f"needs {needed / 1e9:.1f} GB of free GPU memory")
    launch = build_launch(device, num_tokens=3, layout=CacheLayout.FP8_DS_MLA, indexer=False,
                          block_size=block_size, seed=41)
    row_gap = 1_200_000_000
    wide = torch.zeros(2 * row_gap + launch.inputs.q_c.shape[1], dtype=torch.bfloat16,
                       device=device)
    far_q = wide.as_strided(launch.inputs.q_c.shape, (row_gap, 1))
    far_q.copy_(launch.inputs.q_c)
    launch.inputs.q_c = far_q
    mla = torch.randint(
        0, 256, (num_blocks, block_size, DS_MLA_ENTRY_BYTES), dtype=torch.uint8, device=device
    )
    before = mla[-2:].clone()
    launch.caches.mla = mla
    launch.inputs.slot_mapping = torch.tensor([entries - 1, -1, entries - 70], device=device)
    fused_norm_rope(launch.inputs, launch.outputs, launch.caches)
    ref = oracle(launch.inputs)
    assert_outputs_match(launch, ref)
    owned = launch.inputs.slot_mapping[[0, 2]]
    written = reference.read_mla_cache(mla, owned).cpu()
    assert_mla_entries_close(CacheLayout.FP8_DS_MLA, torch.bfloat16, written,
                             ref.mla_entries[[0, 2]].cpu(), ref.kv_fp32[[0, 2]].cpu())
    untouched = mla[-2:].reshape(-1, DS_MLA_ENTRY_BYTES)
    others = torch.ones(untouched.shape[0], dtype=torch.bool, device=device)
    others[owned - (entries - 2 * block_size)] = False
    assert torch.equal(untouched[others], before.reshape(-1, DS_MLA_ENTRY_BYTES)[others])
