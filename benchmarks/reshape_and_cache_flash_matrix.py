"""Judge vLLM's ``triton_reshape_and_cache_flash`` in every release and print the verdict
table.

For each release, in one process (``op_matrix``): ``dcpcheck run --op
reshape-and-cache-flash --kernel vllm==X --dcp 1,2,4,8`` over the op's shipped scenarios
(the function as the release's attention backends call it: DCP>1 is not applicable where
the backend refuses it, with the line) and its property search (``--property-only
--examples N``); the JSON reports are kept under ``--out``. Used for BENCHMARKS.md's table:

    python3 benchmarks/reshape_and_cache_flash_matrix.py --out out/reshape-and-cache-flash

(The releases must be in the cache, ``$DCPCHECK_CACHE`` or ``~/.cache/dcpcheck``, or the
package registry reachable.)
"""

from __future__ import annotations

from pathlib import Path

from op_matrix import print_rows, property_search, start, verdict
from slot_mapping_matrix import RELEASES

OP = "reshape-and-cache-flash"


def judge(version: str, out: Path, examples: int) -> str:
    """One row of the table (module docstring)."""
    spec = f"vllm=={version}"
    called, seconds = verdict(OP, spec, out)
    property_line, search_seconds = "-", 0.0
    if not called.startswith("not loaded"):
        property_line, search_seconds = property_search(OP, spec, examples, out)
    return f"| {version} | {called} | {property_line} | {seconds + search_seconds:.0f} |"


def main() -> None:
    args = start(
        __doc__, "out/reshape-and-cache-flash", RELEASES,
        lambda a: [judge(a.row, a.out, a.examples)], examples=50,
    )  # fmt: skip
    print(
        "| release | as its callers call it: pass / fail / N/A | property search | s |\n"
        "|---|---|---|---|"
    )
    print_rows(args.versions, args.jobs)


if __name__ == "__main__":
    main()
