"""The ops dcpcheck judges, one package each, holding what is the op's own: its kernel
protocol, its cases, its contract checks, the project's kernels for it and their mutants,
the upstream routines it can load. The oracle of each lives in ``reference/`` (torch
only); what every op shares lies in the packages below this one (``dcpcheck.cases``,
``dcpcheck.adapters``, ``dcpcheck.kernels``) and in ``op_cases``.

An op package exposes one :class:`OpPackage` as ``PACKAGE``; the command line, the default
run and the pytest plugin reach the op only through it (:func:`package`), so an op is its
package plus its line in ``dcpcheck.op_registry``. The fused op (``fused_norm_rope``) is
the exception the command line names itself: its run has more than an ``OpPackage`` says
(worker isolation, compute-sanitizer, real ranks, ownership maps, the token streams), and
``dcpcheck.workflows.session`` runs it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcpcheck.op_registry import OPS


@dataclass(frozen=True)
class OpPackage:
    """What the command line asks of an op. The callables that define Triton kernels
    (``kernel``, ``run_scenario``, ``search``, ``selftest``) import them when called, so
    call them only once the backend is chosen."""

    name: str
    scenarios: Path  # the shipped scenario files
    load_scenarios: Callable[[list[str], Path], list[Any]]  # (patterns, folder)
    load_scenario: Callable[[Path], Any]  # one file, wherever it lies
    kernel: Callable[[str], Any]  # --kernel SPEC -> the op's kernel
    judged_files: Callable[[str], tuple[Any, ...]]  # the files a kernel's code comes from
    canonical: Callable[[str], str]  # a spec as reports and replays spell it
    kernels: Callable[[], dict[str, str]]  # the op's named kernels and what each is
    run_scenario: Callable[..., list[Any]]  # (kernel, name, scenario, sizes, device)
    save_failed_case: Callable[..., Path]  # (scenario, result, kernel name, home)
    search: Callable[..., Any]  # (kernel, name, examples, device, sizes, seed)
    save_search: Callable[..., Path | None]  # (outcome, kernel name, home)
    selftest: Callable[..., Any]  # (backend, on_row) -> SelftestReport
    # (scenario, DCP sizes, memory budget or None) -> its peak estimate; a one-line
    # ScenarioError when a run of it would hold more (dcpcheck.cases.memory)
    check_cost: Callable[..., Any]
    # (size, [(kernel spec, scenario file)], timeout or None for the op's) -> results, a
    # process per rank; None for an op that has no real-rank mode
    run_on_real_ranks: Callable[..., list[Any]] | None = None


def package(op: str) -> OpPackage:
    """The package of ``op`` (a name of ``dcpcheck.op_registry.OPS`` that has one)."""
    module = OPS[op].package
    if module is None:
        raise ValueError(f"{op} is run by dcpcheck.workflows.session, not through an OpPackage")
    return importlib.import_module(module).PACKAGE


def packaged() -> list[str]:
    """Every op that is a package, in the registry's order."""
    return [name for name, op in OPS.items() if op.package is not None]
