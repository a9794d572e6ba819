"""Adapter for vLLM's fused MLA norm + RoPE + cache-write op, ``fused_norm_rope``
(``vllm/models/deepseek_v32/common/kernels.py``), in every API shape it has had, called
the way vLLM's own caller of that shape calls it.

Every shape takes, by keyword: ``positions`` [T] int64; ``q_c``/``kv_c``/``k_pe`` with
their RMSNorm weights and one eps each; ``k_rope_cos_sin_cache`` [max_pos, R] whose row
``p`` is ``[cos | sin]`` (the harness's table, docs/fused-norm-rope.md) and the same table again as
``index_k_rope_cos_sin_cache`` (the indexer rotates its first R lanes); the indexer's
``index_k`` with its LayerNorm weight, bias (fp32) and eps; ``topk_indices_buffer``
[T, topk] int32; ``mla_kv_cache`` [num_blocks, B, entry] with ``mla_kv_cache_dtype``
``auto`` / ``fp8`` / ``fp8_ds_mla`` (the harness's CacheLayout values) and
``mla_k_scale``, a one-element fp32 tensor; ``indexer_k_cache`` [num_blocks, B, I + 4]
bytes; ``has_indexer``, ``index_rope_interleave``; and ``q_c_out`` for Q.

The shapes (:class:`ApiShape`), and what vLLM's caller (``vllm/models/deepseek_v32/
attention.py`` of the same release) passes to each:

* **Q output only** (released in 0.25.0 - 0.28.0): Q goes to ``q_c_out``, the normalized
  KV and the rotated k_pe only to the MLA cache; one ``slot_mapping`` serves both caches.
  There is no buffer for the KV, k_pe or indexer-K outputs, so those contract items are
  declared limitations.
* **In place** (vLLM's git history at 01b9c661, the golden vectors' commit):
  ``write_kv_output=True`` stores the normalized KV into ``kv_c`` and the rotated k_pe
  into ``k_pe``; the indexer has its own ``indexer_slot_mapping``; index K has no output.
* **Separate outputs** (released 0.29.0 on, after PR 54908): ``kv_c_out``/``k_pe_out``
  buffers, which the caller always passes, and ``index_k_out``, which it passes only on
  its prefill-context-parallel path - the one that gives the kernel no slot mapping and no
  cache. With a slot mapping the caller does not ask for index K, so neither does the
  adapter (:data:`INDEX_K_OUT_NOT_REQUESTED`); without one (the harness's profiling call)
  it does, and index K is checked there. Later releases add optional parameters, each
  passed as that release's caller passes it: ``indexer_slot_mapping`` (0.30.0; the
  indexer's own mapping - before it, one ``slot_mapping`` serves both caches),
  ``indexer_cache_shuffled`` (0.31.0; the case's indexer format: vLLM's caller passes what
  its cache's reader wants) and ``skip_scale`` (0.33.0; true when the per-tensor scale is
  1.0). MX-packed indexer scales (0.33.0) are no parameter: the file asks
  ``mqa_logits_use_mx_scales()``, whose stand-in answers for the case
  (``shims/vllm/mx_scales.py``). The nvfp4_ds_mla layout (0.30.0 on) is a value of
  ``mla_kv_cache_dtype``; the file converts to e2m1 by inline PTX that only sm_100 and
  newer execute, so elsewhere such a case is not applicable (:meth:`not_applicable`).

An indexer mapping that stores a token on other ranks than the MLA mapping does (an indexer
cache kept whole beside a sharded MLA cache) is one no caller of 0.30.0 - 0.34.0 passes
(``indexer_groups``, with each release's lines): a case that asks it of a kernel loaded as
``vllm==X`` is not applicable there, with those lines. So is a cache whose blocks lie apart
for 0.25.0 - 0.28.0, whose callers never pass one (``block_gaps``). The same file named by
its path has no release's callers and is judged on either.

Cache views: for ``auto`` the kernel stores KV and k_pe as elements, so the MLA cache is
the harness's bytes viewed in the activation dtype ([.., KV + R] elements); for the fp8
layouts vLLM's wrapper itself views a uint8 cache as fp8 (and, for ``fp8_ds_mla``, as
fp32 and bf16 at byte strides), so the bytes go as they are. Every view shares the
harness's memory, so the kernel's cache writes land where the checks read them.

A profiling call (no slot mapping) passes no caches, as the caller does when it has no
attention metadata: every wrapper insists on a slot mapping whenever a cache is given.
"""

