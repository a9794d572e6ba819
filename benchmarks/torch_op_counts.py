"""How many torch operations one dcpcheck command makes, and where: on any machine, a
measure of what its cases cost the host of a GPU.

On a GPU the gate's cases are bound by the host, not the device: each torch operation costs
the host microseconds to dispatch (a kernel launch or an allocation; a view only the
dispatcher's own time) whatever its tensor's size, so the number of operations a case
makes outside the kernel under test sets how fast it can run (``harness_overhead.py``
measures that time on a GPU). The count is the same on a CPU, so a change that adds
operations to the build, the oracle or the checks shows here, before any GPU sees it.

    PYTHONPATH=$PWD python3 benchmarks/torch_op_counts.py [--top N] -- run --dcp 4

The command runs in this process (its own output goes where it always does); then, on
stderr, its operations counted by module and by function, each operation once, at the
innermost frame of ``dcpcheck`` or ``reference`` that made it (dcpcheck's corrections of
Triton's interpreter are never that frame: an operation they make is the caller's), split
into views (``OpOverload.is_view``: no data touched) and the rest. Under Triton's
interpreter a launch's own operations (the interpreter copying each argument to the host
and back) count under the module that launches the kernel; a GPU launches it in one call,
so compare those rows only between two runs on one backend. Operations of other threads
(the compile threads) are not counted.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from types import FrameType

from torch.utils._python_dispatch import TorchDispatchMode


class CountedOps(TorchDispatchMode):
    """Counts every operation dispatched on this thread by its source (module docstring):
    the innermost frame of a file under ``roots``, not under ``excluded``."""

    def __init__(self, roots: tuple[Path, ...], excluded: Path) -> None:
        super().__init__()
        self.top = roots[0].parent  # sources are named relative to it
        self.roots = tuple(f"{root}/" for root in roots)
        self.excluded = f"{excluded}/"
        self.views: Counter[str] = Counter()
        self.others: Counter[str] = Counter()

    def source_of(self, frame: FrameType | None) -> str:
        """``path.py:function`` of the innermost counted frame; ``elsewhere`` if none."""
        while frame is not None:
            path = frame.f_code.co_filename
            if path.startswith(self.roots) and not path.startswith(self.excluded):
                return f"{Path(path).relative_to(self.top)}:{frame.f_code.co_name}"
            frame = frame.f_back
        return "elsewhere"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        source = self.source_of(sys._getframe(1))
        (self.views if func.is_view else self.others)[source] += 1
        return func(*args, **(kwargs or {}))


def table(ops: CountedOps, top: int) -> list[str]:
    """The counts by module, then the ``top`` functions, most operations first."""
    lines = []
    for title, key in (("module", lambda s: s.rsplit(":", 1)[0]), ("function", lambda s: s)):
        views, others = Counter(), Counter()
        for source, n in ops.views.items():
            views[key(source)] += n
        for source, n in ops.others.items():
            others[key(source)] += n
        rows = sorted(views.keys() | others.keys(), key=lambda k: -(views[k] + others[k]))
        limit = len(rows) if title == "module" else top
        lines.append(f"{'operations':>10} {'views':>7} {'others':>7}  by {title}")
        lines += [
            f"{views[k] + others[k]:10d} {views[k]:7d} {others[k]:7d}  {k}" for k in rows[:limit]
        ]
    total_views, total_others = sum(ops.views.values()), sum(ops.others.values())
    lines.append(f"{total_views + total_others:10d} {total_views:7d} {total_others:7d}  in all")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=25, help="functions listed (default 25)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="dcpcheck's arguments")
    args = parser.parse_args()
    import reference
    from dcpcheck import interpreter
    from dcpcheck.cli import main as dcpcheck_main

    dcpcheck_root = Path(interpreter.__file__).parents[1]
    ops = CountedOps(
        (dcpcheck_root, Path(reference.__file__).parent), Path(interpreter.__file__).parent
    )
    code: object = 0
    with ops:
        try:
            dcpcheck_main([a for a in args.command if a != "--"])
        except SystemExit as exc:
            code = exc.code
    print("\n".join(table(ops, args.top)), file=sys.stderr)
    print(f"the command's exit code: {code}", file=sys.stderr)
    raise SystemExit(code)  # this script's own: a command that failed is no figure


if __name__ == "__main__":
    main()
