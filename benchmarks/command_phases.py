"""Where one dcpcheck command's wall time goes, phase by phase, in the command's own process:
importing dcpcheck (torch, Triton), compiling ahead, the named cases, the token streams,
the property search, and the total until the command returns. What the whole command
takes beyond that total (starting Python, and leaving it) is its wall time, timed from
outside, minus the total.

    PYTHONPATH=$PWD python3 benchmarks/command_phases.py [OPTIONS] -- run --dcp 4

Each phase prints one ``[phase]`` line on stderr as it ends (with the time since the
start); the command's own output goes where it always does. Two options change the run,
to measure what a change would buy before making it:

* ``--no-compile-ahead``: skip ``compile_ahead``, so every case loads or compiles its own
  binaries (with Triton's cache warm: what the dry pass costs);
* ``--batched-max N``: up to N scenarios per property-search example instead of
  ``search.BATCHED_SCENARIOS_MAX``.
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import functools  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402

import dcpcheck.cli as cli  # noqa: E402
from dcpcheck.ops.fused_norm_rope import search  # noqa: E402
from dcpcheck.workflows import session  # noqa: E402


def say(label: str, seconds: float | None = None) -> None:
    took = "" if seconds is None else f": {seconds:.3f} s"
    print(f"[phase] {label}{took} (at {time.perf_counter() - START:.3f} s)", file=sys.stderr)


def timed(label: str, function: Callable) -> Callable:
    @functools.wraps(function)
    def phase(*args, **kwargs):
        begun = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            say(label, time.perf_counter() - begun)

    return phase


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-compile-ahead", action="store_true")
    parser.add_argument("--batched-max", type=int)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="dcpcheck's arguments")
    args = parser.parse_args()
    say("imports")
    if args.no_compile_ahead:
        session.compile_ahead = lambda *_, **__: say("compile ahead skipped")
    else:
        session.compile_ahead = timed("compile ahead", session.compile_ahead)
    session.run = timed("named cases", session.run)
    session.token_stream_case = timed("token streams", session.token_stream_case)
    search.search = timed("property search", search.search)
    if args.batched_max is not None:
        search.BATCHED_SCENARIOS_MAX = args.batched_max
    cli.main = timed("the command, until it returned", cli.main)
    sys.argv = ["dcpcheck", *(a for a in args.command if a != "--")]
    cli.command_line()  # leaves as dcpcheck does


if __name__ == "__main__":
    main()