from __future__ import annotations

import ast
import enum
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dcpcheck.adapters.protocol import AdapterError, Limitation
from dcpcheck.adapters.shims.vllm.mx_switch import MX_SCALES_WANTED
from dcpcheck.ops.fused_norm_rope import block_gaps, indexer_groups
from dcpcheck.ops.fused_norm_rope.contract import (
    CacheLayout,
    DsMlaScale,
    FusedOpCaches,
    FusedOpInputs,
    FusedOpOutputs,
    IndexScale,
)


class ApiShape(enum.Enum):
    """The known signatures of vLLM's ``fused_norm_rope``."""

    Q_OUTPUT_ONLY = "Q output only (q_c_out); K to the caches alone"
    IN_PLACE = "in-place kv_c/k_pe outputs (write_kv_output)"
    SEPARATE_OUTPUTS = "separate kv_c_out/k_pe_out/index_k_out outputs"


COMMON_PARAMETERS = (
    "positions",
    "q_c",
    "q_rms_norm_w",
    "q_rms_eps",
    "kv_c",
    "kv_rms_norm_w",
    "kv_rms_eps",
    "k_pe",
    "k_rope_cos_sin_cache",
    "index_k",
    "index_k_layer_norm_w",
    "index_k_layer_norm_bias",
    "index_k_layer_norm_eps",
    "index_k_rope_cos_sin_cache",
    "topk_indices_buffer",
    "slot_mapping",
    "indexer_k_cache",
    "mla_kv_cache",
    "mla_kv_cache_dtype",
    "mla_k_scale",
    "has_indexer",
    "index_rope_interleave",
    "q_c_out",
)
"""Parameters every known shape has (vLLM names, passed by keyword); alone, they are the
Q-output-only shape of 0.25.0 - 0.28.0."""

SHAPE_PARAMETERS: dict[ApiShape, tuple[str, ...]] = {
    ApiShape.IN_PLACE: ("indexer_slot_mapping", "write_kv_output"),
    ApiShape.SEPARATE_OUTPUTS: ("kv_c_out", "k_pe_out", "index_k_out"),
}
"""The parameters that mark a shape beyond the common ones."""

INDEXER_SLOT_MAPPING = "indexer_slot_mapping"
INDEXER_CACHE_SHUFFLED = "indexer_cache_shuffled"
SKIP_SCALE = "skip_scale"
OPTIONAL_PARAMETERS = (INDEXER_SLOT_MAPPING, INDEXER_CACHE_SHUFFLED, SKIP_SCALE)
"""Parameters later releases of the separate-outputs shape added, passed where present."""

NO_KV_OUTPUTS = Limitation(
    ("outputs", "ranks_agree"),
    "kv_out",
    "vLLM's Q-output-only fused_norm_rope API (0.25.0 - 0.28.0) has no buffer for the "
    "normalized KV: it goes to the MLA cache alone",
)
NO_KPE_OUTPUT = Limitation(
    ("outputs", "ranks_agree"),
    "kpe_out",
    "vLLM's Q-output-only fused_norm_rope API (0.25.0 - 0.28.0) has no buffer for the "
    "rotated k_pe: it goes to the MLA cache alone",
)
NO_INDEX_K_OUTPUT = Limitation(
    ("outputs", "ranks_agree"),
    "index_k_out",
    "this vLLM fused_norm_rope API (in-place write_kv_output, or Q output only) has no "
    "indexer-K output buffer",
)
NO_OUTPUTS_WITHOUT_SLOTS = Limitation(
    ("outputs", "ranks_agree"),
    "q_out",
    "vLLM's Q-output-only fused_norm_rope API (0.25.0 - 0.28.0) defines a call without "
    "caches as a memory-profiling run whose rows are all padding (its wrapper sets every "
    "slot to -1), so it cannot ask for outputs without a slot mapping",
)
INDEX_K_OUT_NOT_REQUESTED = Limitation(
    ("outputs", "ranks_agree"),
    "index_k_out",
    "vLLM's caller passes index_k_out only on its prefill-context-parallel path, which gives "
    "no slot mapping (deepseek_v32/attention.py, 0.29.0 on); with a slot mapping the indexer "
    "K goes to its cache alone and the kernel is not asked for it",
)
INDEX_CACHE_CHECKS = (
    "cache_owned",
    "cache_foreign",
    "prefix_intact",
    "padding_inert",
    "guard_bands",
    "shards_reassemble",
)
"""Every check that reads the indexer cache."""

