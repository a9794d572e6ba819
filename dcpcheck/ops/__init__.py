"""The ops dcpcheck judges, one package each, holding what is the op's own: its kernel
protocol, its cases, its contract checks, the project's kernels for it and their mutants,
the upstream routines it can load. The oracle of each lives in ``reference/`` (torch
only); what every op shares lies in the packages below this one (``dcpcheck.cases``,
``dcpcheck.adapters``, ``dcpcheck.kernels``) and in ``op_cases``.

An op package is data, as PyTorch's OpInfo makes an op: the modules it provides, by fixed
names, are its record, and :class:`OpPackage` reads them the same way for every op. The
command line, the default run, the selftest and the pytest plugin reach an op's
scenarios, memory estimate and kernels only through :func:`package`, so an op is its
package plus its line in ``dcpcheck.op_registry`` (the ``package`` of its ``Op``). The
package's ``__init__`` holds its docstring only; its modules are:

* ``scenario`` (:class:`ScenarioModule`): ``SCENARIOS``, the shipped scenario files'
  folder; ``load_scenario(path)`` and ``load_scenarios(patterns, root)``, the op's
  scenarios (``dcpcheck.cases.scenario_files.NamedBatch``) read strictly;
  ``scenario_to_toml``: a ``scenario_files.ScenarioFormat`` of the op's keys and batch.
* ``cost`` (:class:`CostModule`): ``check_cost(scenario, dcp_sizes, budget)``, the peak
  memory estimate (``dcpcheck.cases.memory``).
* ``kernels`` (:class:`KernelsModule`): ``REGISTRY``, the op's
  ``dcpcheck.kernels.registry.OpKernels``: its ``kernels``, the project's kernel
  (``default``) and its mutants (``mutant/NAME``), ``descriptions`` of each; ``load(spec,
  adapter)``, ``check(spec, adapter)``, ``judged_files(spec)`` and ``canonical(spec)`` of
  any ``--kernel`` spec.
* ``runner`` (:class:`RunnerModule`), of an op whose cases ``op_cases`` judges:
  ``OP_CASES`` (``op_cases.OpCases``), how one case of the op is judged; every run,
  replay, saved failure and the selftest go through it.
* ``search`` (:class:`SearchModule`), of the same ops: ``DCP_SIZES`` and
  ``drawn(kernel, dcp_sizes)``, the property search's strategy of (batch, DCP size) for
  that kernel (``op_cases.search`` runs it).
* ``session`` (:class:`SessionModule`), of the op ``dcpcheck.workflows.session`` judges
  instead (``Op.judged_by_session``): ``SESSION_CASES``
  (``session_cases.SessionCases``), its cases, its search and its kernels' declarations,
  as the session, the isolation worker and the reports reach them.
* ``real_ranks`` (:class:`RealRanksModule`), optional: ``run_on_real_ranks``, the op's
  cases with a process per rank (``--launcher torchrun``).
* ``selftest`` (:class:`SelftestModule`), optional: a selftest of the op's own, with
  ``PROFILES`` of how hard it tries and the mutants it runs by name (``--profile``,
  ``--mutant``), in place of ``op_cases.selftest``.
* ``case_maps`` (:class:`CaseMapsModule`), optional: ``case_map(result, scenario)``, what
  a case's ownership map shows (``dcpcheck.cases.case_map``: ``run --report-dir``).
* ``layouts`` (:class:`LayoutsModule`), optional: ``LAYOUTS``, the cache layouts the op
  writes by name, each with its bytes per token in words (``dcpcheck list layouts``).
* ``options`` (:class:`OptionsModule`), optional: the op's part of the option table
  (``dcpcheck.cases.options``): ``FILLS``, the values its options' records name, and
  ``CONVERT``, how its options' values become its configs' fields.
* ``decode_chain`` (:class:`DecodeChainModule`), of an op that plays a stage of the tiny
  model's decode path (``dcpcheck.op_registry.DECODE_CHAIN``): ``STAGES``, each stage it
  plays by name, as the record ``dcpcheck.ops.decode_stages`` defines for that stage.

``kernels``, ``runner``, ``search`` and ``real_ranks`` define Triton kernels or import
modules that do; Triton fixes a kernel as compiled or interpreted when it is defined
(``dcpcheck.backend``), so they are imported only when a method that needs them is
called, once the backend is chosen. ``scenario``, ``cost``, ``session`` and
``decode_chain`` define none (a ``decode_chain`` loads its kernels when asked):
the command line reads scenarios, refuses costly ones and builds a search's request
(``SessionCases.search_config``) before it opens the backend.
:meth:`OpPackage.conformance` imports every module and names what a package lacks.

The fused op (``fused_norm_rope``) provides ``scenario``, ``cost`` and ``kernels`` as every
op does, but its cases are judged by ``dcpcheck.workflows.session`` through its ``session``
module rather than by ``op_cases`` (``Op.judged_by_session``): its run has more than an
``OpCases`` says (worker isolation, compute-sanitizer, real ranks, ownership maps, the
token streams).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from dcpcheck.op_registry import OPS

if TYPE_CHECKING:
    import torch
    from hypothesis.strategies import SearchStrategy

    from dcpcheck.backend import Backend
    from dcpcheck.cases.case_map import CaseMap
    from dcpcheck.cases.memory import Peak
    from dcpcheck.cases.scenario_files import NamedBatch
    from dcpcheck.cases.verdicts import CaseResult, SelftestReport, SelftestRow
    from dcpcheck.kernels.loading import JudgedFile
    from dcpcheck.kernels.registry import OpKernels
    from dcpcheck.ops.op_cases import OpCases, SearchOutcome
    from dcpcheck.ops.session_cases import SessionCases


class OpKernel(Protocol):
    """A kernel of an op: whatever its ``contract`` module declares (a callable, or a
    record of routines). The harness only hands it back to the op's own code."""


