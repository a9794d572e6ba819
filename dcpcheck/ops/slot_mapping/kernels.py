"""The kernels of the op dcpcheck can name (``Routines``: the slot mappings and the local
sequence lengths):

* ``default``: the project's two Triton kernels; ``mutant/NAME``: one of them with a bug;
* ``vllm==X.Y.Z``: every routine of the op a released vLLM has, fetched and cached by
  ``dcpcheck.kernels.releases`` (``EachRoutine``, a finding naming its routine): the GPU
  model runner's ``_compute_slot_mappings_kernel`` and ``_dcp_local_seq_lens_kernel``
  (``dcpcheck.ops.slot_mapping.vllm``), the V1 runner's ``BlockTable``
  (``compute_slot_mapping``, until 0.34.0 removed that runner) and the attention
  backends' ``get_dcp_local_seq_lens``, those of them the release has; in a release
  before the GPU model runner (0.10.2 - 0.11.2), the V1 runner's ``BlockTable`` and the
  local lengths its attention backends use: ``get_dcp_local_seq_lens``, or before it the
  MLA metadata builder's own statement (``dcpcheck.ops.slot_mapping.vllm_mla``);
  ``vllm==X.Y.Z:NAME`` one routine of it, or ``get_dcp_local_seq_lens`` (the attention
  backends' torch function), or ``compute_slot_mapping`` (the V1 runner's ``BlockTable``,
  ``dcpcheck.ops.slot_mapping.vllm_v1``);
* ``package.module:function`` or ``path/to/file.py:function``: a callable with the
  slot-mapping protocol, or a Triton kernel of vLLM's by its name there (a vLLM
  checkout's ``block_table.py:_compute_slot_mappings_kernel``).

Import only once the backend is chosen (it defines Triton kernels).
"""

from __future__ import annotations

import functools
from pathlib import Path

from dcpcheck.kernels import loading, releases
from dcpcheck.kernels.loading import JudgedFile, KernelLoadError
from dcpcheck.kernels.registry import OpKernels, adapted, described
from dcpcheck.op_registry import OPS, SLOT_MAPPING
from dcpcheck.ops.slot_mapping import every_rank, mutants, vllm, vllm_mla, vllm_v1
from dcpcheck.ops.slot_mapping import kernel as project_kernel
from dcpcheck.ops.slot_mapping.contract import EachRoutine, Routines
from dcpcheck.ops.slot_mapping.kernel import compute_local_seq_lens, compute_slot_mappings

SLOT_MAPPING_MEMBERS = OPS[SLOT_MAPPING].wheel_members
"""The op's files of a release, where its callers of the local-length function are read."""

ONE_ROUTINE = "{spec} names the {this} routine alone"
"""Why a spec naming one routine has the other's checks skipped."""


def _kept(version: str, member: str) -> Path:
    return releases.fetch(version, member).path


def _function(path: Path, name: str, where: str) -> object:
    target = getattr(loading.load_file(path), name, None)
    if target is None:
        raise KernelLoadError(f"{where}: {path} has no {name!r}")
    return target


def has_gpu_runner(version: str) -> bool:
    """Whether release ``version`` has the GPU model runner's slot kernel (fetched first:
    only its wheel can tell); a release's other errors as ``releases.fetch`` raises them."""
    try:
        _kept(version, vllm.MEMBER)
    except releases.ReleaseError as exc:
        if isinstance(exc, releases.CacheFault | releases.UnknownRelease):
            raise
        if not releases.lacks(version, vllm.MEMBER):
            raise
        return False
    return True


def lengths_member(version: str) -> str:
    """The wheel member a release without the GPU runner computes its local lengths in:
    the attention backends' utilities where they define ``get_dcp_local_seq_lens``, else
    the MLA metadata builder."""
    utilities = releases.fetch(version, vllm.SEQ_LENS_FUNCTION_MEMBER).source
    defined = f"def {vllm.SEQ_LENS_FUNCTION}(".encode()
    return vllm.SEQ_LENS_FUNCTION_MEMBER if defined in utilities else vllm.MLA_MEMBER


