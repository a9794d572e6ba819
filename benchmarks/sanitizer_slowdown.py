"""What ``--sanitize`` costs: the same run without and under each compute-sanitizer tool.

    python3 benchmarks/sanitizer_slowdown.py [--repeats N] [--tool memcheck ...]

Times, from the outside, ``dcpcheck run --no-tokens --dcp 4 --scenario decode-single-dcp4
--scenario fp8-ds-mla-cache`` (the default kernel) with ``--isolate`` and then with
``--sanitize TOOL`` for each tool, and prints a markdown table: wall time (the best of
``--repeats``), the slowdown against the isolated run, the exit code. The baseline is
isolated because a sanitized run is (one worker process per scenario, under the tool), so
the table shows what the tool adds, not what isolation adds. The Triton cache is warmed by
one untimed run first. GPU only (compute-sanitizer checks CUDA kernels); exits 2 without a
CUDA device or without compute-sanitizer.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from dcpcheck.harness.sanitizer import TOOLS, SanitizerUnavailable, find_executable  # noqa: E402

RUN = [
    "run",
    "--no-tokens",
    "--dcp",
    "4",
    "--scenario",
    "decode-single-dcp4",
    "--scenario",
    "fp8-ds-mla-cache",
]


def timed(options: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "dcpcheck", *RUN, *options], cwd=REPO, capture_output=True
    )
    return time.perf_counter() - start, done.returncode


def best_of(repeats: int, options: list[str]) -> tuple[float, int]:
    runs = [timed(options) for _ in range(repeats)]
    return min(seconds for seconds, _ in runs), max(code for _, code in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="runs per row; the best counts")
    parser.add_argument("--tool", action="append", choices=TOOLS, help="default: every tool")
    args = parser.parse_args()
    try:
        if not torch.cuda.is_available():
            raise SanitizerUnavailable("needs a CUDA device (compute-sanitizer checks GPU kernels)")
        executable = find_executable()
    except SanitizerUnavailable as exc:
        print(f"sanitizer_slowdown: {exc}", file=sys.stderr)
        sys.exit(2)

    timed(["--isolate"])  # warm Triton's cache: compilation is not what is measured
    baseline, code = best_of(args.repeats, ["--isolate"])
    print(f"`dcpcheck {' '.join(RUN)}` on {torch.cuda.get_device_name()}, {executable}\n")
    print("| run | wall s | slowdown | exit |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| `--isolate` | {baseline:.1f} | 1.0x | {code} |")
    for tool in args.tool or TOOLS:
        seconds, code = best_of(args.repeats, ["--sanitize", tool])
        print(f"| `--sanitize {tool}` | {seconds:.1f} | {seconds / baseline:.1f}x | {code} |")


if __name__ == "__main__":
    main()
