"""One case: a scenario at one DCP size, turned into the buffers every simulated rank gets.

The harness owns every buffer a kernel writes (docs/dcp-contract.md):

* outputs are allocated here and **poisoned** (NaN, top-k with a sentinel) so an
  unwritten row can never pass by luck; each lives inside a larger storage with
  ``OUTPUT_GUARD_ROWS`` rows of ``OUTPUT_GUARD_BYTE`` before and after it, so a write past
  either end is seen even when it crashes nothing;
* each cache lives inside a larger byte *storage* with guard blocks before and after the
  addressable range and the scenario's gap between blocks, all filled with a seeded random
  byte pattern (``guarded_cache``), so "unchanged" and "no out-of-bounds write" are both
  checked bytewise;
* every rank gets its own outputs and caches, but the ranks' storages of one buffer lie
  side by side in one tensor (``[ranks, ...]``), so ``fused_checks`` compares every rank
  in one pass without copying;
* the cached prefix of every request is pre-written with real encodings, so a kernel
  that rewrites a prefix entry is caught even if it writes plausible data.

Activations depend only on the scenario and its seed, never on the DCP size, so DCP1
and DCPn runs (and every rank) see identical inputs.

The fp8_ds_mla tile-scale rule is the scenario's ``ds_mla_scale``; the runner has already
resolved it (``runner.effective_ds_mla_scale``) before a case is built, so here an unset
one simply means the op document's default, ``amax``. The oracle, the pre-written prefix entries
and every rank's ``FusedOpInputs`` all get that one rule. The nvfp4_ds_mla tile scale has
no such choice in a case: the oracle and the prefix entries form ``amax / 6`` by division,
docs/fused-norm-rope.md's formula (``reference.NVFP4_SCALE_DIV``), which the project's kernel
writes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

import torch

import reference
from dcpcheck.cases import seeded
from dcpcheck.cases.dcp import SlotMappings, num_blocks, slot_mappings
from dcpcheck.ops.fused_norm_rope.activation_rows import fuse_inputs, output_row_strides
from dcpcheck.ops.fused_norm_rope.contract import (
    DsMlaScale,
    FusedOpCaches,
    FusedOpInputs,
    FusedOpOutputs,
    ModelPreset,
    index_entry_bytes,
    mla_entry_bytes,
)
from dcpcheck.ops.fused_norm_rope.guarded_cache import (
    GUARD_BLOCKS,
    GuardedCache,
    guarded_caches,
    random_storages,
)
from dcpcheck.ops.fused_norm_rope.scenario import Scenario
from dcpcheck.ops.fused_norm_rope.value_regimes import (
    BELOW_FLOOR_INDEX_BIAS_GAIN,
    BELOW_FLOOR_INDEX_WEIGHT_GAIN,
    FP8_SATURATION_GAIN,
    TIE_K_PE_MAX,
    below_floor_rows,
    tie_rows,
    tie_weight,
    zero_rows,
)

TOPK_SENTINEL = 0x5EED
"""Value the top-k buffer starts with: must survive on shared layers, vanish on indexer ones."""

OUTPUT_GUARD_ROWS = 2
"""Guard rows on each side of every output: a token index one past the end (or one before
the start) lands inside them rather than in memory nobody checks."""

OUTPUT_GUARD_BYTE = 0xA5
"""Every byte of an output's guard rows. Not zero and not NaN (what an unwritten or
skipped row holds), and as bf16/fp16/fp32 a tiny negative number no kernel computes."""

POISON_BITS = {
    torch.bfloat16: (torch.int16, 0x7FE1),
    torch.float16: (torch.int16, 0x7E21),
    torch.float32: (torch.int32, 0x7FC00021),
}
"""The NaN every float output starts as, by dtype: (the integer view, its bits). A quiet
NaN with a payload (0x21) that arithmetic never produces: a computed NaN is the
canonical one (0x7FC0 / 0x7FFF for bf16, and so on), so a NaN row that holds these bits
was never written, and one that holds other NaN bits was computed (``holds_poison``)."""


def fill_poison(output: torch.Tensor) -> None:
    """Fill a float output with ``POISON_BITS``."""
    view, bits = POISON_BITS[output.dtype]
    output.view(view).fill_(bits)


def holds_poison(rows: torch.Tensor) -> torch.Tensor:
    """Elementwise: which elements of float ``rows`` still hold the poison's bits."""
    view, bits = POISON_BITS[rows.dtype]
    return rows.contiguous().view(view) == bits