ONE_SLOT_MAPPING = Limitation(
    INDEX_CACHE_CHECKS,
    "index_cache",
    "this vLLM fused_norm_rope API (before 0.30.0) takes one slot_mapping for both caches, "
    "so it writes the indexer cache at the MLA cache's slots and cannot follow the indexer's "
    "own (here replicated) slot mapping",
)


NO_SHUFFLED_LAYOUT = Limitation(
    INDEX_CACHE_CHECKS,
    "index_cache",
    "this vLLM fused_norm_rope API (before 0.31.0) has no indexer_cache_shuffled parameter: "
    "it writes the indexer cache's values token-major only, so a shuffled cache cannot be "
    "asked of it",
)
NO_MX_SCALES = Limitation(
    INDEX_CACHE_CHECKS,
    "index_cache",
    "this vLLM kernel file (before 0.33.0) never asks mqa_logits_use_mx_scales: it writes "
    "every indexer scale as an fp32, so MX-packed scales cannot be asked of it",
)

PTX_E2M1 = "cvt.rn.satfinite.e2m1x2.f32"
"""The PTX instruction vLLM's nvfp4_ds_mla path (0.30.0 on) converts NoPE pairs to e2m1
with, by inline assembly: sm_100 and newer have it; the H200 (sm_90) does not, and
Triton's interpreter runs no inline assembly at all."""

E2M1_PTX_CAPABILITY = (10, 0)
"""The oldest compute capability with ``PTX_E2M1``."""


class Nvfp4Path(enum.Enum):
    """How a vLLM kernel file writes the nvfp4_ds_mla MLA cache, read from the file."""

    ABSENT = "the file never names nvfp4_ds_mla"
    PTX_E2M1 = f"e2m1 by inline PTX ({PTX_E2M1})"
    OTHER = "a conversion dcpcheck does not recognise (run as it is)"


def _module_source(function: Callable[..., object]) -> str:
    """The source of ``function``'s module ("" where it cannot be read)."""
    module = inspect.getmodule(function)
    try:
        return inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):
        return ""


def nvfp4_path(function: Callable[..., object]) -> Nvfp4Path:
    """Whether and how ``function``'s module writes nvfp4_ds_mla, from its source text: the
    signature cannot say (the layout is a value of ``mla_kv_cache_dtype``), the file can."""
    source = _module_source(function)
    if '"nvfp4_ds_mla"' not in source:
        return Nvfp4Path.ABSENT
    return Nvfp4Path.PTX_E2M1 if PTX_E2M1 in source else Nvfp4Path.OTHER


TILE_SCALE_NAME = "tile_scale"
"""The variable every vLLM kernel file (0.27.0 on) computes an fp8_ds_mla NoPE tile's scale
in, before it divides the tile by it and stores it."""

POW2_CALLS = ("exp2", "ceil", "log2")
"""``exp2(ceil(log2(x)))``: the call chain that rounds a scale up to a power of two."""


def _rounds_to_pow2(node: ast.AST) -> bool:
    """Whether ``node`` holds ``exp2(ceil(log2(...)))`` (any module prefix, ``tl.math.``)."""
    for call in ast.walk(node):
        chain = []
        while isinstance(call, ast.Call) and call.args:
            func = call.func
            chain.append(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
            call = call.args[0]
        if tuple(chain[:3]) == POW2_CALLS:
            return True
    return False


def tile_scale_rule(function: Callable[..., object]) -> DsMlaScale | None:
    """The fp8_ds_mla tile-scale rule ``function``'s file writes, read from its source, so a
    file is judged by what it is, whether named as a release or by path: ``pow2`` where an
    assignment to :data:`TILE_SCALE_NAME` rounds it up to a power of two (vLLM 0.31.0 on),
    ``amax`` where it is assigned otherwise (``max(amax * (1/448), FLT_MIN)``, up to 0.30.0),
    None where the file computes no such scale or cannot be read (the case's rule, else
    the op document's ``amax``, then applies; a finding whose scales follow the other rule says
    so)."""
    try:
        tree = ast.parse(_module_source(function))
    except SyntaxError:
        return None
    values = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == TILE_SCALE_NAME for t in node.targets)
    ]
    if not values:
        return None
    return DsMlaScale.POW2 if any(map(_rounds_to_pow2, values)) else DsMlaScale.AMAX


