"""The up-front memory estimate of the op packages (``dcpcheck.ops.<op>.cost``, checked
against ``dcpcheck.cases.memory``'s budget as the fused op's is): every shipped scenario
fits in a small budget; the tensors a built and launched case holds are exactly the
estimate's parts besides its working memory; and a scenario within the op's limits that
would hold more than any machine here has is refused on one line, naming the file and the
key, before the backend opens and before any report is written, by ``run --op`` and by
``repro``.

The working memory (transients) was compared with the peak resident memory of whole runs
on the CPU, beyond that of a shipped scenario's run: the estimate came out at 1.3x to 1.7x
of it for lse-combine, 1.15x for sparse-topk-remap and 1.5x for slot-mapping; those runs
take minutes, so they are not repeated here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dcpcheck.cases import memory
from dcpcheck.cases.scenario_files import ScenarioError
from dcpcheck.op_registry import (
    LSE_COMBINE,
    RESHAPE_AND_CACHE_FLASH,
    SLOT_MAPPING,
    SPARSE_TOPK_REMAP,
)
from dcpcheck.ops import package, runner_ops
from dcpcheck.ops.lse_combine import case as combine_case
from dcpcheck.ops.lse_combine.case import CombineBatch
from dcpcheck.ops.slot_mapping import case as slots_case
from dcpcheck.ops.slot_mapping import checks as slots_checks
from dcpcheck.ops.slot_mapping.case import SlotMappingBatch
from dcpcheck.ops.sparse_topk_remap import case as remap_case
from dcpcheck.ops.sparse_topk_remap import checks as remap_checks
from dcpcheck.ops.sparse_topk_remap.case import RemapBatch
from tests.test_cost import allocated_bytes

REPO = Path(__file__).parents[1]
CPU = torch.device("cpu")
WORK = "working memory"


def _shipped():
    ops = [package(op) for op in runner_ops()]
    return [(op.name, s) for op in ops for s in op.load_scenarios([], op.scenarios)]


@pytest.mark.parametrize(("op", "scenario"), _shipped(), ids=lambda v: getattr(v, "name", v))
def test_every_shipped_scenario_fits_in_256_mib(op, scenario):
    peak = package(op).check_cost(scenario, scenario.dcp_sizes, 256 * memory.MIB)
    assert 0 < peak.total < 256 * memory.MIB


def _persistent(peak: memory.Peak) -> int:
    return sum(held for what, held in peak.parts.items() if not what.startswith(WORK))


class _Named:
    """A scenario of a batch, as ``check_cost`` reads one."""

    def __init__(self, batch, dcp_sizes: tuple[int, ...]) -> None:
        self.name, self.source, self.batch, self.dcp_sizes = "built", None, batch, dcp_sizes


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_lse_combine_counts_what_a_built_case_holds(dtype):
    batch = CombineBatch(((5, 1), (40, 3), (1, 1)), heads=8, head_dim=16, dtype=dtype, padding=2)
    built = combine_case.build_case(batch, 4, CPU)
    peak = package(LSE_COMBINE).check_cost(_Named(batch, (4,)), (4,), None)
    assert _persistent(peak) == allocated_bytes(built)


def test_sparse_topk_remap_counts_what_a_launched_case_holds():
    batch = RemapBatch(((300, 2), (70, 1)), topk=16, block_size=8, padding=3)
    built = remap_case.build_case(batch, 4, CPU)
    before = remap_checks.snapshot(built)
    launched = remap_case.launch_all(lambda inputs, out, counts: None, built)
    peak = package(SPARSE_TOPK_REMAP).check_cost(_Named(batch, (4,)), (4,), None)
    assert _persistent(peak) == allocated_bytes(launched, before)


def test_slot_mapping_counts_what_a_launched_case_holds():
    batch = SlotMappingBatch(((37, 1), (0, 9), (100, 4)), (16, 4), (True, False), padding=5)
    built = slots_case.build_case(batch, 4, CPU)
    before = slots_checks.snapshot(built)
    launched = slots_case.launch_all(lambda inputs, out: None, built)
    peak = package(SLOT_MAPPING).check_cost(_Named(batch, (4,)), (4,), None)
    assert _persistent(peak) == allocated_bytes(launched, before)


def _requests(*tables: dict[str, int]) -> list[str]:
    lines = []
    for table in tables:
        lines += ["", "[[requests]]", *(f"{key} = {value}" for key, value in table.items())]
    return lines


OVERSIZED = {
    # the issue's: 256 heads of 1,024 fp32 values, DCP 64, 1,024 requests of 131,072
    LSE_COMBINE: (
        [
            'heads = 256', 'head_dim = 1024', 'dtype = "float32"', 'dcp = [64]', 'seed = 0',
            *_requests(*[{"context": 131_072}] * 1024),
        ],
        "head_dim",
    ),
    # top-k 4,096 at DCP 64 over 1,024 requests of 16 rows, one of them a context of a
    # million tokens in blocks of one: every rank's copy of a table a million wide
    SPARSE_TOPK_REMAP: (
        [
            'topk = 4096', 'block_size = 1', 'dcp = [64]', 'seed = 0',
            *_requests({"context": 1_000_000, "rows": 16}, *[{"context": 16, "rows": 16}] * 1023),
        ],
        "requests[0].context",
    ),
    # one request of a million cached tokens among 1,024, three groups of block size 1
    SLOT_MAPPING: (
        [
            'block_sizes = [1, 1, 1]', 'sharded = [true, true, false]', 'dcp = [64]', 'seed = 0',
            *_requests({"prefix": 1_000_000, "new": 1}, *[{"new": 16}] * 1023),
        ],
        "requests[0].prefix",
    ),
    # 64 fp32 heads of 512 over a million cached tokens at DCP 64: every rank's cache
    RESHAPE_AND_CACHE_FLASH: (
        [
            'kv_heads = 64', 'head_size = 512', 'dtype = "float32"', 'block_size = 16',
            'dcp = [64]', 'seed = 0', *_requests({"prefix": 1_000_000, "new": 8192}),
        ],
        "kv_heads",
    ),
}  # fmt: skip
"""A scenario per op within its limits and over any machine's memory, with the key its
refusal names: the keys are each op's own, so the table is kept by hand, and
``test_every_packaged_op_has_an_oversized_scenario`` holds it to the registry."""


def test_every_packaged_op_has_an_oversized_scenario():
    assert sorted(OVERSIZED) == sorted(runner_ops())


@pytest.mark.parametrize("command", ["run", "repro"])
@pytest.mark.parametrize("op", sorted(OVERSIZED))
def test_an_oversized_scenario_is_refused_before_the_backend_opens(tmp_path, op, command):
    """Within every limit of the op, more than any machine here has (hundreds of GiB to
    TiB): exit 2 on one line naming the file and the key, no report, nothing of Triton
    loaded. Run, these ended in an allocator's traceback, with no ``--json`` written."""
    body, key = OVERSIZED[op]
    path = tmp_path / "huge.toml"
    path.write_text(
        "\n".join([f'op = "{op}"', 'name = "huge"', 'description = "oversized"', *body]) + "\n",
        encoding="utf-8",
    )
    report = tmp_path / "report.json"
    args = (
        ["run", "--op", op, "--scenario-dir", str(tmp_path)]
        if command == "run"
        else ["repro", str(path)]
    )
    probe = (
        "import sys\n"
        "from dcpcheck.cli import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "except SystemExit as exc:\n"
        "    print('exit', exc.code, sorted(m for m in sys.modules if m.startswith('triton')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *args, "--json", str(report)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.stdout.strip() == "exit 2 []", (done.stdout, done.stderr[-3000:])
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"dcpcheck: error: {path}: key '{key}': a run at DCP 64 would hold ")
    assert "over the memory budget of" in line
    assert not report.exists()


def test_a_refusal_names_the_estimate_and_the_budget():
    batch = SlotMappingBatch(((1000, 24),), (16,), (True,))
    peak = package(SLOT_MAPPING).check_cost(_Named(batch, (1, 4)), (1, 4), None)
    with pytest.raises(ScenarioError) as raised:
        package(SLOT_MAPPING).check_cost(_Named(batch, (1, 4)), (1, 4), peak.total - 1)
    message = str(raised.value)
    assert message.startswith("scenario 'built': key '")
    assert f"a run at DCP 1, 4 would hold about {memory.format_bytes(peak.total)} at its peak" in (
        message
    )
    assert message.endswith(f"over the memory budget of {memory.format_bytes(peak.total - 1)}")
