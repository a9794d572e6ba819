"""Judge vLLM's merges of the DCP ranks' partial attentions in every release that has them
and print the verdict tables.

For each release, in one process (``op_matrix``): ``dcpcheck run --op lse-combine --kernel
vllm==X --dcp 1,2,4,8`` over the op's shipped scenarios (``cp_lse_ag_out_rs``) and its
property search (``--property-only --examples N``); the same run of
``vllm==X:dcp_a2a_lse_reduce`` (the all-to-all merge, where the release has it); and the
run and property search of ``vllm==X:merge_attn_states``. The JSON reports are kept under
``--out``. The first table gives, per release, the file each group merge came from and the
parameters it has (its API shape), the cases passed, failed and not applicable, the
findings, why checks were skipped, the property verdict and the wall time; the second the
same of ``merge_attn_states``, with what the release's callers do to an empty chunk. Used
for BENCHMARKS.md's merge tables:

    python3 benchmarks/lse_combine_matrix.py --out out/lse-combine

(The releases must be in the cache, ``$DCPCHECK_CACHE`` or ``~/.cache/dcpcheck``, or the
package registry reachable.)
"""

from __future__ import annotations

from pathlib import Path

from op_matrix import end, property_search, rows, start, verdict
from slot_mapping_matrix import RELEASES

OP = "lse-combine"


def shape(spec: str) -> str:
    """The file ``spec``'s routine came from and the parameters it gained, or what it does
    to an empty chunk (after a run of it in this process: the backend is chosen)."""
    from dcpcheck.ops import package
    from dcpcheck.ops.lse_combine import vllm

    where = package(OP).judged_files(spec)[0].path.split("/vllm/", 2)[-1]
    kernel = package(OP).kernel(spec)
    if hasattr(kernel, "empties"):
        return f"{where} / {kernel.empties}"
    return f"{where} / {' '.join(p for p in vllm.OPTIONAL[1:] if p in kernel.parameters) or '-'}"


def judged(spec: str, out: Path, examples: int) -> tuple[str, str, str, float]:
    """``spec``'s shape, its verdict over the scenarios, its property verdict (``-`` when
    ``examples`` is 0 or it did not load) and the wall time of both."""
    merged, seconds = verdict(OP, spec, out)
    if merged.startswith("not loaded"):
        return "-", merged, "-", seconds
    property_line = "-"
    if examples:
        property_line, search_seconds = property_search(OP, spec, examples, out)
        seconds += search_seconds
    return shape(spec), merged, property_line, seconds


def judge(version: str, out: Path, examples: int) -> tuple[str, str]:
    """The release's row of each table (module docstring)."""
    shaped, merged, property_line, seconds = judged(f"vllm=={version}", out, examples)
    a2a_shaped, a2a, _, a2a_seconds = judged(f"vllm=={version}:dcp_a2a_lse_reduce", out, 0)
    groups = (
        f"| {version} | {shaped} | {merged} | {property_line} | {a2a_shaped} | {a2a} "
        f"| {seconds + a2a_seconds:.0f} |"
    )
    shaped, merged, property_line, seconds = judged(
        f"vllm=={version}:merge_attn_states", out, examples
    )
    states = f"| {version} | {shaped} | {merged} | {property_line} | {seconds:.0f} |"
    return groups, states


def main() -> None:
    args = start(
        __doc__, "out/lse-combine", RELEASES,
        lambda a: judge(a.row, a.out, a.examples), examples=100,
    )  # fmt: skip
    print(
        "| release | cp_lse_ag_out_rs: file / parameters | cases pass / fail / N/A | "
        "property search | dcp_a2a_lse_reduce: file / parameters | cases | s |\n"
        "|---|---|---|---|---|---|---|"
    )
    states = []
    for lines in rows(args.versions, args.jobs):
        print(lines[0], flush=True)
        states.extend(lines[1:] or lines)  # a row process that failed: its one line
    print(
        "\n| release | merge_attn_states: file / empty chunks | cases pass / fail / N/A | "
        "property search | s |\n|---|---|---|---|---|"
    )
    print("\n".join(states), flush=True)
    end()


if __name__ == "__main__":
    main()
