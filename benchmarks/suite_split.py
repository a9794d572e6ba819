"""Where the suite's wall time goes, test by test: the pytest worker's own CPU, the CPU of
the processes the test started and waited for, and the rest (sleeping on a timeout, waiting
on the other worker's processes for a core).

    DCPCHECK_SUITE_SPLIT=DIR python -m pytest -q -n 2 -p benchmarks.suite_split
    python3 benchmarks/suite_split.py DIR [--top 25]

As a pytest plugin (``-p benchmarks.suite_split``, run from the checkout with
``PYTHONPATH=$PWD``) it appends one JSON line per test to ``DIR/tests-<pid>.jsonl``: the
test's id, its wall seconds, and the deltas of ``getrusage`` for the worker
(``RUSAGE_SELF``) and for its waited-for children (``RUSAGE_CHILDREN``, which takes in their
own children once they are waited for). Run as a script it sums those lines: the split of
the whole, the files by wall time, and the tests whose wall time is most of neither.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections import defaultdict
from pathlib import Path

FOLDER_ENV = "DCPCHECK_SUITE_SPLIT"


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _hooks():
    """The plugin's hook, built only when pytest loads this module as a plugin."""
    import pytest

    folder = Path(os.environ[FOLDER_ENV])
    folder.mkdir(parents=True, exist_ok=True)
    out = (folder / f"tests-{os.getpid()}.jsonl").open("a")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        wall = time.perf_counter()
        own, children = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
        yield
        line = {
            "id": item.nodeid,
            "wall": time.perf_counter() - wall,
            "self": _cpu(resource.RUSAGE_SELF) - own,
            "children": _cpu(resource.RUSAGE_CHILDREN) - children,
        }
        out.write(json.dumps(line) + "\n")
        out.flush()

    return pytest_runtest_protocol


if FOLDER_ENV in os.environ and __name__ != "__main__":
    pytest_runtest_protocol = _hooks()


def summary(folder: Path, top: int) -> str:
    rows = [
        json.loads(line)
        for path in sorted(folder.glob("tests-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    if not rows:
        raise SystemExit(f"no tests-*.jsonl lines under {folder}: run the suite with the plugin")
    total = {key: sum(r[key] for r in rows) for key in ("wall", "self", "children")}
    rest = total["wall"] - total["self"] - total["children"]
    lines = [
        f"{len(rows)} tests: {total['wall']:.0f} s of worker wall time, of it "
        f"{total['self']:.0f} s the workers' CPU, {total['children']:.0f} s their "
        f"processes' CPU, {rest:.0f} s neither",
        "",
        "files by wall time (wall, workers' CPU, processes' CPU):",
    ]
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for r in rows:
        sums = by_file[r["id"].split("::")[0]]
        sums[0] += r["wall"]
        sums[1] += r["self"]
        sums[2] += r["children"]
    for name, (wall, own, children) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {wall:7.1f} {own:7.1f} {children:7.1f}  {name}")
    lines += ["", "tests by time in neither (wall, workers' CPU, processes' CPU):"]
    idle = sorted(rows, key=lambda r: r["self"] + r["children"] - r["wall"])[:top]
    for r in idle:
        lines.append(f"  {r['wall']:7.1f} {r['self']:7.1f} {r['children']:7.1f}  {r['id']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(summary(args.folder, args.top))


if __name__ == "__main__":
    main()