class ScenarioModule(Protocol):
    """An op package's ``scenario`` module (module docstring)."""

    SCENARIOS: Path

    def load_scenario(self, path: Path) -> NamedBatch: ...

    def load_scenarios(self, patterns: list[str], root: Path) -> Sequence[NamedBatch]: ...

    def scenario_to_toml(self, scenario: NamedBatch) -> str: ...


class CostModule(Protocol):
    """An op package's ``cost`` module (module docstring)."""

    def check_cost(
        self, scenario: NamedBatch, dcp_sizes: Sequence[int], budget: int | None
    ) -> Peak: ...


class KernelsModule(Protocol):
    """An op package's ``kernels`` module (module docstring)."""

    REGISTRY: OpKernels[OpKernel]


class RunnerModule(Protocol):
    """An op package's ``runner`` module (module docstring)."""

    OP_CASES: OpCases


class SearchModule(Protocol):
    """An op package's ``search`` module (module docstring)."""

    DCP_SIZES: tuple[int, ...]

    def drawn(self, kernel: OpKernel, dcp_sizes: tuple[int, ...]) -> SearchStrategy: ...


class SessionModule(Protocol):
    """The ``session`` module of the op the session judges (module docstring)."""

    SESSION_CASES: SessionCases


class RealRanksModule(Protocol):
    """An op package's optional ``real_ranks`` module (module docstring)."""

    def run_on_real_ranks(
        self, size: int, jobs: list[tuple[str, Path]], timeout_s: float | None
    ) -> list[CaseResult]: ...


MODULES: dict[str, type] = {
    "scenario": ScenarioModule,
    "cost": CostModule,
    "kernels": KernelsModule,
}
"""The modules every op package provides, by name, and the protocol each follows."""

RUNNER_MODULES: dict[str, type] = {"runner": RunnerModule, "search": SearchModule}
"""The modules of an op whose cases ``op_cases`` judges (every op but the one
``dcpcheck.workflows.session`` judges: ``Op.judged_by_session``)."""

SESSION_MODULES: dict[str, type] = {"session": SessionModule}
"""The modules of the op ``dcpcheck.workflows.session`` judges."""


class SelftestModule(Protocol):
    """An op package's optional ``selftest`` module (module docstring)."""

    PROFILES: Mapping[str, Any]  # name -> a profile, with its ``description``
    DEFAULT_PROFILE: str

    def selftest(
        self,
        backend: Backend,
        on_row: Callable[[SelftestRow], None] | None,
        profile: str,
        mutant_names: Sequence[str],
    ) -> SelftestReport: ...


class CaseMapsModule(Protocol):
    """An op package's optional ``case_maps`` module (module docstring)."""

    def case_map(self, result: CaseResult, scenario: Any) -> CaseMap: ...


class LayoutsModule(Protocol):
    """An op package's optional ``layouts`` module (module docstring)."""

    LAYOUTS: Mapping[str, str]