@functools.cache
def every_rank_callers(version: str) -> every_rank.EveryRankCallers:
    """The calls of release ``version``'s files of the op (those its wheel has) that ask
    the attention backends' function for every rank at once (``every_rank.every_rank_callers``;
    read once a process: a release's files are fixed by the lock, and both the load and
    the judged files ask)."""
    present = [m for m in SLOT_MAPPING_MEMBERS if not releases.lacks(version, m)]
    sources = {m: releases.fetch(version, m).source.decode() for m in present}
    return every_rank.every_rank_callers(sources)


def _lengths_function(version: str, name: str) -> vllm.VllmLocalSeqLens:
    """Release ``version``'s ``get_dcp_local_seq_lens``, asked as its callers ask it."""
    path = _kept(version, vllm.SEQ_LENS_FUNCTION_MEMBER)
    function = adapted(vllm.torch_function, path, vllm.SEQ_LENS_FUNCTION, name)
    callers = every_rank_callers(version)
    return adapted(vllm.VllmLocalSeqLens.of_function, function, name, callers)  # type: ignore[return-value]


def _v1_table(version: str, name: str) -> vllm_v1.VllmV1SlotMappings:
    """Release ``version``'s V1 ``BlockTable``, with its runner, which says the interleave
    it builds the table with (``vllm_v1.rebuild_of``)."""
    table_class = _function(_kept(version, vllm.V1_MEMBER), "BlockTable", name)
    lacking = releases.lacks(version, vllm.V1_RUNNER_MEMBER)
    runner = None if lacking else _kept(version, vllm.V1_RUNNER_MEMBER)
    return adapted(vllm_v1.VllmV1SlotMappings, table_class, name, runner, version)  # type: ignore[return-value]


def _gpu_runner_slots(version: str, name: str, function: str) -> vllm.VllmSlotMappings:
    """Release ``version``'s GPU model runner's ``function``, launched as its caller
    launches it."""
    target = _function(_kept(version, vllm.MEMBER), function, name)
    caller = _kept(version, vllm.CALLER_MEMBER)
    return adapted(vllm.VllmSlotMappings, target, name, caller, version)  # type: ignore[return-value]


def _release(release: releases.ReleaseSpec, named: bool) -> Routines:
    """A release's routines (module docstring); ``named``: the spec named one."""
    version, name = release.version, release.name
    if not named:
        return _every_routine(version, name)
    if release.function == vllm.SEQ_LENS_FUNCTION:
        why = ONE_ROUTINE.format(spec=f"{name}:{release.function}", this="local-length")
        return Routines(None, _lengths_function(version, name), why)
    if release.function == vllm.V1_FUNCTION:
        why = ONE_ROUTINE.format(spec=f"{name}:{release.function}", this="slot-mapping")
        return Routines(_v1_table(version, name), None, why)
    if release.function == vllm.SEQ_LENS_KERNEL:
        path = _kept(version, vllm.ALONE[release.function])
        target = _function(path, release.function, name)
        why = ONE_ROUTINE.format(spec=f"{name}:{release.function}", this="local-length")
        return Routines(None, adapted(vllm.VllmLocalSeqLens.of_kernel, target, name), why)
    why = ONE_ROUTINE.format(spec=f"{name}:{release.function}", this="slot-mapping")
    return Routines(_gpu_runner_slots(version, name, release.function), None, why)


def _each(found: list[tuple[str, object]]) -> object:
    """The one routine found, or a release's several as an ``EachRoutine``."""
    return found[0][1] if len(found) == 1 else EachRoutine(tuple(found))  # type: ignore[arg-type]