def asks_for_mx_scales(function: Callable[..., object]) -> bool:
    """Whether ``function``'s module asks ``mqa_logits_use_mx_scales`` (vLLM 0.33.0 on)."""
    return "mqa_logits_use_mx_scales" in getattr(function, "__globals__", {})


def _parameters(function: Callable[..., object]) -> set[str] | None:
    try:
        return set(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None


def api_shape(function: Callable[..., object]) -> ApiShape | None:
    """The known vLLM shape ``function``'s signature has, or None (none, or ambiguous)."""
    names = _parameters(function)
    if names is None or not names.issuperset(COMMON_PARAMETERS):
        return None
    shapes = [shape for shape, extra in SHAPE_PARAMETERS.items() if names.issuperset(extra)]
    if len(shapes) > 1:
        return None
    if shapes:
        return shapes[0]
    marks = {name for extra in SHAPE_PARAMETERS.values() for name in extra}
    return None if names & marks else ApiShape.Q_OUTPUT_ONLY


def signature_text(function: Callable[..., object]) -> str:
    """``function``'s signature in one line, for error messages."""
    try:
        return f"{getattr(function, '__name__', 'callable')}{inspect.signature(function)}"
    except (TypeError, ValueError):
        return repr(function)


def _mla_cache_view(cache: torch.Tensor, inputs: FusedOpInputs) -> torch.Tensor:
    """The MLA cache as the kernel addresses it (module docstring): same memory."""
    if inputs.cache_layout is CacheLayout.AUTO:
        return cache.view(inputs.kv_c.dtype)
    return cache


def _copy_with_strides(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` in fresh memory with its strides (``clone`` would make a column
    slice of several rows compact)."""
    copy = torch.empty_strided(
        tensor.shape, tensor.stride(), dtype=tensor.dtype, device=tensor.device
    )
    return copy.copy_(tensor)


def _owners_differ(inputs: FusedOpInputs) -> bool:
    """Whether the indexer's mapping stores some token on this rank where the MLA mapping
    does not, or the other way round (a replicated indexer beside a sharded MLA cache)."""
    if not inputs.has_indexer or inputs.slot_mapping is None or inputs.index_slot_mapping is None:
        return False
    return not torch.equal(inputs.slot_mapping >= 0, inputs.index_slot_mapping >= 0)


def _one_mapping_serves_both(inputs: FusedOpInputs) -> bool:
    """Whether the indexer's slots are the MLA cache's (a sharded indexer), so a single
    ``slot_mapping`` can address both caches."""
    if inputs.slot_mapping is None or inputs.index_slot_mapping is None:
        return True
    return torch.equal(inputs.slot_mapping, inputs.index_slot_mapping)


@dataclass(frozen=True)
class VllmFusedNormRope:
    """vLLM's ``fused_norm_rope`` in one of its :class:`ApiShape` s, as a protocol kernel.

    ``optional`` holds the :data:`OPTIONAL_PARAMETERS` its signature has. ``ds_mla_scale``
    is the fp8_ds_mla tile-scale rule its file writes (:func:`tile_scale_rule`), else None.
    ``release`` is the vLLM version it was loaded as (``vllm==X``), whose callers
    ``indexer_groups`` describes; None for a file named by its path.
    """

    function: Callable[..., object]
    shape: ApiShape
    optional: frozenset[str] = frozenset()
    name: str = "vllm"
    ds_mla_scale: DsMlaScale | None = None
    nvfp4: Nvfp4Path = Nvfp4Path.ABSENT
    mx_scales: bool = False  # asks_for_mx_scales
    release: str | None = None

    @property
    def writes_k_outputs(self) -> bool:
        """False for the Q-output-only shape: K goes to the caches alone (the token-stream
        model then reads the prefill's K from the caches, dcpcheck.e2e.token_streams)."""
        return self.shape is not ApiShape.Q_OUTPUT_ONLY

    @property
    def own_indexer_mapping(self) -> bool:
        """Whether the API takes the indexer's own slot mapping."""
        return self.shape is ApiShape.IN_PLACE or INDEXER_SLOT_MAPPING in self.optional

    def not_applicable(self, inputs: FusedOpInputs) -> str | None:
        """Why this kernel cannot run a case of ``inputs`` here: an nvfp4_ds_mla cache the
        file has no path for, or whose e2m1 conversion this machine cannot execute; for a
        release, an indexer mapping whose ranks differ from the MLA mapping's, which its
        callers never pass (``indexer_groups``), or caches whose blocks lie apart, which the
        callers of releases before 0.29.0 never pass (``block_gaps``)."""
        if self.release is not None and self.own_indexer_mapping and _owners_differ(inputs):
            never = indexer_groups.apart_never_passed(self.release)
            if never is not None:
                return never
        if self.release is not None and inputs.block_gap:
            never = block_gaps.apart_never_passed(self.release)
            if never is not None:
                return never
        if inputs.cache_layout is not CacheLayout.NVFP4_DS_MLA or self.nvfp4 is Nvfp4Path.OTHER:
            return None  # a conversion not recognised is run, and judged
        if self.nvfp4 is Nvfp4Path.ABSENT:
            return f"nvfp4_ds_mla: {self.nvfp4.value}"
        device = inputs.kv_c.device
        if device.type != "cuda":
            return (
                f"nvfp4_ds_mla: the kernel converts to e2m1 by inline PTX ({PTX_E2M1}), "
                "which Triton's interpreter cannot run"
            )
        capability = torch.cuda.get_device_capability(device)
        if capability < E2M1_PTX_CAPABILITY:
            return (
                f"not applicable on this GPU: nvfp4_ds_mla needs {PTX_E2M1}, an instruction "
                f"of sm_100 and newer; this GPU is sm_{capability[0]}{capability[1]}"
            )
        return None

    def limitations(self, inputs: FusedOpInputs) -> tuple[Limitation, ...]:
        found: list[Limitation] = []
        if self.shape is ApiShape.Q_OUTPUT_ONLY:
            found += [NO_KV_OUTPUTS, NO_KPE_OUTPUT]
            if inputs.slot_mapping is None:
                found.append(NO_OUTPUTS_WITHOUT_SLOTS)
        if not inputs.has_indexer:
            return tuple(found)
        if self.shape is ApiShape.SEPARATE_OUTPUTS:
            if inputs.slot_mapping is not None:
                found.append(INDEX_K_OUT_NOT_REQUESTED)
        else:
            found.append(NO_INDEX_K_OUTPUT)
        if not self.own_indexer_mapping and not _one_mapping_serves_both(inputs):
            found.append(ONE_SLOT_MAPPING)
        if inputs.index_format.shuffled and INDEXER_CACHE_SHUFFLED not in self.optional:
            found.append(NO_SHUFFLED_LAYOUT)
        if inputs.index_format.scale is IndexScale.MX and not self.mx_scales:
            found.append(NO_MX_SCALES)
        return tuple(found)

    def _arguments(
        self, inputs: FusedOpInputs, outputs: FusedOpOutputs, caches: FusedOpCaches
    ) -> dict[str, Any]:
        """What the caller of this shape passes, for every parameter the shapes share and
        the optional ones this signature has."""
        profiling = inputs.slot_mapping is None
        # The caller passes its layer's k_scale (1.0 unless the fp8 cache is calibrated)
        # whenever it passes a cache.
        k_scale = 1.0 if inputs.mla_scale is None else inputs.mla_scale
        mla_scale = None
        if not profiling:
            mla_scale = torch.tensor([k_scale], dtype=torch.float32, device=inputs.kv_c.device)
        # With one slot mapping for both caches the indexer cache still goes, as the caller
        # passes it on every indexer layer: 0.28.0's wrapper, given none, keeps the slot
        # mapping and stores the indexer rows into a zero-size placeholder. Where the
        # indexer's own mapping differs, its checks are skipped (ONE_SLOT_MAPPING).
        index_cache = None if profiling else caches.index
        arguments = {
            "positions": inputs.positions,
            "q_c": inputs.q_c,
            "q_rms_norm_w": inputs.q_weight,
            "q_rms_eps": inputs.eps,
            "kv_rms_norm_w": inputs.kv_weight,
            "kv_rms_eps": inputs.eps,
            "k_rope_cos_sin_cache": inputs.cos_sin,
            "index_k": inputs.index_k,
            "index_k_layer_norm_w": inputs.index_weight,
            "index_k_layer_norm_bias": inputs.index_bias,
            "index_k_layer_norm_eps": inputs.eps,
            "index_k_rope_cos_sin_cache": inputs.cos_sin if inputs.has_indexer else None,
            "topk_indices_buffer": outputs.topk_indices,
            "slot_mapping": inputs.slot_mapping,
            "indexer_k_cache": index_cache,
            "mla_kv_cache": None if profiling else _mla_cache_view(caches.mla, inputs),
            "mla_kv_cache_dtype": inputs.cache_layout.value,
            "mla_k_scale": mla_scale,
            "has_indexer": inputs.has_indexer,
            "index_rope_interleave": inputs.index_rope_interleaved,
            "q_c_out": outputs.q_out,
        }
        if self.own_indexer_mapping:
            arguments[INDEXER_SLOT_MAPPING] = inputs.index_slot_mapping
        if INDEXER_CACHE_SHUFFLED in self.optional:
            arguments[INDEXER_CACHE_SHUFFLED] = inputs.index_format.shuffled
        if SKIP_SCALE in self.optional:
            arguments[SKIP_SCALE] = k_scale == 1.0
        return arguments

    def __call__(
        self, inputs: FusedOpInputs, outputs: FusedOpOutputs, caches: FusedOpCaches
    ) -> None:
        wants_mx = inputs.has_indexer and inputs.index_format.scale is IndexScale.MX
        token = MX_SCALES_WANTED.set(wants_mx)  # the release asks its stand-in (mx_scales)
        try:
            self._call(inputs, outputs, caches)
        finally:
            MX_SCALES_WANTED.reset(token)

    def _call(self, inputs: FusedOpInputs, outputs: FusedOpOutputs, caches: FusedOpCaches):
        arguments = self._arguments(inputs, outputs, caches)
        if self.shape is ApiShape.Q_OUTPUT_ONLY:
            self.function(**arguments, kv_c=inputs.kv_c, k_pe=inputs.k_pe)
        elif self.shape is ApiShape.IN_PLACE:
            # The kernel overwrites kv_c and k_pe: hand it copies, never the harness's
            # inputs, laid out as the inputs are (the caller's are column slices of one
            # row, ``activation_rows``), and read the results back into the outputs.
            kv_c, k_pe = _copy_with_strides(inputs.kv_c), _copy_with_strides(inputs.k_pe)
            self.function(**arguments, kv_c=kv_c, k_pe=k_pe, write_kv_output=True)
            outputs.kv_out.copy_(kv_c)
            outputs.kpe_out.copy_(k_pe)
        else:
            requested = inputs.slot_mapping is None  # see INDEX_K_OUT_NOT_REQUESTED
            self.function(
                **arguments,
                kv_c=inputs.kv_c,
                k_pe=inputs.k_pe,
                kv_c_out=outputs.kv_out,
                k_pe_out=outputs.kpe_out,
                index_k_out=outputs.index_k_out if requested else None,
            )


def adapt(function: Callable[..., object]) -> VllmFusedNormRope:
    """``function`` (a vLLM ``fused_norm_rope``) as a protocol kernel, with what its file
    says and its signature cannot (:func:`tile_scale_rule`, :func:`nvfp4_path`)."""
    shape = api_shape(function)
    if shape is None:
        names = _parameters(function) or set()
        missing = [p for p in COMMON_PARAMETERS if p not in names]
        if missing:
            why = f"lacks {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}"
        else:
            shapes = " / ".join("+".join(extra) for extra in SHAPE_PARAMETERS.values())
            why = f"has parameters of more than one shape ({shapes})"
        raise AdapterError(f"not a known vLLM fused_norm_rope signature: it {why}")
    names = _parameters(function) or set()
    optional = frozenset(names & set(OPTIONAL_PARAMETERS))
    if shape is ApiShape.IN_PLACE:
        optional -= {INDEXER_SLOT_MAPPING}  # part of the shape itself
    return VllmFusedNormRope(
        function,
        shape,
        optional,
        ds_mla_scale=tile_scale_rule(function),
        nvfp4=nvfp4_path(function),
        mx_scales=asks_for_mx_scales(function),
    )
