"""The ``dcpcheck`` command line: a thin layer over ``dcpcheck.workflows.session``,
``dcpcheck.workflows`` and friends, one module per command (``run`` and ``repro`` share
one; ``ranks`` is what one process of a real-rank run executes). ``common`` holds the help
text with the exit codes, the shared options and the errors that become them."""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
from typing import NoReturn

import click

from dcpcheck.cli.common import HELP, Interrupted, raise_terminated, stop_reason
from dcpcheck.kernels import import_probe
from dcpcheck.observers import in_torchrun_environment, watched
from dcpcheck.output.console import err
from dcpcheck.resident import PROGRAM_ENV

COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("dcpcheck.cli.run", "run_command"),
    "repro": ("dcpcheck.cli.run", "repro_command"),
    "selftest": ("dcpcheck.cli.selftest", "selftest_command"),
    "hash": ("dcpcheck.cli.hashing", "hash_command"),
    "bisect": ("dcpcheck.cli.bisecting", "bisect_command"),
    "fetch": ("dcpcheck.cli.fetching", "fetch_command"),
    "list": ("dcpcheck.cli.listing", "list_command"),
    "mutate": ("dcpcheck.cli.mutating", "mutate_command"),
}
"""Each command's module and function. A command's module is imported when the command is
asked for (to run it, or to list it in ``--help``), so a run pays for no other command's
imports (bisect's, the selftest's, the ownership maps')."""


class _Commands(click.Group):
    """The group of :data:`COMMANDS`, each imported on demand (click's lazy subcommands)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, name = COMMANDS[cmd_name]
        return getattr(importlib.import_module(module), name)


@click.group(cls=_Commands, help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def cli(ctx: click.Context) -> None:
    # A command writes its reports and exit status only if it outlives the kernel's import:
    # an outside module it imports itself is imported in a probe first.
    ctx.with_resource(import_probe.probing())


def main(args: list[str] | None = None) -> None:
    """Entry point: ``dcpcheck ARGS`` (the command line's when None); click's errors become
    one line on stderr with their exit code, and every way out is ``SystemExit``.

    Under torchrun (``torchrun --nproc-per-node N -m dcpcheck run ...``) this process is
    one rank of a real-rank run: ``dcpcheck.cli.ranks`` takes over."""
    args = sys.argv[1:] if args is None else list(args)
    if args[:1] in (["run"], ["hash"]) and in_torchrun_environment():
        from dcpcheck.cli import ranks  # a rank's process alone needs it

        ranks.main(args)
    signal.signal(signal.SIGTERM, raise_terminated)
    program = os.environ.pop(PROGRAM_ENV, None)  # a resident command's: its client's name
    try:
        cli.main(args, prog_name=program, standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except Interrupted as exc:
        err.print(f"dcpcheck: {exc.format_message()}", markup=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        err.print(f"dcpcheck: error: {exc.format_message()}", markup=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort as exc:  # Ctrl-C / SIGTERM outside a run's cases
        how, code = stop_reason(exc.__context__)
        err.print(f"dcpcheck: {how}", markup=False)
        sys.exit(code)


def command_line() -> NoReturn:
    """The process's entry point (the ``dcpcheck`` script, ``python -m dcpcheck``): :func:`main`,
    then leave without Python's interpreter teardown.

    Why: the teardown of a process that imported torch costs more than many checks do. On 2
    CPU cores ``python -c "import torch"`` takes 2.09 s and 1.19 s leaving by ``os._exit``,
    and ``dcpcheck run --dcp 4 --scenario decode-single-dcp4 --no-tokens`` spends 0.6-0.7 s of
    its wall time after its last line. A command has written and closed everything by the
    time :func:`main` returns (reports atomically, failing cases as they land, isolated
    workers stopped by the context managers that started them), so only stdout and stderr
    are flushed here. Some processes exit the ordinary way: a rank of a real-rank run (its
    process group tears down as torch.distributed expects) and one that a profiler, tracer
    or CUDA tool watches (cProfile, coverage; Nsight Systems, Nsight Compute and
    compute-sanitizer inject a library), which may write what it gathered at exit.
    """
    try:
        main()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    if in_torchrun_environment() or watched():
        sys.exit(code)
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): Python prints it, exit status 1
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        # A closed pipe (``dcpcheck ... | head``) or stream has nothing left to take.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