class OptionsModule(Protocol):
    """An op package's optional ``options`` module (module docstring)."""

    FILLS: Mapping[str, Any]
    CONVERT: Mapping[str, Callable[[Any], Any]]


class DecodeChainModule(Protocol):
    """An op package's optional ``decode_chain`` module (module docstring)."""

    STAGES: Mapping[str, Any]  # stage name -> its ``dcpcheck.ops.decode_stages`` record


OPTIONAL_MODULES: dict[str, type] = {
    "real_ranks": RealRanksModule,
    "selftest": SelftestModule,
    "case_maps": CaseMapsModule,
    "layouts": LayoutsModule,
    "options": OptionsModule,
    "decode_chain": DecodeChainModule,
}
"""The modules an op package may provide."""


class SelftestRefused(ValueError):
    """An op's own selftest asked what it cannot judge (mutants it does not have, or none
    that can show in this run): one line, before any work."""


class OpPackageError(ImportError):
    """An op package lacks a module or a name the convention asks for."""


@dataclass(frozen=True)
class OpPackage:
    """What the command line asks of an op, read from its package's modules (module
    docstring). The methods that import ``kernels``, ``runner``, ``search`` or
    ``real_ranks`` define Triton kernels: call them only once the backend is chosen."""

    name: str
    module: str  # the package, e.g. "dcpcheck.ops.slot_mapping"

    def _part(self, part: str) -> ModuleType:
        return importlib.import_module(f"{self.module}.{part}")

    def _has(self, part: str) -> bool:
        """Whether the package has the module ``part`` (found, not imported)."""
        return importlib.util.find_spec(f"{self.module}.{part}") is not None

    @property
    def scenarios(self) -> Path:
        """The shipped scenario files' folder."""
        return self._scenario().SCENARIOS

    def _scenario(self) -> ScenarioModule:
        return self._part("scenario")  # type: ignore[return-value]

    def _kernels(self) -> KernelsModule:
        return self._part("kernels")  # type: ignore[return-value]

    def _cases(self) -> OpCases:
        runner: RunnerModule = self._part("runner")  # type: ignore[assignment]
        return runner.OP_CASES

    def session_cases(self) -> SessionCases:
        """How ``dcpcheck.workflows.session`` judges the op's cases (its ``session``
        module's ``SESSION_CASES``); only of the op it judges (:attr:`judged_by_session`)."""
        if not self.judged_by_session:
            raise ValueError(f"{self.name}: its cases are judged by op_cases, not a session")
        session: SessionModule = self._part("session")  # type: ignore[assignment]
        return session.SESSION_CASES

    def load_scenarios(self, patterns: list[str], root: Path) -> list[NamedBatch]:
        """The scenarios under ``root`` whose names match a pattern (all without one)."""
        return list(self._scenario().load_scenarios(patterns, root))

    def load_scenario(self, path: Path) -> NamedBatch:
        """One scenario file of the op, wherever it lies."""
        return self._scenario().load_scenario(path)

    def scenario_to_toml(self, scenario: NamedBatch) -> str:
        """``scenario`` as the op's scenario file holds it (``load_scenario`` reads it back)."""
        return self._scenario().scenario_to_toml(scenario)

    def check_cost(
        self, scenario: NamedBatch, dcp_sizes: Sequence[int], budget: int | None
    ) -> Peak:
        """The peak estimate of ``scenario`` at ``dcp_sizes``; a one-line ``ScenarioError``
        when a run of it would hold more than ``budget`` (``dcpcheck.cases.memory``)."""
        cost: CostModule = self._part("cost")  # type: ignore[assignment]
        return cost.check_cost(scenario, dcp_sizes, budget)

    def kernel(self, spec: str, adapter: str = "auto") -> OpKernel:
        """The kernel ``--kernel SPEC`` names, through ``--adapter`` (the op's
        ``REGISTRY.adapters``); ``KernelSpecError`` or ``KernelLoadError`` of one line."""
        return self._kernels().REGISTRY.load(spec, adapter)

    def check_kernel(self, spec: str, adapter: str = "auto") -> None:
        """What :meth:`kernel` would refuse of ``spec`` before running any of its code."""
        self._kernels().REGISTRY.check(spec, adapter)

    def judged_files(self, spec: str) -> tuple[JudgedFile, ...]:
        """The files ``spec``'s kernel's code comes from."""
        return self._kernels().REGISTRY.judged_files(spec)

    def canonical(self, spec: str) -> str:
        """``spec`` as reports and replays spell it."""
        return self._kernels().REGISTRY.canonical(spec)

    def kernels(self) -> dict[str, str]:
        """The op's named kernels and what each is."""
        return dict(self._kernels().REGISTRY.descriptions)

    def run_scenario(
        self,
        kernel: OpKernel,
        kernel_name: str,
        scenario: NamedBatch,
        dcp_sizes: Sequence[int],
        device: torch.device,
    ) -> list[CaseResult]:
        """One ``CaseResult`` per DCP size of ``dcp_sizes`` (``op_cases.run_scenario``)."""
        from dcpcheck.ops import op_cases

        return op_cases.run_scenario(
            self._cases(), kernel, kernel_name, scenario, dcp_sizes, device
        )

    def save_failed_case(
        self, scenario: NamedBatch, result: CaseResult, kernel_name: str, home: Path
    ) -> Path:
        """A failing case saved as a scenario file under ``home`` (``op_cases``)."""
        from dcpcheck.ops import op_cases

        return op_cases.save_failed_case(self._cases(), scenario, result, kernel_name, home)

    def search(
        self,
        kernel: OpKernel,
        kernel_name: str,
        examples: int,
        device: torch.device,
        dcp_sizes: tuple[int, ...] | None = None,
        seed: int | None = None,
    ) -> SearchOutcome:
        """The op's property search of ``kernel``: ``examples`` drawn cases, the smallest
        failing one when any fails (``op_cases.search``)."""
        from dcpcheck.ops import op_cases

        search: SearchModule = self._part("search")  # type: ignore[assignment]
        drawn = search.drawn(kernel, dcp_sizes or search.DCP_SIZES)
        return op_cases.search(self._cases(), kernel, kernel_name, drawn, examples, device, seed)

    def save_search(self, outcome: SearchOutcome, kernel_name: str, home: Path) -> Path | None:
        """The search's shrunk failure saved under ``home`` (None when it passed)."""
        from dcpcheck.ops import op_cases

        return op_cases.save_search(self._cases(), outcome, kernel_name, home)

    def selftest(
        self,
        backend: Backend,
        on_row: Callable[[SelftestRow], None] | None = None,
        profile: str | None = None,
        mutant_names: Sequence[str] = (),
    ) -> SelftestReport:
        """The op's part of ``dcpcheck selftest``: its own ``selftest`` module's, under
        ``profile`` (its ``DEFAULT_PROFILE`` when None) and over the mutants named, where it
        has one; else its ``default`` kernel passes every shipped scenario and every mutant
        of its registry fails one (``op_cases.selftest``), which takes neither."""
        if self.has_own_selftest:
            own: SelftestModule = self._part("selftest")  # type: ignore[assignment]
            return own.selftest(backend, on_row, profile or own.DEFAULT_PROFILE, mutant_names)
        if profile is not None or mutant_names:
            raise ValueError(f"{self.name}: its selftest takes no profile and no mutant names")
        from dcpcheck.ops import op_cases

        registry = self._kernels().REGISTRY
        scenarios = self.load_scenarios([], self.scenarios)
        return op_cases.selftest(
            self._cases(), dict(registry.kernels), dict(registry.descriptions), scenarios,
            backend, on_row,
        )  # fmt: skip

    def selftest_profiles(self) -> dict[str, str]:
        """The profiles of the op's own selftest by name, with what each does (none for an
        op without one)."""
        if not self.has_own_selftest:
            return {}
        own: SelftestModule = self._part("selftest")  # type: ignore[assignment]
        return {name: profile.description for name, profile in own.PROFILES.items()}

    def selftest_default_profile(self) -> str | None:
        """The profile the op's own selftest runs when none is named (None for an op
        without one)."""
        if not self.has_own_selftest:
            return None
        own: SelftestModule = self._part("selftest")  # type: ignore[assignment]
        return own.DEFAULT_PROFILE

    @property
    def has_own_selftest(self) -> bool:
        """Whether the op has a selftest of its own (a ``selftest`` module)."""
        return self._has("selftest")

    def case_map(self, result: CaseResult, scenario: Any) -> CaseMap:
        """What the ownership map of ``result``, a case of ``scenario``, shows (its
        ``case_maps`` module; ``run --report-dir`` takes only an op that has one)."""
        maps: CaseMapsModule = self._part("case_maps")  # type: ignore[assignment]
        return maps.case_map(result, scenario)

    def layouts(self) -> dict[str, str]:
        """The cache layouts the op writes, each with its size in words (its ``layouts``
        module's ``LAYOUTS``; none for an op without one)."""
        if not self._has("layouts"):
            return {}
        layouts: LayoutsModule = self._part("layouts")  # type: ignore[assignment]
        return dict(layouts.LAYOUTS)

    def decode_stage(self, stage: str) -> Any:
        """The op's part in stage ``stage`` of the tiny model's decode path (its
        ``decode_chain`` module's ``STAGES``; ``dcpcheck.ops.decode_stages``)."""
        chain: DecodeChainModule = self._part("decode_chain")  # type: ignore[assignment]
        if stage not in chain.STAGES:
            raise OpPackageError(f"{self.module}.decode_chain: no stage {stage!r}")
        return chain.STAGES[stage]

    def option_fills(self) -> dict[str, Any]:
        """What the option table's records of the op's own options name as ``Fill`` (its
        ``options`` module's ``FILLS``; none for an op without one)."""
        return dict(self._options().FILLS) if self._has("options") else {}

    def option_converters(self) -> dict[str, Callable[[Any], Any]]:
        """How the op's own options' values become its configs' fields (its ``options``
        module's ``CONVERT``; none for an op without one)."""
        return dict(self._options().CONVERT) if self._has("options") else {}

    def _options(self) -> OptionsModule:
        return self._part("options")  # type: ignore[return-value]

    @property
    def judged_by_session(self) -> bool:
        """Whether ``dcpcheck.workflows.session`` judges the op's cases, not its runner
        (``Op.judged_by_session``)."""
        return self.name in OPS and OPS[self.name].judged_by_session

    @property
    def has_real_ranks(self) -> bool:
        """Whether the op runs its cases with a process per rank (a ``real_ranks``)."""
        return self._has("real_ranks")

    def run_on_real_ranks(
        self, size: int, jobs: list[tuple[str, Path]], timeout_s: float | None
    ) -> list[CaseResult]:
        """Each (kernel spec, scenario file) of ``jobs`` at DCP ``size``, a process per
        rank; ``RuntimeError`` of one line naming the ranks when one dies or hangs."""
        real_ranks: RealRanksModule = self._part("real_ranks")  # type: ignore[assignment]
        return real_ranks.run_on_real_ranks(size, jobs, timeout_s)

    def conformance(self) -> list[str]:
        """What the package lacks of the convention (module docstring), one line each;
        empty when it has it all. Imports every module: call it once the backend is
        chosen."""
        missing = []
        parts = {
            **MODULES,
            **(SESSION_MODULES if self.judged_by_session else RUNNER_MODULES),
            **{part: kind for part, kind in OPTIONAL_MODULES.items() if self._has(part)},
        }
        for part, protocol in parts.items():
            try:
                module = self._part(part)
            except ModuleNotFoundError as exc:
                if exc.name != f"{self.module}.{part}":
                    raise
                missing.append(f"{self.module}: no module {part!r} (the package needs "
                               f"{', '.join(parts)})")  # fmt: skip
                continue
            lacks = [name for name in _members(protocol) if not hasattr(module, name)]
            if lacks:
                missing.append(f"{self.module}.{part}: lacks {', '.join(lacks)}")
        return missing


def _members(protocol: type) -> list[str]:
    """The names a module of ``protocol`` must define."""
    names = [*getattr(protocol, "__annotations__", {})]
    names += [n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")]
    return names


def package(op: str) -> OpPackage:
    """The package of ``op`` (a name of ``dcpcheck.op_registry.OPS``)."""
    return OpPackage(op, OPS[op].package)


def runner_ops() -> list[str]:
    """Every op whose cases its package's runner judges (``op_cases``), in the registry's
    order: every op but the one ``dcpcheck.workflows.session`` judges."""
    return [name for name, op in OPS.items() if not op.judged_by_session]


def session_op() -> OpPackage:
    """The package of the op ``dcpcheck.workflows.session`` judges (``Op.judged_by_session``:
    the registry marks exactly one)."""
    (name,) = (name for name, op in OPS.items() if op.judged_by_session)
    return package(name)
