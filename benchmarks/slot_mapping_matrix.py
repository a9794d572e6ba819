"""Judge vLLM's slot-mapping kernel (``_compute_slot_mappings_kernel``) in every release that
has it and print the verdict table.

For each release: ``python -m dcpcheck run --op slot-mapping --kernel vllm==X --dcp
1,2,4,8`` over the op's shipped scenarios, then its property search (``--property-only
--examples N``); the JSON reports are kept under ``--out``. A row gives the kernel's
parameters that changed (its API shape), what the adapter read from the caller, the cases
passed, failed and not applicable (with the reasons), the failing findings, the property
verdict and the wall time. Used for BENCHMARKS.md's slot-mapping table:

    python3 benchmarks/slot_mapping_matrix.py --out out/slot-mapping

(The releases must be in the cache, ``$DCPCHECK_CACHE`` or ``~/.cache/dcpcheck``, or the
package registry reachable.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

RELEASES = [
    *("0.12.0", "0.13.0", "0.14.0", "0.14.1", "0.15.0", "0.15.1", "0.16.0", "0.17.0"),
    *("0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2"),
    *("0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0"),
    *("0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0"),
]
"""Every published release with a GPU model runner, oldest first."""

SHAPE_PARAMETERS = ("num_tokens", "idx_mapping", "cp_rank", "kernel_block_sizes", "dcp_sharded")
"""The parameters whose coming and going make the kernel's API shapes."""


def _dcpcheck(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dcpcheck", *args], capture_output=True, text=True)
    return done, time.perf_counter() - start


def shape(version: str) -> str:
    """The release kernel's shape parameters and what was read from its caller."""
    probe = (
        "import sys; from dcpcheck.backend import select_backend; select_backend('cpu'); "
        "from dcpcheck.ops.slot_mapping.kernels import load; "
        f"k = load('vllm=={version}'); "
        f"print(' '.join(p for p in {SHAPE_PARAMETERS!r} if p in k.parameters) or '-'); "
        "print(('padded' if k.caller.padded else 'scheduled') + ' rows: ' + k.caller.evidence "
        "if k.caller else '')"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    lines = done.stdout.strip().splitlines() or [f"(no shape: {done.stderr.strip()[-200:]})"]
    return " / ".join(line for line in lines if line)


def judge(version: str, out: Path, examples: int) -> str:
    report = out / f"vllm-{version}.json"
    done, seconds = _dcpcheck(
        "run", "--op", "slot-mapping", "--kernel", f"vllm=={version}", "--dcp", "1,2,4,8",
        "--json", str(report), "--home", str(out / "home"),
    )  # fmt: skip
    if not report.is_file():
        raise SystemExit(f"vllm=={version}: no report (exit {done.returncode}): {done.stderr}")
    cases = json.loads(report.read_text())["cases"]
    counts = {s: sum(c["status"] == s for c in cases) for s in ("pass", "fail", "not_applicable")}
    found: dict[str, dict[str, set]] = {}
    for case in cases:
        for check in case["checks"] if case["status"] == "fail" else ():
            for finding in check["findings"]:
                seen = found.setdefault(case["scenario"], {"dcp": set(), "what": set()})
                seen["dcp"].add(case["dcp"])
                seen["what"].add(f"{check['check']} {finding['field']} ({finding['ownership']})")
    failing = [
        f"{name} at DCP {','.join(map(str, sorted(seen['dcp'])))}: "
        + ", ".join(sorted(seen["what"]))
        for name, seen in sorted(found.items())
    ]
    unasked = [c for c in cases if c["status"] == "not_applicable"]
    reasons = sorted({c["error"].split(": ", 1)[0] for c in unasked})
    searched, search_seconds = _dcpcheck(
        "run", "--op", "slot-mapping", "--kernel", f"vllm=={version}", "--property-only",
        "--examples", str(examples), "--home", str(out / "home"),
    )  # fmt: skip
    property_line = next(
        (line for line in searched.stdout.splitlines() if line.startswith("property:")),
        f"(no property line, exit {searched.returncode})",
    )
    return (
        f"| {version} | {shape(version)} | {counts['pass']} / {counts['fail']} / "
        f"{counts['not_applicable']} | {'; '.join(failing) or '-'} | "
        f"{'; '.join(reasons) or '-'} | {property_line.removeprefix('property: ')} | "
        f"{seconds:.0f} + {search_seconds:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/slot-mapping"))
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("versions", nargs="*", default=list(RELEASES))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(
        "| release | shape parameters / caller rows | pass / fail / N/A | findings "
        "(scenario at DCP: check field (first bad row)) | N/A because | property search | s |"
    )
    print("|---|---|---|---|---|---|---|")
    for version in args.versions:
        print(judge(version, args.out, args.examples), flush=True)


if __name__ == "__main__":
    main()