@dataclass
class Activations:
    """The token values of a scenario, identical for every rank and DCP size."""

    q_c: torch.Tensor
    q_weight: torch.Tensor
    kv_c: torch.Tensor
    kv_weight: torch.Tensor
    k_pe: torch.Tensor
    positions: torch.Tensor
    cos_sin: torch.Tensor
    index_k: torch.Tensor | None
    index_weight: torch.Tensor | None
    index_bias: torch.Tensor | None
    # fp32 values of the tokens already cached (the batch's prefixes, request by request),
    # encoded into the pre-written entries: the same at every DCP size, so drawn once.
    prefix_kv: torch.Tensor
    prefix_kpe: torch.Tensor
    prefix_index: torch.Tensor


@dataclass(frozen=True)
class OutputGuardWrite:
    """Bytes changed in the guard rows on one side of an output."""

    side: str  # "before" / "after"
    row: int  # first changed row, as a token index (-2, -1 before; T, T + 1 after)
    bytes_changed: int


@dataclass
class GuardedOutput:
    """An output view inside a storage with ``OUTPUT_GUARD_ROWS`` guard rows around it,
    whose rows may be wider than the output (its row stride, ``activation_rows``): the
    columns past the output's are guard bytes too."""

    storage: torch.Tensor  # [GUARD + T + GUARD, S], every byte outside the view the guard's
    width: int  # the output's columns, the first ``width`` of each row

    @property
    def view(self) -> torch.Tensor:
        """What the kernel gets: the ``T`` rows between the guards, ``width`` columns each."""
        rows = slice(OUTPUT_GUARD_ROWS, self.storage.shape[0] - OUTPUT_GUARD_ROWS)
        return self.storage[rows, : self.width]

    def guard_writes(self) -> list[OutputGuardWrite]:
        """The guard rows on each side, and the columns beside the output's, that no longer
        hold ``OUTPUT_GUARD_BYTE`` only."""
        rows = self.storage.shape[0] - 2 * OUTPUT_GUARD_ROWS
        as_bytes = self.storage.view(torch.uint8)
        beside = self.width * self.storage.element_size()
        writes = []
        for side, guard, first_row in (
            ("before", as_bytes[:OUTPUT_GUARD_ROWS], -OUTPUT_GUARD_ROWS),
            ("beside", as_bytes[OUTPUT_GUARD_ROWS : OUTPUT_GUARD_ROWS + rows, beside:], 0),
            ("after", as_bytes[OUTPUT_GUARD_ROWS + rows :], rows),
        ):
            changed = (guard != OUTPUT_GUARD_BYTE).cpu()
            if changed.any():
                row = int(torch.nonzero(changed.any(dim=1)).flatten()[0])
                writes.append(OutputGuardWrite(side, first_row + row, int(changed.sum())))
        return writes


@dataclass
class RankLaunch:
    """Everything one simulated rank hands to the kernel and gets back."""

    rank: int
    inputs: FusedOpInputs
    outputs: FusedOpOutputs
    mla: GuardedCache
    index: GuardedCache | None
    prefix_slots: torch.Tensor  # [P] this rank's slots of cached-prefix tokens (-1 foreign)
    index_prefix_slots: torch.Tensor | None
    output_guards: dict[str, GuardedOutput]  # by FusedOpOutputs field; ``outputs`` are views

    @property
    def caches(self) -> FusedOpCaches:
        return FusedOpCaches(self.mla.view, self.index.view if self.index else None)


