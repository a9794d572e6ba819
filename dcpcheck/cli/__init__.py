"""The ``dcpcheck`` command line: a thin layer over ``dcpcheck.harness.session``,
``dcpcheck.workflows`` and friends, one module per command (``run`` and ``repro`` share
one; ``ranks`` is what one process of a real-rank run executes). ``common`` holds the help
text with the exit codes, the shared options and the errors that become them."""

from __future__ import annotations

import signal
import sys

import click

from dcpcheck.cli import bisecting, hashing, listing, ranks, run, selftest
from dcpcheck.cli.common import HELP, Interrupted, raise_terminated, stop_reason
from dcpcheck.distributed.group import in_torchrun_environment
from dcpcheck.output.console import err


@click.group(help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    pass


for command in (
    run.run_command,
    run.repro_command,
    selftest.selftest_command,
    hashing.hash_command,
    bisecting.bisect_command,
    listing.list_command,
):
    cli.add_command(command)


def main() -> None:
    """Entry point: click's errors become one line on stderr with their exit code.

    Under torchrun (``torchrun --nproc-per-node N -m dcpcheck run ...``) this process is
    one rank of a real-rank run: ``dcpcheck.cli.ranks`` takes over."""
    if sys.argv[1:2] in (["run"], ["hash"]) and in_torchrun_environment():
        ranks.main(sys.argv[1:])
    signal.signal(signal.SIGTERM, raise_terminated)
    try:
        cli.main(standalone_mode=False)
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
