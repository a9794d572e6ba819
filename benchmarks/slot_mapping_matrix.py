"""Judge vLLM's routines of the slot-mapping op in every release that has them and print
the verdict table.

For each release, in one process (``op_matrix``): ``dcpcheck run --op slot-mapping
--kernel vllm==X --dcp 1,2,4,8`` over the op's shipped scenarios (every routine of the op
the release has, each judged on every case), its property search (``--property-only
--examples N``), and the same run of each routine named alone: the GPU model runner's
``vllm==X:_compute_slot_mappings_kernel`` (0.12.0 on), the attention backends'
``vllm==X:get_dcp_local_seq_lens`` (0.11.1 on) and the V1 runner's
``vllm==X:compute_slot_mapping``; the JSON reports are kept under ``--out``.
A row gives the slot kernel's parameters that changed (its API shape), what the adapter
read from the caller, the cases passed, failed and not applicable, the findings, why
checks were skipped, the property verdict and the wall time. Used for BENCHMARKS.md's
slot-mapping table:

    python3 benchmarks/slot_mapping_matrix.py --out out/slot-mapping

(The releases must be in the cache, ``$DCPCHECK_CACHE`` or ``~/.cache/dcpcheck``, or the
package registry reachable.)
"""

from __future__ import annotations

from pathlib import Path

from op_matrix import print_rows, property_search, start, verdict

OP = "slot-mapping"

RELEASES = [
    *("0.10.2", "0.11.0", "0.11.1", "0.11.2"),
    *("0.12.0", "0.13.0", "0.14.0", "0.14.1", "0.15.0", "0.15.1", "0.16.0", "0.17.0"),
    *("0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2"),
    *("0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0"),
    *("0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"),
]
"""Every published release with one of the op's routines, oldest first."""

SHAPE_PARAMETERS = ("num_tokens", "idx_mapping", "cp_rank", "kernel_block_sizes", "dcp_sharded")
"""The parameters whose coming and going make the kernel's API shapes."""


def shape(version: str) -> str:
    """The release kernel's shape parameters and what was read from its caller (after a
    run of it in this process: the backend is chosen and the release is loaded)."""
    from dcpcheck.ops import package
    from dcpcheck.ops.op_cases import named_routines
    from dcpcheck.ops.slot_mapping.vllm import VllmSlotMappings

    routines = named_routines(package(OP).kernel(f"vllm=={version}").slot_mappings)
    runner = [kernel for _, kernel in routines if isinstance(kernel, VllmSlotMappings)]
    if not runner:  # before the GPU runner: the V1 table
        return "no GPU runner: the V1 runner's BlockTable"
    kernel = runner[0]
    parameters = " ".join(p for p in SHAPE_PARAMETERS if p in kernel.parameters) or "-"
    parameters += f" / tables in {kernel.blocks.kind}: {kernel.blocks.evidence}"
    if kernel.caller is None:
        return parameters
    rows = "padded" if kernel.caller.padded else "scheduled"
    return f"{parameters} / {rows} rows: {kernel.caller.evidence}"


def judge(version: str, out: Path, examples: int) -> str:
    """One row of the table (module docstring)."""
    every, seconds = verdict(OP, f"vllm=={version}", out)
    runner, runner_seconds = verdict(OP, f"vllm=={version}:_compute_slot_mappings_kernel", out)
    function, function_seconds = verdict(OP, f"vllm=={version}:get_dcp_local_seq_lens", out)
    v1_table, v1_seconds = verdict(OP, f"vllm=={version}:compute_slot_mapping", out)
    search_seconds = 0.0
    property_line = shaped = "-"
    if not every.startswith("not loaded"):
        property_line, search_seconds = property_search(OP, f"vllm=={version}", examples, out)
        shaped = shape(version)
    total = seconds + runner_seconds + function_seconds + v1_seconds + search_seconds
    return (
        f"| {version} | {shaped} | {every} | {property_line} | {runner} | {function} "
        f"| {v1_table} | {total:.0f} |"
    )


def main() -> None:
    args = start(
        __doc__, "out/slot-mapping", RELEASES,
        lambda a: [judge(a.row, a.out, a.examples)], examples=100,
    )  # fmt: skip
    print(
        "| release | slot kernel's shape parameters / caller rows | every routine: "
        "cases pass / fail / N/A | their property search | _compute_slot_mappings_kernel | "
        "get_dcp_local_seq_lens | the V1 runner's BlockTable.compute_slot_mapping | s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print_rows(args.versions, args.jobs)


if __name__ == "__main__":
    main()
