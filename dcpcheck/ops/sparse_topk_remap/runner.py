"""The sparse-topk-remap op's cases, one per scenario and DCP size, as ``CaseResult`` s: the
run's data model the reports and the console already speak. A case builds every rank's
inputs, launches the kernel on each rank and runs the checks, each way its callers call
it (a release's ``asks``: from 0.34.0 each converter, wherever it is called, each finding
naming its function); a kernel that cannot be asked the case has them skipped with the
reason. A scenario that names the fused op's
scenario it reads (``write_side``) runs the end-to-end check instead (``read_write``).
"""

from __future__ import annotations

from dcpcheck.cases.verdicts import CheckResult
from dcpcheck.op_registry import SPARSE_TOPK_REMAP
from dcpcheck.ops import op_cases
from dcpcheck.ops.op_cases import judged_each_way, merged, ways
from dcpcheck.ops.sparse_topk_remap import checks, read_write
from dcpcheck.ops.sparse_topk_remap.case import ReadWriteBatch, RemapBatch, build_case
from dcpcheck.ops.sparse_topk_remap.contract import RemapKernel
from dcpcheck.ops.sparse_topk_remap.scenario import SCENARIOS, scenario_to_toml


def _judged(
    kernel: RemapKernel, batch: RemapBatch | ReadWriteBatch, size: int, device
) -> list[CheckResult]:
    """Every check of the op on one case, each way the kernel is called (``ways``), or
    skipped with the reason it cannot be asked; for a scenario of the end-to-end check,
    that check, with the project's kernel of the fused op writing. A kernel that raises
    propagates (the case's error)."""
    if isinstance(batch, ReadWriteBatch):
        from dcpcheck.ops.fused_norm_rope.kernels import load_kernel
        from dcpcheck.ops.fused_norm_rope.scenario import SCENARIOS as FUSED_SCENARIOS
        from dcpcheck.ops.fused_norm_rope.scenario import load_scenario

        written = load_scenario(FUSED_SCENARIOS / f"{batch.write_side}.toml")
        writer = load_kernel("default")
        return merged([
            (label, [read_write.read_agrees_with_write(
                way, writer, written, size, device, batch.topk, batch.seed, batch.compact,
                batch.count_valid,
            )])
            for label, way, _ in ways(kernel)
        ])  # fmt: skip
    case = build_case(batch, size, device)
    return judged_each_way(
        kernel, case.ranks, lambda launch: checks.judge(launch, case), checks.skipped
    )


OP_CASES = op_cases.OpCases(SPARSE_TOPK_REMAP, SCENARIOS, scenario_to_toml, _judged)
