"""How long dcpcheck takes as a gate: whole commands, timed from the outside.

* ``dcpcheck run --dcp 4`` over the shipped scenarios, with a cold Triton cache (a fresh
  ``TRITON_CACHE_DIR``) and then warm (the same directory again);
* the property search at DCP4 (``--property-only --stats``): examples per second;
* ``dcpcheck bisect`` over the 64-revision kernel history of the bisect tests.

    python3 benchmarks/gate_wall_time.py [--examples N] [--skip-bisect]

Runs on the CPU (Triton's interpreter) or a GPU, whichever ``--device auto`` picks.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fixtures import kernel_history  # noqa: E402

KERNEL_FILE = "kernels.py"


def timed(args: list[str], env: dict[str, str], cwd: Path = REPO) -> tuple[float, str, int]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "dcpcheck", *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    return time.perf_counter() - start, done.stdout, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--preset-profile", default="ci", help="property profile")
    parser.add_argument("--skip-bisect", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        env = {
            **os.environ,
            "TRITON_CACHE_DIR": str(Path(scratch) / "triton"),
            "DCPCHECK_HOME": str(Path(scratch) / "home"),
            "PYTHONPATH": str(REPO),
        }
        for label in ("cold", "warm"):
            seconds, output, code = timed(["run", "--dcp", "4"], env)
            summary = output.strip().splitlines()[-1]
            print(f"run --dcp 4 ({label} Triton cache): {seconds:.1f} s, exit {code}: {summary}")

        seconds, output, code = timed(
            [
                "run",
                "--dcp",
                "4",
                "--property-only",
                "--examples",
                str(args.examples),
                "--profile",
                args.preset_profile,
                "--stats",
            ],
            env,
        )
        rate = re.search(r"stats: property: .*", output)
        print(
            f"property --dcp 4 --examples {args.examples} --profile {args.preset_profile}: "
            f"{seconds:.1f} s wall, exit {code}: {rate.group(0) if rate else output[-300:]}"
        )

        if args.skip_bisect:
            return
        repo = Path(scratch) / "history"
        repo.mkdir()
        commits = kernel_history.build_repo(repo, KERNEL_FILE)
        seconds, output, code = timed(
            [
                "bisect",
                f"{KERNEL_FILE}:fused",
                "--repo",
                str(repo),
                "--good",
                commits[0],
                "--scenario",
                "decode-single-dcp4",
                "--dcp",
                "4",
            ],
            env,
        )
        verdict = [
            line
            for line in output.splitlines()
            if "first bad commit" in line or "run(s) for" in line
        ]
        expected = commits[kernel_history.FLAWED_FROM]
        print(
            f"bisect over {kernel_history.REVISIONS} revisions: {seconds:.1f} s, exit {code}; "
            f"{'; '.join(verdict)} (expected {expected[:12]})"
        )


if __name__ == "__main__":
    main()
