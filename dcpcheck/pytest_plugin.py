"""pytest plugin: dcpcheck's contract checks as test items of a kernel repository.

Installed with dcpcheck (entry point ``pytest11``, name ``dcpcheck``), and inert unless
``--dcpcheck-kernel`` is given: a test run that merely has dcpcheck installed (this
project's own suite included) collects nothing extra and imports none of the harness
(no torch, no Triton) until the option asks for it.

In a kernel repository::

    pytest --dcpcheck-kernel=pkg.mod:fused_norm_rope --dcpcheck-dcp=1,4

collects one item per scenario x DCP size, ``dcpcheck::glm5-prefill-512[dcp4]``, and the
end-to-end token-stream check ``dcpcheck::token-streams[dcp4]``, exactly the cases
``dcpcheck run`` would run (select with ``-k 'glm5-prefill-512[dcp4]'`` or ``-k dcp4``).

Options (each as for ``dcpcheck run``):

* ``--dcpcheck-kernel SPEC``: registry name, ``package.module:function`` or
  ``path/to/file.py:function``.
* ``--dcpcheck-op OP``: the op the kernel implements (``dcpcheck list ops``). Another op
  than the fused one gives its scenarios at their DCP sizes as items (``dcpcheck run --op
  OP``), run in pytest's process; the options of the fused op's harness (the oracle
  switch, the case timeout, the adapter, the ini's scenario directories) are refused.
* ``--dcpcheck-dcp N[,N...]``: DCP sizes (default: each scenario's own).
* ``--dcpcheck-scenario NAME|GLOB``: repeatable; a pattern matching no scenario is an error.
* ``--dcpcheck-scenario-dir DIR``: the scenario files (default: the ones shipped).
* ``--dcpcheck-device auto|cuda|cpu``, ``--dcpcheck-adapter auto|native|vllm``.
* ``--dcpcheck-no-tokens``: leave out the token-stream item.
* ``--dcpcheck-oracle on|off``: off judges the kernel against its own DCP1 run alone, for
  a kernel whose encoding no oracle variant knows (``dcpcheck run --oracle``).
* ``--dcpcheck-home DIR``: where failing cases are saved, as scenario files under
  ``DIR/failures/`` that ``dcpcheck repro`` replays (``dcpcheck run --home``).
* ``--dcpcheck-isolate on|off`` and ``--dcpcheck-case-timeout SECONDS``: each item runs in
  a worker process, as under ``dcpcheck run --isolate``, so a kernel that crashes or hangs
  fails its item (status ``crash`` / ``timeout``, saved like any failing case) and the
  test run goes on. On by default, whatever the kernel: a hung test run helps no one. The
  worker starts with the first item that runs (not for ``--collect-only``) and is killed
  when pytest ends. It alone imports the kernel's module: one that does not load, or whose
  import ends or hangs the worker, fails every item, none judged. Off, pytest's process
  imports it once a child has and lived (``dcpcheck.kernels.import_probe``).

Repository scenarios: list directories of scenario TOML files (format:
``dcpcheck.ops.fused_norm_rope.scenario``) in the ini option ``dcpcheck_scenario_dirs``,
paths relative to the ini file::

    [tool.pytest.ini_options]
    dcpcheck_scenario_dirs = ["tests/dcp_scenarios"]

Their scenarios join those of ``--dcpcheck-scenario-dir`` under the same patterns, ids
and checks; a name defined twice is an error. One declarative place, because a scenario
is data: a repository adds a file, not a test function.

Items run through the CLI's session API (``dcpcheck.workflows.session.Session``): the same
cases, judged by the same function, and a failing case saved as ``dcpcheck run`` saves it.

Outcomes. A case fails with the CLI's text: one ``format_finding`` line per finding,
then the replay command; a case whose checks never ran (any status but pass and fail:
the kernel raised, its worker crashed or timed out) fails with that error and the replay.
A skipped check is never counted as passed: a case none of whose checks applied is
*skipped* with the reasons, and a passing case lists its not-applicable checks in a report
section (``-rA``) and in the JUnit properties. Each item runs its own DCP1 baseline (the
cross-rank checks compare with it), so selecting one item gives the same verdict as
running them all.

The backend is fixed before any conftest is imported (``pytest_load_initial_conftests``),
because Triton decides between compiling and interpreting when a kernel is *defined*
(:mod:`dcpcheck.backend`); a repository's conftest may import its kernels.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import shlex
import subprocess
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from dcpcheck.cases.options import COMMANDS, OPTIONS, Option
from dcpcheck.cases.verdicts import format_finding
from dcpcheck.op_registry import OPS

# The harness (torch, Triton) is imported inside the functions that run only when
# --dcpcheck-kernel is given, so an inert plugin costs nothing (module docstring).
if TYPE_CHECKING:
    from dcpcheck.backend import Backend
    from dcpcheck.cases.verdicts import CaseResult, NamedScenario
    from dcpcheck.ops import OpPackage

COLLECTOR_NAME = "dcpcheck"
"""Node id of the collector holding every dcpcheck item (``dcpcheck::NAME[dcpN]``)."""

SCENARIO_DIRS_INI = "dcpcheck_scenario_dirs"
"""The ini option naming a repository's own scenario directories."""

