"""What the commands share: their help text and exit-code errors, the refusal of options
a command does not take, and the set-up steps (backend, kernel) that turn bad input into
one line and an exit code before any work starts. Their options are the table's
(``dcpcheck.cli.options``); what only ``run`` / ``repro`` use lives in ``run.py``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import click
import torch

from dcpcheck.backend import BackendError, planned_device, select_backend
from dcpcheck.cases import dcp
from dcpcheck.cases.limits import DCP_SIZE_MAX
from dcpcheck.cases.verdicts import CaseResult
from dcpcheck.exit_codes import (
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_KERNEL_LOAD,
    EXIT_TERMINATED,
    EXIT_USAGE,
)
from dcpcheck.kernels.import_probe import KernelImportLost
from dcpcheck.kernels.loading import (
    JudgedFile,
    KernelLoadError,
    KernelSpecError,
)
from dcpcheck.ops import OpKernel, package
from dcpcheck.output.console import err

HELP = """Differential checks of the kernels an inference engine runs under Decode Context
Parallelism (DCP): each against its oracle, once per simulated rank (`dcpcheck list ops`).

Exit codes (part of the interface; `git bisect run` relies on 125):

\b
  0    cases ran and every check that could run passed (a case not applicable on this
       machine, N/A, fails nothing; a run that judged no case is never 0)
  1    a check failed, or the kernel raised, crashed or timed out (its module's import
       too, where it ended or hung the process importing it)
  2    usage error or bad input (a --kernel name the registry does not know, a
       vllm==X the package index does not publish, a release cache that cannot be
       trusted or written, too), found before any work starts
  125  the kernel under test could not be loaded or compiled (its module raised while
       imported, sys.exit included), or every case was N/A: nothing was launched
  130  interrupted (Ctrl-C): the reports so far are written, marked partial
  143  terminated (SIGTERM, e.g. a CI job's timeout): the same, under its own code

A kernel that raises fails its case (error); under --isolate one that crashes or hangs
fails it as crash or timeout; the other cases still run, and the exit code is 1. Where a
kernel and the harness do not fit: a signature that no adapter takes is 125 (the kernel's
source decides it, so `git bisect run` skips such a revision); a shape or dtype the kernel
rejects when called is that case's error (only the kernel knows what it supports).
"""
"""The command group's help: what dcpcheck is and its exit codes (``run`` repeats the codes)."""


class InputError(click.ClickException):
    """Bad input: one line on stderr, exit 2."""

    exit_code = EXIT_USAGE


class KernelLoadFailure(click.ClickException):
    """The kernel under test cannot be loaded: exit 125 so ``git bisect run`` skips.
    ``status``: what a report's record of it says (``session.kernel_load_record``)."""

    exit_code = EXIT_KERNEL_LOAD
    status = "error"


class NothingJudged(click.ClickException):
    """Every case of a run was not applicable here: the kernel was never launched, so the
    revision is neither good nor bad (exit 125, ``dcpcheck.exit_codes``)."""

    exit_code = EXIT_KERNEL_LOAD


def require_judged(results: Sequence[CaseResult]) -> None:
    """:class:`NothingJudged`, one line, when ``results`` (a run's cases, its reports
    written) hold no case that was launched."""
    if any(result.status != "not_applicable" for result in results):
        return
    raise NothingJudged(
        f"no case was judged: {len(results)} case(s), every one not applicable here "
        "(the kernel was never launched)"
    )


class KernelFailed(click.ClickException):
    """The kernel under test failed where no case can hold the error: it raised in ``hash``
    (``status`` error), or its import ended or hung the process importing it
    (``import_probe.KernelImportLost``: ``crash`` / ``timeout``). Exit 1."""

    exit_code = EXIT_FAIL

    def __init__(self, message: str, status: str = "error") -> None:
        super().__init__(message)
        self.status = status


class Interrupted(click.ClickException):
    """Ctrl-C (exit 130) or SIGTERM (exit 143): one line saying what was kept."""

    def __init__(self, message: str, exit_code: int = EXIT_INTERRUPTED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class BrokenOff(click.ClickException):
    """The run broke off mid-way, on dcpcheck's own error or a device fault
    (``session.broken_off_record``): the reports written with its record, exit 1 (the run
    did not pass)."""

    exit_code = EXIT_FAIL


def broken_off(record: CaseResult, internal_traceback: str, *paths: Path | None) -> BrokenOff:
    """The error to raise for a run broken off by ``record``; an internal error's whole
    traceback printed on stderr first (a bug to report, so it is not cut to one line)."""
    if internal_traceback:
        err.print(internal_traceback, markup=False, soft_wrap=True, end="")
    return BrokenOff(f"{record.error}{kept_reports(*paths)}")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread where Ctrl-C's ``KeyboardInterrupt`` would be, so
    a run that a CI job's timeout stops writes its partial reports the same way."""


def raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


def stop_reason(stop: BaseException | None) -> tuple[str, int]:
    """What stopped the command, as printed, and its exit code."""
    if isinstance(stop, Terminated):
        return "terminated", EXIT_TERMINATED
    return "interrupted", EXIT_INTERRUPTED


def kept_reports(*paths: Path | None) -> str:
    """What a command that stopped short says of the reports it wrote anyway."""
    written = [str(path) for path in paths if path is not None]
    return f"; partial report(s): {', '.join(written)}" if written else ""


def parse_dcp_sizes(text: str) -> tuple[int, ...]:
    """``--dcp``: ``"4"`` or ``"1,2,4,8"``, each size in 1..DCP_SIZE_MAX."""
    try:
        return dcp.parse_dcp_sizes(text, DCP_SIZE_MAX)
    except ValueError as exc:
        raise InputError(f"--dcp: {exc}") from None


def warn(text: str) -> None:
    """One warning line on stderr, as every command words one."""
    err.print(f"dcpcheck: warning: {text}", markup=False, soft_wrap=True)


def announce_oracle(oracle: bool) -> None:
    """Say on stderr, under the backend line, when the oracle is off: every pass of this
    run then means "agrees with its own DCP1 run", which the table alone does not show."""
    if not oracle:
        err.print(
            "[bold]oracle:[/] off (outputs and cache_owned judged against the kernel's own "
            "DCP1 run, not reference/)",
            soft_wrap=True,
        )


def device_for_checks(device: str) -> torch.device:
    """The ``--device`` a run will use, before its backend is opened (so before Triton is
    imported): exit 2 if it cannot be had. Up-front checks size the run against it."""
    try:
        return planned_device(device)
    except BackendError as exc:
        raise InputError(str(exc)) from None


def open_backend(device: str):
    """The ``--device`` backend, announced on stderr (the interpreter says so); exit 2 if
    it cannot be had (``cuda`` without a GPU)."""
    try:
        backend = select_backend(device)
    except BackendError as exc:
        raise InputError(str(exc)) from None
    err.print(f"[bold]backend:[/] {backend.describe()}")
    return backend


@contextlib.contextmanager
def kernel_errors() -> Iterator[None]:
    """A kernel spec's errors as the CLI's: exit 2 for one wrong in itself
    (``KernelSpecError``: a name the registry does not know, a file without
    ``:function``, a release cache that cannot be trusted), 125 for one that does not
    load, 1 for one whose import ended or hung the process importing it
    (``KernelImportLost``: the kernel's own crash or hang, ``dcpcheck.exit_codes``)."""
    try:
        yield
    except KernelSpecError as exc:
        raise InputError(str(exc)) from None
    except KernelLoadError as exc:
        raise KernelLoadFailure(str(exc)) from None
    except KernelImportLost as exc:
        raise KernelFailed(str(exc), exc.status) from None


def load(op: str, name: str, adapter: str = "auto") -> OpKernel:
    """``op``'s ``--kernel`` under ``--adapter`` (``kernel_errors``)."""
    with kernel_errors():
        return package(op).kernel(name, adapter)


def kernel_files(op: str, name: str) -> tuple[JudgedFile, ...]:
    """The files ``op``'s loaded ``--kernel``'s code comes from, with their SHA256, for the
    reports (the op's ``judged_files``); a release's file is checked against the lock file
    (or its wheel's RECORD) once more, so one changed since the load is exit 2, as at the
    load."""
    with kernel_errors():
        return package(op).judged_files(name)


def given_options(ctx: click.Context) -> set[str]:
    """The parameters of ``ctx`` set on the command line (a flag only when on)."""
    return {
        name
        for name, value in ctx.params.items()
        if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
        and value not in (None, False, ())
    }


def typed_option(param: click.Parameter, value: object) -> str:
    """How the user spells ``param`` on the command line to get ``value``: one of its
    option strings, never the name its value is kept under (``--profile``, not
    ``profile_name``). Of a flag pair (``--isolate/--no-isolate``) the side that gives
    ``value``; of an option with a short and a long string (``-x``, ``--fail-fast``) the
    long one, as the help names it (click keeps no record of which one was typed)."""
    strings = param.opts
    if isinstance(param, click.Option) and param.is_flag and param.secondary_opts and not value:
        strings = param.secondary_opts
    return max(strings, key=len)


def refuse_options(ctx: click.Context, allowed: set[str], refusal: str) -> None:
    """Exit 2, ``refusal`` then the options as typed (``typed_option``), for every option
    given on the command line outside ``allowed``: the off side of a flag pair
    (``--no-isolate``) too, since the option is as foreign to the command as its on side."""
    refused = sorted(
        typed_option(param, ctx.params[param.name])
        for param in ctx.command.params
        if param.name not in allowed
        and ctx.get_parameter_source(param.name) is click.core.ParameterSource.COMMANDLINE
    )
    if refused:
        raise InputError(f"{refusal} {', '.join(refused)}")
