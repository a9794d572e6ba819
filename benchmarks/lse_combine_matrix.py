"""Judge vLLM's merge of the DCP ranks' partial attentions (``cp_lse_ag_out_rs``) in every
release that has it and print the verdict table.

For each release: ``python -m dcpcheck run --op lse-combine --kernel vllm==X --dcp
1,2,4,8`` over the op's shipped scenarios, and its property search (``--property-only
--examples N``); the JSON reports are kept under ``--out``. A row gives the file the
routine came from and the parameters it has (its API shape), the cases passed, failed and
not applicable, the findings, why checks were skipped, the property verdict and the wall
time. Used for BENCHMARKS.md's merge table:

    python3 benchmarks/lse_combine_matrix.py --out out/lse-combine

(The releases must be in the cache, ``$DCPCHECK_CACHE`` or ``~/.cache/dcpcheck``, or the
package registry reachable.)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from op_matrix import dcpcheck, property_verdict, verdict
from slot_mapping_matrix import RELEASES

OP = "lse-combine"


def shape(version: str) -> str:
    """The file the release's routine came from and the parameters it gained."""
    probe = (
        "from dcpcheck.backend import select_backend; select_backend('cpu'); "
        "from dcpcheck.ops.lse_combine import kernels, vllm; "
        f"print(kernels._release_file('{version}', 'v').path.split('/vllm/', 2)[-1]); "
        f"k = kernels.load('vllm=={version}'); "
        "print(' '.join(p for p in vllm.OPTIONAL[1:] if p in k.parameters) or '-')"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    lines = done.stdout.strip().splitlines() or [f"(no shape: {done.stderr.strip()[-200:]})"]
    return " / ".join(line for line in lines if line)


def judge(version: str, out: Path, examples: int) -> str:
    """One row of the table (module docstring)."""
    merged, seconds = verdict(OP, f"vllm=={version}", out)
    property_line, search_seconds = "-", 0.0
    if not merged.startswith("not loaded"):
        searched, search_seconds = dcpcheck(
            "run", "--op", OP, "--kernel", f"vllm=={version}", "--property-only",
            "--examples", str(examples), "--home", str(out / "home"),
        )  # fmt: skip
        property_line = property_verdict(searched)
    shaped = shape(version) if not merged.startswith("not loaded") else "-"
    return f"| {version} | {shaped} | {merged} | {property_line} | {seconds + search_seconds:.0f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/lse-combine"))
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("versions", nargs="*", default=list(RELEASES))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(
        "| release | file / parameters | cases pass / fail / N/A | property search | s |\n"
        "|---|---|---|---|---|"
    )
    for version in args.versions:
        print(judge(version, args.out, args.examples), flush=True)


if __name__ == "__main__":
    main()