ADAPTER_NAMES = OPTIONS["adapter"].choices
"""``--dcpcheck-adapter``'s choices: ``adapters.ADAPTER_NAMES`` (the option table spells
them out because that module imports torch). A choice pytest checks is refused naming the
option typed; one left to the kernel's load would be refused under ``--dcpcheck-kernel``."""


@functools.cache
def fresh_process_path() -> tuple[Path, ...]:
    """The directories a fresh Python process started here searches for modules (its
    ``sys.path``: the working directory, ``PYTHONPATH``, site-packages and the ``.pth``
    files of editable installs), asked of one: this process's own ``sys.path`` has had
    conftests and pytest's ``pythonpath`` ini added to it."""
    shown = subprocess.run(
        [sys.executable, "-c", "import sys; print('\\n'.join(sys.path))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return tuple(Path(entry or ".").resolve() for entry in shown.splitlines())


def replay_prefix(kernel_name: str) -> str:
    """What a printed replay needs before ``dcpcheck`` to find the kernel from where pytest
    runs: ``PYTHONPATH=<root> `` when the kernel's package was imported from a directory
    only this pytest run searches (a ``src/`` layout on the ``pythonpath`` ini), else ""."""
    from dcpcheck.kernels.loading import import_root

    root = import_root(kernel_name)
    if root is None or root == Path.cwd().resolve():
        return ""
    if root in fresh_process_path():
        return ""
    return f"PYTHONPATH={shlex.quote(os.path.relpath(root))} "


class CaseFailure(Exception):
    """A case that did not pass; its message is the whole failure text (no traceback:
    the kernel's own frames are not where the bug is shown, the findings are)."""


@dataclass(frozen=True)
class Verdict:
    """How pytest should report one ``CaseResult``."""

    outcome: str  # "passed" | "failed" | "skipped"
    text: str  # failure text, skip reason, or the not-applicable checks of a pass


def verdict_of(result: CaseResult, kernel_name: str) -> Verdict:
    """The pytest outcome of one case: failed on any failed check or a kernel error,
    skipped when no check applied, else passed (naming the checks that did not apply)."""
    label = f"{result.scenario}[dcp{result.dcp_size}]"
    replay = f"replay: {result.replay}"
    if result.status not in ("pass", "fail"):
        detail = result.error or "no detail recorded"
        headline = f"{label}: {result.status.upper()} on kernel {kernel_name}: {detail}"
        return Verdict("failed", f"{headline}\n{replay}")

    failed = result.failed_checks
    if failed or result.status == "fail":
        lines = [f"{label}: FAIL on kernel {kernel_name}: {', '.join(c.check for c in failed)}"]
        lines += [format_finding(c.check, f) for c in failed for f in c.findings]
        return Verdict("failed", "\n".join([*lines, replay]))
    not_applicable = [f"{c.check} ({c.skipped})" for c in result.checks if c.skipped is not None]
    if len(not_applicable) == len(result.checks):
        return Verdict("skipped", f"{label}: no check applies: {'; '.join(not_applicable)}")
    if not_applicable:
        return Verdict("passed", f"not applicable: {'; '.join(not_applicable)}")
    return Verdict("passed", "")


class CaseItem(pytest.Item):
    """One dcpcheck case (a scenario at one DCP size, or the token-stream check)."""

    def __init__(
        self,
        *,
        run_case: Callable[[], CaseResult],
        kernel_name: str,
        source: Path | None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self._run_case = run_case
        self._kernel_name = kernel_name
        self._source = source

    def runtest(self) -> None:
        result = self._run_case()
        self.user_properties.append(("dcpcheck_replay", result.replay))
        verdict = verdict_of(result, self._kernel_name)
        if verdict.outcome == "failed":
            raise CaseFailure(verdict.text)
        if verdict.outcome == "skipped":
            pytest.skip(verdict.text)
        if verdict.text:
            self.user_properties.append(("dcpcheck_not_applicable", verdict.text))
            self.add_report_section("call", "dcpcheck", verdict.text)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CaseFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self._source or self.path, None, f"dcpcheck {self.name}"


@dataclass(frozen=True)
class PlannedCase:
    """One item to collect: its id (``scenario[dcpN]``), how to run it, its file."""

    name: str
    run: Callable[[], CaseResult]
    source: Path | None


@dataclass(frozen=True)
class Plan:
    """What ``--dcpcheck-*`` asked for, resolved once at configure time: the items, and
    what to stop when pytest ends (the fused op's isolated worker)."""

    kernel_name: str
    cases: tuple[PlannedCase, ...]
    close: Callable[[], None]


def _started(kernel, case: Callable[[], CaseResult]) -> CaseResult:
    """``case``, its kernel's worker started (the kernel loaded) first where isolated."""
    from dcpcheck.harness.isolation import IsolatedKernel
    from dcpcheck.kernels.import_probe import KernelImportLost
    from dcpcheck.kernels.loading import KernelLoadError

    if isinstance(kernel, IsolatedKernel) and kernel.worker_pid is None:
        try:
            kernel.start()
        except (KernelLoadError, KernelImportLost) as exc:
            why = f"{getattr(exc, 'status', 'error').upper()}: the kernel did not load: {exc}"
            raise CaseFailure(f"{why}; no case was judged") from None
    return case()


def _closed(kernel) -> Callable[[], None]:
    from dcpcheck.harness.isolation import IsolatedKernel

    return kernel.close if isinstance(kernel, IsolatedKernel) else (lambda: None)


PLAN = pytest.StashKey[Plan]()


def _pytest_option(option: Option) -> tuple[str, dict[str, object]]:
    """``option`` (the table's, as the plugin takes it) as ``addoption``'s arguments."""
    settings: dict[str, object] = {"default": option.default, "help": option.help}
    if option.kind == "flag":
        settings["action"] = "store_true"
    if option.multiple:
        settings.update(action="append", default=[])
    if option.kind == "float":
        settings["type"] = float
    if option.choices:
        settings["choices"] = option.choices
    if option.metavar is not None:
        settings["metavar"] = option.metavar
    return option.pytest_flag, settings


def given_options(config: pytest.Config) -> list[str]:
    """The ``--dcpcheck-*`` options set to other than their default, as typed."""
    given = []
    for name in COMMANDS["pytest"]:
        option = OPTIONS[name].on("pytest")
        if config.getoption(option.pytest_flag) != _pytest_option(option)[1]["default"]:
            given.append(name)
    return given


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dcpcheck", "dcpcheck: DCP contract checks of a fused MLA kernel")
    for name in COMMANDS["pytest"]:
        flag, settings = _pytest_option(OPTIONS[name].on("pytest"))
        group.addoption(flag, **settings)
    parser.addini(
        SCENARIO_DIRS_INI,
        type="paths",
        default=[],
        help="Directories of the repository's own dcpcheck scenario files (relative to the "
        "ini file), collected with the shipped ones.",
    )


def _fix_backend(device: str) -> Backend:
    from dcpcheck.backend import BackendError, select_backend

    try:
        return select_backend(device)
    except BackendError as exc:
        raise pytest.UsageError(f"--dcpcheck-device: {exc}") from None


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    options = early_config.known_args_namespace
    if options.dcpcheck_kernel is not None:
        _fix_backend(options.dcpcheck_device)


def parse_dcp_sizes(text: str) -> tuple[int, ...]:
    """``--dcpcheck-dcp``: ``"4"`` or ``"1,2,4"``."""
    from dcpcheck.cases import dcp
    from dcpcheck.cases.limits import DCP_SIZE_MAX

    try:
        return dcp.parse_dcp_sizes(text, DCP_SIZE_MAX)
    except ValueError as exc:
        raise pytest.UsageError(f"--dcpcheck-dcp: {exc}") from None


def select_scenarios(op: OpPackage, patterns: Sequence[str], roots: Sequence[Path]) -> list:
    """``op``'s scenarios of every root matching any pattern (all with no patterns), by name.

    A pattern must match in at least one root, and a name may be defined only once, so
    neither a typo nor a shadowed file goes unnoticed.
    """
    from dcpcheck.cases.scenario_files import ScenarioError

    chosen: dict[str, NamedScenario] = {}
    unmatched = set(patterns)
    known: set[str] = set()
    for root in roots:
        names = [path.stem for path in Path(root).glob("*.toml")]
        known.update(names)
        mine = [p for p in patterns if fnmatch.filter(names, p)]
        unmatched -= set(mine)
        if patterns and not mine:
            continue
        try:
            found = op.load_scenarios(mine, root)
        except ScenarioError as exc:
            raise pytest.UsageError(f"dcpcheck scenarios: {exc}") from None
        for scenario in found:
            if scenario.name in chosen:
                raise pytest.UsageError(
                    f"dcpcheck scenarios: {scenario.name!r} is defined twice: "
                    f"{chosen[scenario.name].source} and {scenario.source}"
                )
            chosen[scenario.name] = scenario
    if unmatched:
        raise pytest.UsageError(
            f"--dcpcheck-scenario: no scenario matches {', '.join(sorted(unmatched))} in "
            f"{', '.join(map(str, roots))} (known: {', '.join(sorted(known)) or 'none'})"
        )
    return [chosen[name] for name in sorted(chosen)]


def _op_plan(config: pytest.Config, kernel_name: str, op_name: str) -> Plan:
    """An op package's items (``dcpcheck.ops``): its scenarios (``--dcpcheck-scenario-dir``,
    else the shipped ones) at their DCP sizes, run in pytest's process, failures saved."""
    from dcpcheck.cases import memory
    from dcpcheck.cases.scenario_files import ScenarioError
    from dcpcheck.files import default_home
    from dcpcheck.kernels import import_probe
    from dcpcheck.kernels.loading import KernelLoadError
    from dcpcheck.ops import package

    op = package(op_name)

    refused = sorted(
        OPTIONS[name].pytest_flag
        for name in given_options(config)
        if not OPS[op_name].takes("run", name)
    )
    refused += [SCENARIO_DIRS_INI] if config.getini(SCENARIO_DIRS_INI) else []
    if refused:
        raise pytest.UsageError(f"--dcpcheck-op {op_name} does not take {', '.join(refused)}")
    dcp_text = config.getoption("dcpcheck_dcp")
    dcp_sizes = parse_dcp_sizes(dcp_text) if dcp_text is not None else None
    root = config.getoption("dcpcheck_scenario_dir") or op.scenarios
    try:
        scenarios = op.load_scenarios(config.getoption("dcpcheck_scenario"), Path(root))
    except ScenarioError as exc:
        raise pytest.UsageError(f"dcpcheck scenarios: {exc}") from None
    backend = _fix_backend(config.getoption("dcpcheck_device"))
    budget = memory.available_memory(backend.device)
    for scenario in scenarios:
        try:
            op.check_cost(scenario, dcp_sizes or scenario.dcp_sizes, budget)
        except ScenarioError as exc:
            raise pytest.UsageError(f"dcpcheck scenarios: {exc}") from None
    try:
        with import_probe.probing():  # it runs in pytest's process (module docstring)
            kernel = op.kernel(kernel_name)
    except (KernelLoadError, import_probe.KernelImportLost) as exc:
        raise pytest.UsageError(f"--dcpcheck-kernel: {exc}") from None
    home = config.getoption("dcpcheck_home")
    home = Path(home) if home is not None else default_home()

    def run(scenario, size: int) -> CaseResult:
        [result] = op.run_scenario(kernel, kernel_name, scenario, (size,), backend.device)
        if result.failed:
            try:
                op.save_failed_case(scenario, result, kernel_name, home)
            except OSError as exc:
                warnings.warn(f"dcpcheck: cannot save under {home}: {exc.strerror}", stacklevel=1)
        return result

    cases = tuple(
        PlannedCase(f"{s.name}[dcp{size}]", functools.partial(run, s, size), s.source)
        for s in scenarios
        for size in dcp_sizes or s.dcp_sizes
    )
    return Plan(kernel_name, cases, lambda: None)


def _plan(config: pytest.Config, kernel_name: str) -> Plan:
    from dcpcheck.ops import package, runner_ops

    op_name = config.getoption("dcpcheck_op")
    if op_name in runner_ops():
        return _op_plan(config, kernel_name, op_name)
    from dcpcheck.cases import memory
    from dcpcheck.cases.scenario_files import ScenarioError
    from dcpcheck.cases.verdicts import RunConfig
    from dcpcheck.files import default_home
    from dcpcheck.workflows.session import Session

    op = package(op_name)
    dcp_text = config.getoption("dcpcheck_dcp")
    dcp_sizes = parse_dcp_sizes(dcp_text) if dcp_text is not None else None
    scenario_dir = config.getoption("dcpcheck_scenario_dir")
    roots = [Path(scenario_dir) if scenario_dir is not None else op.scenarios]
    roots += config.getini(SCENARIO_DIRS_INI)
    scenarios = select_scenarios(op, config.getoption("dcpcheck_scenario"), roots)
    backend = _fix_backend(config.getoption("dcpcheck_device"))
    adapter = config.getoption("dcpcheck_adapter")
    kernel_name, kernel = _kernel(op, kernel_name, adapter, backend, _case_timeout(config))
    home = config.getoption("dcpcheck_home")
    run_config = RunConfig(
        kernel_name,
        dcp_sizes,
        oracle=config.getoption("dcpcheck_oracle") == "on",
        case_timeout=config.getoption("dcpcheck_case_timeout"),
        replay_prefix=replay_prefix(kernel_name),
    )
    budget = memory.available_memory(backend.device)
    for scenario in scenarios:
        try:
            op.check_cost(scenario, run_config.sizes_of(scenario), budget)
        except ScenarioError as exc:
            raise pytest.UsageError(f"dcpcheck scenarios: {exc}") from None
    session = Session(
        kernel,
        run_config,
        backend,
        Path(home) if home is not None else default_home(),
        on_warning=lambda text: warnings.warn(f"dcpcheck: {text}", stacklevel=1),
    )
    cases = [
        PlannedCase(
            f"{scenario.name}[dcp{size}]",
            functools.partial(_started, kernel, functools.partial(session.case, scenario, size)),
            scenario.source,
        )
        for scenario in scenarios
        for size in run_config.sizes_of(scenario)
    ]
    if scenarios and not config.getoption("dcpcheck_no_tokens"):
        streams = functools.partial(_started, kernel, session.token_streams)
        cases.append(PlannedCase(f"token-streams[dcp{run_config.token_stream_dcp}]", streams, None))
    return Plan(kernel_name, tuple(cases), _closed(kernel))


def _kernel(
    op: OpPackage, spec: str, adapter: str, backend: Backend, timeout: float | None
) -> tuple:
    """``op``'s kernel and ``spec`` as reports spell it: behind a worker (``timeout``),
    only its spec checked here, else loaded here once probed; refused, a usage error."""
    from dcpcheck.harness.isolation import IsolatedKernel
    from dcpcheck.kernels import import_probe
    from dcpcheck.kernels.loading import KernelLoadError, canonical_spec

    try:
        spec = canonical_spec(spec)
        if timeout is None:
            with import_probe.probing():
                return spec, op.kernel(spec, adapter)
        op.check_kernel(spec, adapter)
    except (KernelLoadError, import_probe.KernelImportLost) as exc:
        raise pytest.UsageError(f"--dcpcheck-kernel: {exc}") from None
    return spec, IsolatedKernel(spec, adapter, backend, timeout)


def _case_timeout(config: pytest.Config) -> float | None:
    """Seconds per isolated item, or None when items run in this process."""
    from dcpcheck.harness.isolation import resolve_case_timeout

    try:
        return resolve_case_timeout(
            config.getoption("dcpcheck_isolate") == "on",
            config.getoption("dcpcheck_case_timeout"),
            timeout_option="--dcpcheck-case-timeout",
            isolate_option="--dcpcheck-isolate=on",
        )
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_configure(config: pytest.Config) -> None:
    kernel_name = config.getoption("dcpcheck_kernel")
    if kernel_name is not None:
        config.stash[PLAN] = _plan(config, kernel_name)


def pytest_unconfigure(config: pytest.Config) -> None:
    plan = config.stash.get(PLAN, None)
    if plan is not None:
        plan.close()


class CaseCollector(pytest.Collector):
    """The node holding every dcpcheck item: one per scenario x DCP size, then the
    token-stream check (as ``dcpcheck run`` orders them)."""

    def __init__(self, *, plan: Plan, **kwargs) -> None:
        super().__init__(**kwargs)
        self._plan = plan

    def collect(self) -> list[CaseItem]:
        plan = self._plan
        return [
            CaseItem.from_parent(
                self,
                name=case.name,
                run_case=case.run,
                kernel_name=plan.kernel_name,
                source=case.source,
            )
            for case in plan.cases
        ]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items) -> None:
    """Append the dcpcheck items after the repository's own tests.

    ``session.genitems`` collects them the way pytest collects any node (collect reports,
    counts, ``--collect-only`` listing); ``tryfirst`` so that ``-k``/``-m``, pytest's own
    implementations of this hook, select among them like any other item.
    """
    plan = config.stash.get(PLAN, None)
    if plan is not None:
        collector = CaseCollector.from_parent(
            session, name=COLLECTOR_NAME, nodeid=COLLECTOR_NAME, plan=plan
        )
        items.extend(session.genitems(collector))