def _every_routine(version: str, name: str) -> Routines:
    """Every routine of each kind release ``version`` has (``EachRoutine``, module
    docstring). The slot mappings: the GPU model runner's kernel (0.12.0 on) and the V1
    runner's ``BlockTable`` (up to 0.33.0); the local lengths: the GPU model runner's
    kernel (0.17.0 on) and the attention backends' function, or before the function the
    MLA metadata builder's statement."""
    slots: list[tuple[str, object]] = []
    if has_gpu_runner(version):
        slots.append((vllm.FUNCTION, _gpu_runner_slots(version, name, vllm.FUNCTION)))
    if not releases.lacks(version, vllm.V1_MEMBER):
        slots.append((vllm.V1_FUNCTION, _v1_table(version, name)))
    lengths: list[tuple[str, object]] = []
    if not releases.lacks(version, vllm.SEQ_LENS_KERNEL_MEMBER):
        target = _function(_kept(version, vllm.SEQ_LENS_KERNEL_MEMBER), vllm.SEQ_LENS_KERNEL, name)
        kernel = adapted(vllm.VllmLocalSeqLens.of_kernel, target, name)
        lengths.append((vllm.SEQ_LENS_KERNEL, kernel))
    member = lengths_member(version)
    if member == vllm.MLA_MEMBER:
        builder = adapted(vllm_mla.builder_lengths, _kept(version, member), name)
        lengths.append((member, vllm.VllmLocalSeqLens.of_builder(builder, name)))
    else:
        lengths.append((vllm.SEQ_LENS_FUNCTION, _lengths_function(version, name)))
    return Routines(_each(slots), _each(lengths))  # type: ignore[arg-type]


def _callable(spec: str, adapter: str) -> Routines:
    """A file's or a module's callable with the slot-mapping protocol, or a Triton kernel
    of vLLM's (module docstring): the slot mappings alone. ``adapter`` is ``auto``, the
    op's one (``REGISTRY.adapters``): the callable's kind picks."""
    target = loading.load_callable(spec, list(REGISTRY.kernels))
    if hasattr(target, "fn") and hasattr(target, "__getitem__"):  # a Triton kernel: vLLM's
        where = Path(spec.rsplit(":", 1)[0])
        caller = vllm.beside(where) if where.suffix == ".py" else None
        slots = adapted(vllm.VllmSlotMappings, target, spec, caller)
    else:
        slots = target
    why = ONE_ROUTINE.format(spec=spec, this="slot-mapping")
    return Routines(slots, None, why)  # type: ignore[arg-type]


def _release_files(release: releases.ReleaseSpec, named: bool) -> tuple[JudgedFile, ...]:
    """A release's cached files (checked against the lock file or its wheel's RECORD once
    more)."""
    members = vllm.members_of(release.function, named)
    if not named:
        members = (*members, lengths_member(release.version))
    read: tuple[str, ...] = ()
    if vllm.SEQ_LENS_FUNCTION_MEMBER in members:  # with the files its callers are read in
        callers = every_rank_callers(release.version).lines
        read = tuple(line.rsplit(":", 1)[0] for line in callers)
    every = dict.fromkeys((*members, *read))
    present = [m for m in every if not releases.lacks(release.version, m)]
    kept = [(releases.fetch(release.version, member), member in members) for member in present]
    return tuple(JudgedFile(str(k.path), k.sha256, runs) for k, runs in kept)


def _callable_files(spec: str) -> tuple[JudgedFile, ...]:
    """What ``loading.spec_files`` names, and a vLLM kernel file's caller beside it."""
    judged_here = loading.spec_files(spec)
    where = Path(spec.rsplit(":", 1)[0])
    caller = vllm.beside(where)
    if where.suffix == ".py" and caller.is_file():
        judged_here += (loading.judged_file(caller),)
    return judged_here


REGISTRY: OpKernels[Routines] = OpKernels(
    op=SLOT_MAPPING,
    kernels={
        "default": Routines(compute_slot_mappings, compute_local_seq_lens),
        **{loading.mutant_name(m): Routines(m, compute_local_seq_lens) for m in mutants.MUTANTS},
        **{
            loading.mutant_name(m): Routines(compute_slot_mappings, m)
            for m in mutants.SEQ_LENS_MUTANTS
        },
    },
    descriptions=described(
        "the project's slot-mapping and local-sequence-length Triton kernels",
        (*mutants.MUTANTS, *mutants.SEQ_LENS_MUTANTS),
    ),
    sources=(project_kernel.__file__, mutants.__file__),
    function=vllm.FUNCTION,
    judged=(),
    release=_release,
    release_files=_release_files,
    external=_callable,
    external_files=_callable_files,
)
"""The op's kernels by spec (module docstring)."""