@dataclass
class Case:
    """A scenario at one DCP size: the mappings, the oracle's answer, and one launch per rank."""

    scenario: Scenario
    dcp_size: int
    mappings: SlotMappings
    index_mappings: SlotMappings | None  # None on shared layers
    activations: Activations
    expected: reference.FusedReference
    ranks: list[RankLaunch]

    @property
    def label(self) -> str:
        return f"{self.scenario.name}[dcp{self.dcp_size}]"


@cache
def _cos_sin(preset: ModelPreset, device: torch.device) -> torch.Tensor:
    return reference.cos_sin_table(preset.max_position, preset.rope_dim, preset.rope_base).to(
        device
    )


def make_activations(scenario: Scenario, seed: int, device: torch.device) -> Activations:
    """Seeded token values with the same bits on every device (``dcpcheck.cases.seeded``).

    The scenario's value regime (``Scenario.values``) then reshapes them:

    * ``normal``: Gaussian rows, weights ``1 +- 0.1``.
    * ``zero-rows``: every ``value_regimes.ZERO_ROW_STRIDE``-th row of ``q_c``, ``kv_c``,
      ``index_k`` is zero: ``RMSNorm(0)`` is ``0 * rsqrt(eps)``, the fp8_ds_mla tile scale
      falls to its ``FLT_MIN`` floor and the indexer's UE8M0 amax to its ``1e-4`` floor.
    * ``fp8-saturating``: ``kv_weight`` and ``k_pe`` times ``FP8_SATURATION_GAIN``, so the
      per-tensor fp8 cache clamps to +-448 (the adaptive ds_mla / UE8M0 scales just grow).
    * ``exact-ties``: norm inputs from ``tie_rows`` and weights from ``tie_weight``, so
      ``RMSNorm(x) * w`` is exact in fp32 and 3/8 of the ``q_out`` / ``kv_out`` values (and of
      the unrotated ``index_k_out`` lanes, bias 0) sit exactly on a rounding tie of the output
      dtype, the rest exactly representable: a kernel that rounds ties differently lands one
      step off, the most the tolerance allows. True ties can only be forced where the math is
      exact; the rotated outputs (RoPE's cos/sin) and fp8 encodings divided by a scale are not.
    * ``below-floor``: every ``value_regimes.BELOW_FLOOR_STRIDE``-th row of ``q_c``, ``kv_c``,
      ``index_k`` is tiny but non-zero in every lane (``below_floor_rows``), and the indexer's
      weight and bias are scaled down (``BELOW_FLOOR_INDEX_WEIGHT_GAIN``, ``..._BIAS_GAIN``):
      each such row's indexer amax lies below the UE8M0 floor 1e-4, and each of its
      fp8_ds_mla and nvfp4_ds_mla NoPE tiles below the ``pow2`` ratio floor 1e-4 and the
      nvfp4 floor 2^-9, so every scale of those rows is the floor's, as in ``zero-rows``, but
      their codes are not all zero: a kernel that floors only an all-zero amax writes other
      scales and codes (``value_regimes.BELOW_FLOOR_UNIT`` gives the bounds).
    """
    preset, dtype = scenario.model, scenario.torch_dtype
    gen = torch.Generator().manual_seed(seed)
    tokens = scenario.batch.num_tokens
    streams = iter(range(1, 100))  # one stream per draw, in this fixed order

    def randn(*shape: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
        return seeded.normal(seed, next(streams), shape, device) * scale + shift

    def activation(*shape: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
        return randn(*shape, scale=scale, shift=shift).to(dtype)

    positions = slot_mappings(
        scenario.batch, scenario.layout(1), scenario.block_tables(1)
    ).positions
    act = Activations(
        q_c=activation(tokens, preset.q_lora_rank),
        q_weight=activation(preset.q_lora_rank, scale=0.1, shift=1.0),
        kv_c=activation(tokens, preset.kv_lora_rank),
        kv_weight=activation(preset.kv_lora_rank, scale=0.1, shift=1.0),
        k_pe=activation(tokens, preset.rope_dim),
        positions=positions,
        cos_sin=_cos_sin(preset, device),
        index_k=None,
        index_weight=None,
        index_bias=None,
        **_prefix_values(scenario, seed, device),
    )
    if scenario.has_indexer:
        act.index_k = activation(tokens, preset.index_head_dim)
        act.index_weight = randn(preset.index_head_dim, scale=0.1, shift=1.0)
        act.index_bias = randn(preset.index_head_dim, scale=0.1)

    if scenario.values == "zero-rows":
        act.q_c, act.kv_c = zero_rows(act.q_c), zero_rows(act.kv_c)
        if act.index_k is not None:
            act.index_k = zero_rows(act.index_k)
    elif scenario.values == "fp8-saturating":
        act.kv_weight = (act.kv_weight.float() * FP8_SATURATION_GAIN).to(dtype)
        act.k_pe = (act.k_pe.float() * FP8_SATURATION_GAIN).to(dtype)
    elif scenario.values == "exact-ties":
        act.q_c = tie_rows(tokens, preset.q_lora_rank, gen).to(dtype)
        act.q_weight = tie_weight(preset.q_lora_rank, dtype, gen).to(dtype)
        act.kv_c = tie_rows(tokens, preset.kv_lora_rank, gen).to(dtype)
        act.kv_weight = tie_weight(preset.kv_lora_rank, dtype, gen).to(dtype)
        k_pe = torch.randint(
            -TIE_K_PE_MAX, TIE_K_PE_MAX + 1, (tokens, preset.rope_dim), generator=gen
        )
        act.k_pe = k_pe.to(dtype)
        if act.index_k is not None:
            act.index_k = tie_rows(tokens, preset.index_head_dim, gen).to(dtype)
            act.index_weight = tie_weight(preset.index_head_dim, dtype, gen).float()
            act.index_bias = torch.zeros(preset.index_head_dim)
    elif scenario.values == "below-floor":
        act.q_c, act.kv_c = below_floor_rows(act.q_c), below_floor_rows(act.kv_c)
        if act.index_k is not None:
            act.index_k = below_floor_rows(act.index_k)
            act.index_weight = act.index_weight * BELOW_FLOOR_INDEX_WEIGHT_GAIN
            act.index_bias = act.index_bias * BELOW_FLOOR_INDEX_BIAS_GAIN

    act = Activations(
        **{name: None if value is None else value.to(device) for name, value in vars(act).items()}
    )  # the regimes' CPU-drawn values (and the positions) move; the rest is there already
    if scenario.activation_rows == "fused":
        fused = fuse_inputs(
            {name: getattr(act, name) for name in ("q_c", "kv_c", "k_pe", "index_k")},
            preset,
            lambda rows, columns: randn(rows, columns),
        )
        act = replace(act, **fused)
    return act


def ds_mla_scale_of(scenario: Scenario) -> DsMlaScale:
    """The fp8_ds_mla tile-scale rule a case of ``scenario`` demands: its own, else the op
    document's default ``amax`` (module docstring: the runner resolves the rule before this)."""
    return DsMlaScale.AMAX if scenario.ds_mla_scale is None else scenario.ds_mla_scale


def scenario_inputs(scenario: Scenario, act: Activations) -> FusedOpInputs:
    """The op's inputs for ``scenario``'s activations, before any slot mapping: what every
    rank's launch shares (``build_case`` adds each rank's mappings), and all the oracle
    reads (:func:`oracle_for`)."""
    return FusedOpInputs(
        q_c=act.q_c,
        q_weight=act.q_weight,
        kv_c=act.kv_c,
        kv_weight=act.kv_weight,
        k_pe=act.k_pe,
        positions=act.positions,
        cos_sin=act.cos_sin,
        eps=scenario.model.eps,
        block_size=scenario.block_size,
        cache_layout=scenario.cache_layout,
        mla_scale=scenario.mla_scale,
        slot_mapping=None,
        index_k=act.index_k,
        index_weight=act.index_weight,
        index_bias=act.index_bias,
        index_rope_interleaved=scenario.model.index_rope_interleaved,
        index_slot_mapping=None,
        ds_mla_scale=ds_mla_scale_of(scenario),
        index_format=scenario.index_format,
        block_gap=scenario.block_gap,
    )


def oracle_for(inputs: FusedOpInputs) -> reference.FusedReference:
    """The oracle's answer for one launch's inputs (the kernel protocol's view): the one
    place dcpcheck calls ``reference.fused_norm_rope``. Slot mappings play no part: the
    oracle's outputs and cache entries are per token, whichever rank owns it."""
    return reference.fused_norm_rope(
        inputs.q_c,
        inputs.q_weight,
        inputs.kv_c,
        inputs.kv_weight,
        inputs.k_pe,
        inputs.positions,
        inputs.cos_sin,
        inputs.eps,
        cache_layout=inputs.cache_layout.value,
        mla_scale=inputs.mla_scale,
        ds_mla_scale=DsMlaScale(inputs.ds_mla_scale).value,  # an external caller's "pow2" too
        nvfp4_scale=reference.NVFP4_SCALE_DIV,  # the op document's amax / 6 (module docstring)
        index_k=inputs.index_k,
        index_weight=inputs.index_weight,
        index_bias=inputs.index_bias,
        index_rope_interleaved=inputs.index_rope_interleaved,
    )


PREFIX_STREAMS = range(100, 103)
"""``seeded`` streams of the prefix values, past the activations' (``make_activations``)."""

PREFIX_DISTINCT_ROWS = 256
"""Distinct value rows of a cached prefix, repeated along it. A prefix entry only has to be
a real encoding that the kernel must leave alone (any change to its bytes is reported), not
a value of its own; drawing every row cost more than the kernel in prefix-heavy cases."""


def _prefix_values(scenario: Scenario, seed: int, device) -> dict[str, torch.Tensor]:
    """Plausible fp32 values for the cached prefix, so pre-written entries are real
    encodings (``PREFIX_DISTINCT_ROWS``). A long prefix is the largest draw of a small case
    (thousands of tokens cached, a few computed), which is why it is drawn once per
    scenario, not per case."""
    p, count = scenario.model, scenario.batch.num_prefix_tokens
    widths = {"prefix_kv": p.kv_lora_rank, "prefix_kpe": p.rope_dim,
              "prefix_index": p.index_head_dim}  # fmt: skip
    rows = torch.arange(count, device=device) % PREFIX_DISTINCT_ROWS
    return {
        name: seeded.normal(seed, stream, (min(count, PREFIX_DISTINCT_ROWS), width), device)[rows]
        for stream, (name, width) in zip(PREFIX_STREAMS, widths.items(), strict=True)
    }


def _storage_slots(per_rank: torch.Tensor, storages: torch.Size, device) -> torch.Tensor:
    """Every rank's slots ``per_rank`` ``[R, P]`` as slots of all ranks' storages laid end to
    end (``[R, GUARD + blocks + GUARD, B, E]`` read as one cache), flattened rank by rank;
    -1 stays -1. Rank r's slot s lies ``(r * (blocks + 2 GUARD) + GUARD) * B`` further on."""
    ranks, blocks, block_size = storages[0], storages[1], storages[2]
    per_rank = per_rank.to(device)
    first = (torch.arange(ranks, device=device) * blocks + GUARD_BLOCKS) * block_size
    return torch.where(per_rank >= 0, per_rank + first.unsqueeze(1), -1).flatten()


ROW_ALIGNMENT_BYTES = 16
"""Where each rank's slot mapping starts, as a row of one device tensor: Triton compiles a
separate binary for a pointer argument not divisible by 16 bytes, so rows of an odd number
of int64 slots packed end to end would compile every scenario twice (one binary for the
aligned ranks, one for the others; ``benchmarks/kernel_specializations.py``). In
production each rank's mapping is its own allocation, aligned."""


def _rank_rows(per_rank: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``per_rank`` ``[R, T]`` on ``device``, in one allocation whose rows each start on a
    ``ROW_ALIGNMENT_BYTES`` boundary (the row stride padded; the padding is never read)."""
    ranks, tokens = per_rank.shape
    per_row = ROW_ALIGNMENT_BYTES // per_rank.element_size()
    padded = torch.empty(
        (ranks, -(-max(tokens, 1) // per_row) * per_row), dtype=per_rank.dtype, device=device
    )
    rows = padded[:, :tokens]
    rows.copy_(per_rank)
    return rows


def prefix_mla_entries(scenario: Scenario, act: Activations) -> torch.Tensor:
    """The MLA cache entries of the cached-prefix tokens (``[P, entry bytes]`` uint8, in
    ``SlotMappings.prefix_*`` order), as the harness pre-writes them (module docstring)."""
    return reference.encode_mla_entries(
        act.prefix_kv,
        act.prefix_kpe,
        scenario.cache_layout.value,
        scenario.torch_dtype,
        scenario.mla_scale,
        ds_mla_scale=ds_mla_scale_of(scenario).value,
        nvfp4_scale=reference.NVFP4_SCALE_DIV,
    )


def build_case(
    scenario: Scenario,
    dcp_size: int,
    device: torch.device,
    *,
    seed: int | None = None,
    activations: Activations | None = None,
    expected: reference.FusedReference | None = None,
) -> Case:
    """Lay out ``scenario`` at ``dcp_size``: mappings, poisoned outputs, guarded caches.

    ``activations`` and ``expected`` may be passed in to share them between DCP sizes.
    """
    seed = scenario.seed if seed is None else seed
    preset, dtype, batch = scenario.model, scenario.torch_dtype, scenario.batch
    act = activations or make_activations(scenario, seed, device)
    shared = scenario_inputs(scenario, act)
    ref = expected or oracle_for(shared)

    tables = scenario.block_tables(dcp_size)
    mappings = slot_mappings(batch, scenario.layout(dcp_size), tables)
    mla_blocks = num_blocks(tables)

    index_mappings, index_blocks = None, 0
    if scenario.indexer == "sharded":
        index_mappings, index_blocks = mappings, mla_blocks
    elif scenario.indexer == "replicated":
        global_tables = scenario.block_tables(1)
        global_map = slot_mappings(batch, scenario.layout(1), global_tables)
        # Replicated: every rank holds every token under its global slot.
        index_mappings = replace(
            global_map,
            per_rank=global_map.per_rank.expand(dcp_size, -1).clone(),
            prefix_per_rank=global_map.prefix_per_rank.expand(dcp_size, -1).clone(),
        )
        index_blocks = num_blocks(global_tables)

    mla_bytes = mla_entry_bytes(scenario.cache_layout, preset.kv_lora_rank, preset.rope_dim, dtype)
    idx_bytes = index_entry_bytes(preset.index_head_dim)
    case_seed = seed * 1_000_003 + dcp_size
    storage_gen = torch.Generator(device=device).manual_seed(case_seed)
    prefix_entries = prefix_mla_entries(scenario, act)
    prefix_index_values, prefix_index_scales = reference.encode_index_entries(act.prefix_index)

    gap = scenario.block_gap
    mla_backing, mla_storages = random_storages(
        dcp_size, mla_blocks, scenario.block_size, mla_bytes, gap, storage_gen
    )
    index_storages = None
    if index_mappings is not None:
        index_backing, index_storages = random_storages(
            dcp_size, index_blocks, scenario.block_size, idx_bytes, gap, storage_gen
        )
    # Every rank's cached prefix, in one write per cache, before the initial bytes are copied.
    mla_storages.copy_(
        reference.write_mla_cache(
            mla_storages.flatten(0, 1),
            _storage_slots(mappings.prefix_per_rank, mla_storages.shape, device),
            prefix_entries.repeat(dcp_size, 1),
        ).view_as(mla_storages)
    )
    if index_storages is not None:
        index_storages.copy_(
            reference.write_index_cache(
                index_storages.flatten(0, 1),
                _storage_slots(index_mappings.prefix_per_rank, index_storages.shape, device),
                prefix_index_values.repeat(dcp_size, 1),
                prefix_index_scales.repeat(dcp_size),
                shuffled=scenario.index_format.shuffled,
                scale_format=scenario.index_format.scale.value,
            ).view_as(index_storages)
        )
    mla_caches = guarded_caches(mla_backing, mla_storages)
    index_caches = None
    if index_storages is not None:
        index_caches = guarded_caches(index_backing, index_storages)
    outputs = poisoned_outputs(scenario, device, dcp_size)

    # Each mapping crosses to the device once, for all ranks (a rank's is a row of it).
    slots, prefix_slots = _rank_rows(mappings.per_rank, device), mappings.prefix_per_rank.to(device)
    index_slots = index_prefix_slots = None
    if index_mappings is not None:
        index_slots = _rank_rows(index_mappings.per_rank, device)
        index_prefix_slots = index_mappings.prefix_per_rank.to(device)
    ranks = []
    for rank in range(dcp_size):
        launched_slots = {"slot_mapping": None, "index_slot_mapping": None}
        if not scenario.profiling:
            launched_slots["slot_mapping"] = slots[rank]
            if index_slots is not None:
                launched_slots["index_slot_mapping"] = index_slots[rank]
        ranks.append(
            RankLaunch(
                rank=rank,
                inputs=replace(shared, **launched_slots),
                outputs=FusedOpOutputs(
                    **{name: guarded.view for name, guarded in outputs[rank].items()}
                ),
                mla=mla_caches[rank],
                index=None if index_caches is None else index_caches[rank],
                prefix_slots=prefix_slots[rank],
                index_prefix_slots=None if index_prefix_slots is None else index_prefix_slots[rank],
                output_guards=outputs[rank],
            )
        )
    return Case(scenario, dcp_size, mappings, index_mappings, act, ref, ranks)


def _guarded(
    ranks: int, width: int, dtype: torch.dtype, tokens: int, device, row_stride: int
) -> list[GuardedOutput]:
    """One poisoned output per rank (``POISON_BITS``; top-k: ``TOPK_SENTINEL``) inside
    guard rows ``row_stride`` wide, the ranks' storages side by side in one tensor (filled
    in one pass, and compared in one by ``fused_checks``)."""
    rows = tokens + 2 * OUTPUT_GUARD_ROWS
    storage = torch.empty((ranks, rows, row_stride), dtype=dtype, device=device)
    storage.view(torch.uint8).fill_(OUTPUT_GUARD_BYTE)
    inner = storage[:, OUTPUT_GUARD_ROWS : rows - OUTPUT_GUARD_ROWS, :width]
    if dtype in POISON_BITS:
        fill_poison(inner)
    else:
        inner.fill_(TOPK_SENTINEL)
    return [GuardedOutput(storage[rank], width) for rank in range(ranks)]


def poisoned_outputs(
    scenario: Scenario, device: torch.device, ranks: int = 1
) -> list[dict[str, GuardedOutput]]:
    """Outputs a kernel must overwrite, per rank and by ``FusedOpOutputs`` field
    (``index_k_out`` only on indexer layers): the NaN poison everywhere, top-k at
    ``TOPK_SENTINEL``, inside guard rows."""
    p, dtype, tokens = scenario.model, scenario.torch_dtype, scenario.batch.num_tokens
    widths = {
        "q_out": (p.q_lora_rank, dtype),
        "kv_out": (p.kv_lora_rank, dtype),
        "kpe_out": (p.rope_dim, dtype),
        "topk_indices": (p.topk, torch.int32),
    }
    if scenario.has_indexer:
        widths["index_k_out"] = (p.index_head_dim, dtype)
    strides = output_row_strides(p, tokens) if scenario.activation_rows == "fused" else {}
    by_field = {
        name: _guarded(ranks, width, kind, tokens, device, strides.get(name, width))
        for name, (width, kind) in widths.items()
    }
    return [{name: by_field[name][rank] for name in widths} for rank in range(ranks)]
