"""Judge vLLM's merges of the DCP ranks' partial attentions in every release that has them
and print the verdict table.

For each release: ``python -m dcpcheck run --op lse-combine --kernel vllm==X --dcp
1,2,4,8`` over the op's shipped scenarios (``cp_lse_ag_out_rs``) and its property search
(``--property-only --examples N``), and the same run of
``vllm==X:dcp_a2a_lse_reduce`` (the all-to-all merge, where the release has it); the
JSON reports are kept under ``--out``. A row gives the file each routine came from and
the parameters it has (its API shape), the cases passed, failed and not applicable, the
findings, why checks were skipped, the property verdict and the wall time. Used for
BENCHMARKS.md's merge table:

    python3 benchmarks/lse_combine_matrix.py --out out/lse-combine

``--state-merge`` judges ``vllm==X:merge_attn_states`` instead (scenarios and property
search), its row giving the file and what the release's callers do to an empty chunk:

    python3 benchmarks/lse_combine_matrix.py --state-merge --out out/lse-combine

(The releases must be in the cache, ``$DCPCHECK_CACHE`` or ``~/.cache/dcpcheck``, or the
package registry reachable.)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from op_matrix import add_jobs_option, dcpcheck, print_rows, property_verdict, verdict
from slot_mapping_matrix import RELEASES

OP = "lse-combine"


def shape(spec: str) -> str:
    """The file ``spec``'s routine came from and the parameters it gained."""
    probe = (
        "from dcpcheck.backend import select_backend; select_backend('cpu'); "
        "from dcpcheck.ops.lse_combine import kernels, vllm; "
        f"print(kernels.judged_files('{spec}')[0].path.split('/vllm/', 2)[-1]); "
        f"k = kernels.load('{spec}'); "
        "print(k.empties if hasattr(k, 'empties') else "
        "' '.join(p for p in vllm.OPTIONAL[1:] if p in k.parameters) or '-')"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    lines = done.stdout.strip().splitlines() or [f"(no shape: {done.stderr.strip()[-200:]})"]
    return " / ".join(line for line in lines if line)


def judged(spec: str, out: Path, examples: int) -> tuple[str, str, str, float]:
    """``spec``'s shape, its verdict over the scenarios, its property verdict (``-`` when
    ``examples`` is 0 or it did not load) and the wall time of both."""
    merged, seconds = verdict(OP, spec, out)
    if merged.startswith("not loaded"):
        return "-", merged, "-", seconds
    property_line = "-"
    if examples:
        searched, search_seconds = dcpcheck(
            "run", "--op", OP, "--kernel", spec, "--property-only",
            "--examples", str(examples), "--home", str(out / "home"),
        )  # fmt: skip
        property_line, seconds = property_verdict(searched), seconds + search_seconds
    return shape(spec), merged, property_line, seconds


def judge(version: str, out: Path, examples: int) -> str:
    """One row of the group merges' table (module docstring)."""
    shaped, merged, property_line, seconds = judged(f"vllm=={version}", out, examples)
    a2a_shaped, a2a, _, a2a_seconds = judged(f"vllm=={version}:dcp_a2a_lse_reduce", out, 0)
    total = seconds + a2a_seconds
    return (
        f"| {version} | {shaped} | {merged} | {property_line} | {a2a_shaped} | {a2a} "
        f"| {total:.0f} |"
    )


def judge_state_merge(version: str, out: Path, examples: int) -> str:
    """One row of the ``merge_attn_states`` table (module docstring)."""
    shaped, merged, property_line, seconds = judged(
        f"vllm=={version}:merge_attn_states", out, examples
    )
    return f"| {version} | {shaped} | {merged} | {property_line} | {seconds:.0f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/lse-combine"))
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--state-merge", action="store_true", help="merge_attn_states")
    parser.add_argument("versions", nargs="*", default=list(RELEASES))
    add_jobs_option(parser)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.state_merge:
        print(
            "| release | merge_attn_states: file / empty chunks | cases pass / fail / N/A | "
            "property search | s |\n|---|---|---|---|---|"
        )
        row = lambda version: judge_state_merge(version, args.out, args.examples)
        print_rows(row, args.versions, args.jobs)
        return
    print(
        "| release | cp_lse_ag_out_rs: file / parameters | cases pass / fail / N/A | "
        "property search | dcp_a2a_lse_reduce: file / parameters | cases | s |\n"
        "|---|---|---|---|---|---|---|"
    )
    print_rows(lambda version: judge(version, args.out, args.examples), args.versions, args.jobs)


if __name__ == "__main__":
    main()
