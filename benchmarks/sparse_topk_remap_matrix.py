"""Judge vLLM's converters of top-k picks to slots in every release and print the verdict
table.

For each release, in one process (``op_matrix``): ``dcpcheck run --op sparse-topk-remap
--kernel vllm==X --dcp 1,2,4,8`` over the op's shipped scenarios (the converters as the
release's sparse backends call them) and its property search (``--property-only --examples
N``), and the same run of ``vllm==X:triton_convert_req_index_to_global_index`` (the
converter alone, under DCP too); the JSON reports are kept under ``--out``. Used for
BENCHMARKS.md's table:

    python3 benchmarks/sparse_topk_remap_matrix.py --out out/sparse-topk-remap

(The releases must be in the cache, ``$DCPCHECK_CACHE`` or ``~/.cache/dcpcheck``, or the
package registry reachable.)
"""

from __future__ import annotations

from pathlib import Path

from op_matrix import print_rows, property_search, start, verdict
from slot_mapping_matrix import RELEASES

OP = "sparse-topk-remap"
CONVERT = "triton_convert_req_index_to_global_index"


def judge(version: str, out: Path, examples: int) -> str:
    """One row of the table (module docstring)."""
    spec = f"vllm=={version}"
    called, seconds = verdict(OP, spec, out)
    alone, alone_seconds = verdict(OP, f"{spec}:{CONVERT}", out)
    property_line, search_seconds = "-", 0.0
    if not called.startswith("not loaded"):
        property_line, search_seconds = property_search(OP, spec, examples, out)
    total = seconds + alone_seconds + search_seconds
    return f"| {version} | {called} | {property_line} | {alone} | {total:.0f} |"


def main() -> None:
    args = start(
        __doc__, "out/sparse-topk-remap", RELEASES,
        lambda a: [judge(a.row, a.out, a.examples)], examples=50,
    )  # fmt: skip
    print(
        "| release | as its callers call them: pass / fail / N/A | property search | "
        f"{CONVERT} alone | s |\n|---|---|---|---|---|"
    )
    print_rows(args.versions, args.jobs)


if __name__ == "__main__":
    main()
