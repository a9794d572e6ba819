"""The up-front memory estimate (dcpcheck.ops.fused_norm_rope.cost): it grows with what
sizes a run, the shipped scenarios fit in a small budget, a whole-context GLM-5 prefill does
not fit in a 24 GiB one and is refused on one line naming the file, the key, the estimate
and the budget, and the estimate stays close to the buffers ``build_case`` really allocates.

The estimate's transient ``work`` was calibrated against the peak resident memory of whole
``run_scenario`` runs on the CPU (VmHWM, kernels that write everything or nothing); that
takes too long and too much memory for the suite, so here the persistent parts are held to
the tensors a built case holds."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch

from dcpcheck.cases import memory
from dcpcheck.cases.dcp import Batch, Request
from dcpcheck.cases.scenario_files import ScenarioError
from dcpcheck.ops.fused_norm_rope import case as harness_case
from dcpcheck.ops.fused_norm_rope import cost
from dcpcheck.ops.fused_norm_rope.case import build_case
from dcpcheck.ops.fused_norm_rope.scenario import (
    SCENARIOS,
    Scenario,
    load_scenario,
    load_scenarios,
    scenario_to_toml,
)

GIB = 1 << 30


def variant(name: str, requests: list[tuple[int, int]], padding: int = 0, **changes) -> Scenario:
    """The shipped scenario ``name`` with another batch (and any other ``changes``)."""
    scenario = load_scenario(SCENARIOS / f"{name}.toml")
    batch = Batch(tuple(Request(prefix, new) for prefix, new in requests), padding=padding)
    return dataclasses.replace(scenario, batch=batch, source=None, **changes)


def total(scenario: Scenario, dcp_sizes: tuple[int, ...] | None = None) -> int:
    return cost.estimate_peak_bytes(scenario, dcp_sizes or scenario.dcp_sizes).total


def test_the_restated_harness_constants_agree() -> None:
    """spec sits below the harness, so cost.py restates the guard sizes it cannot import."""
    assert cost.CACHE_GUARD_BLOCKS == harness_case.GUARD_BLOCKS
    assert cost.OUTPUT_GUARD_ROWS == harness_case.OUTPUT_GUARD_ROWS


def test_the_estimate_grows_with_new_tokens() -> None:
    totals = [total(variant("indexer-sharded", [(6, new)])) for new in (1, 16, 256, 4000)]
    assert totals == sorted(set(totals))


def test_the_estimate_grows_with_the_cached_prefix() -> None:
    totals = [total(variant("indexer-sharded", [(prefix, 8)])) for prefix in (0, 100, 4000)]
    assert totals == sorted(set(totals))


def test_the_estimate_grows_with_the_dcp_size() -> None:
    scenario = variant("glm5-prefill-512", [(64, 512)])
    totals = [total(scenario, (1, n)) for n in (2, 4, 8, 16, 64)]
    assert totals == sorted(set(totals))
    assert total(scenario, (1,)) < totals[0]
    # The DCP1 baseline always runs, and cases run one at a time: 1,4 costs what 4 does.
    assert total(scenario, (4,)) == total(scenario, (1, 4)) == total(scenario, (2, 4))


@pytest.mark.parametrize("scenario", load_scenarios([]), ids=lambda s: s.name)
def test_every_shipped_scenario_fits_in_2_gib(scenario: Scenario) -> None:
    for sizes in (scenario.dcp_sizes, (1, 4), (1, 8)):
        estimate = cost.check_cost(scenario, sizes, 2 * GIB)
        assert 0 < estimate.total < 2 * GIB


def test_a_whole_context_glm5_prefill_is_refused_under_24_gib(tmp_path: Path) -> None:
    """202,000 new tokens of GLM-5 are within every limit (the preset
    has 202,752 positions), loaded fine, then held 16 GB after 2 minutes and died. Now the
    run is refused up front, on one line, naming the file and what drives the size."""
    template = load_scenario(SCENARIOS / "glm5-prefill-512.toml")
    path = tmp_path / "glm5-prefill-202000.toml"
    huge = dataclasses.replace(
        template, name=path.stem, batch=Batch((Request(0, 202_000),)), source=None
    )
    path.write_text(scenario_to_toml(huge), encoding="utf-8")
    scenario = load_scenario(path)  # legal: the limits let it through

    estimate = cost.estimate_peak_bytes(scenario, scenario.dcp_sizes)
    assert estimate.total > 24 * GIB
    with pytest.raises(ScenarioError) as raised:
        cost.check_cost(scenario, scenario.dcp_sizes, 24 * GIB)
    message = str(raised.value)
    assert message.startswith(f"{path}: key 'requests[0].new': a run at DCP 1, 4 would hold about ")
    assert f"{memory.format_bytes(estimate.total)} at its peak" in message
    assert message.endswith("over the memory budget of 24.0 GiB")
    assert "\n" not in message


def test_a_scenario_within_budget_or_without_one_is_not_refused() -> None:
    huge = variant("glm5-prefill-512", [(0, 202_000)])
    estimate = cost.check_cost(huge, (1, 4), None)  # no budget known: nothing refused
    assert cost.check_cost(huge, (1, 4), estimate.total) == estimate  # exactly at the budget


# (case id, the scenario, the key its error must name)
DRIVERS = [
    ("new-tokens", variant("glm5-prefill-512", [(0, 1), (0, 200_000)]), "requests[1].new"),
    ("cached-prefix", variant("glm5-prefill-512", [(0, 1), (200_000, 1)]), "requests[1].prefix"),
    ("padding", variant("glm5-prefill-512", [(0, 1)], padding=1024), "padding"),
    (
        "block-size",
        variant("indexer-sharded", [(10, 5), (100, 3)], block_size=1024, dcp_sizes=(1, 64)),
        "block_size",
    ),
    ("dcp-size", variant("indexer-sharded", [(0, 8)], dcp_sizes=(1, 64)), "dcp"),
]


@pytest.mark.parametrize(("scenario", "key"), [d[1:] for d in DRIVERS], ids=[d[0] for d in DRIVERS])
def test_the_error_names_the_key_that_drives_the_size(scenario: Scenario, key: str) -> None:
    with pytest.raises(ScenarioError) as raised:
        cost.check_cost(scenario, scenario.dcp_sizes, 1)
    assert str(raised.value).startswith(f"scenario '{scenario.name}': key '{key}': ")


def _tensors(value: object, seen: set[int]):
    """Every tensor reachable from ``value`` through dataclasses, lists, tuples and dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type | Scenario):
        if id(value) not in seen:
            seen.add(id(value))
            for field in dataclasses.fields(value):
                yield from _tensors(getattr(value, field.name), seen)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item, seen)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item, seen)


def allocated_bytes(*cases: harness_case.Case) -> int:
    """Bytes of the distinct storages the cases hold (views counted once)."""
    storages = {}
    for tensor in _tensors(list(cases), set()):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


@pytest.mark.parametrize(
    ("name", "dcp_size"),
    [("glm5-prefill-1536-prefix", 4), ("indexer-replicated", 4), ("block-size-1-dcp8", 8)],
)
def test_the_estimate_is_close_to_what_build_case_allocates(name: str, dcp_size: int) -> None:
    """What ``run_scenario`` holds once its DCP1 baseline and a DCPn case are built (both
    sharing one set of activations and one oracle answer), against the estimate: all of it
    within [0.5, 4] of the buffers, and its persistent parts (all but the transient work)
    within [0.9, 1.25]."""
    scenario = load_scenario(SCENARIOS / f"{name}.toml")
    device = torch.device("cpu")
    baseline = build_case(scenario, 1, device)
    other = build_case(
        scenario, dcp_size, device, activations=baseline.activations, expected=baseline.expected
    )
    allocated = allocated_bytes(baseline, other)

    estimate = cost.estimate_peak_bytes(scenario, (1, dcp_size))
    assert 0.5 * allocated <= estimate.total <= 4 * allocated
    persistent = estimate.total - estimate.work
    assert 0.9 * allocated <= persistent <= 1.25 * allocated


def test_the_cpu_budget_is_the_available_ram() -> None:
    budget = memory.available_memory(torch.device("cpu"))
    assert budget is not None and budget > 0
    if memory.MEMINFO.exists():
        fields = dict(line.split(":", 1) for line in memory.MEMINFO.read_text().splitlines())
        assert budget <= int(fields["MemTotal"].split()[0]) * 1024


def test_without_proc_meminfo_the_cpu_budget_comes_from_sysconf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory, "MEMINFO", tmp_path / "no-meminfo")
    pages = {"SC_AVPHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(os, "sysconf", pages.__getitem__)
    assert memory.available_memory(torch.device("cpu")) == 4_096_000


def test_the_cuda_budget_is_the_free_device_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = []

    def mem_get_info(device: torch.device) -> tuple[int, int]:
        asked.append(device)
        return 5 * GIB, 141 * GIB

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    assert memory.available_memory(torch.device("cuda", 1)) == 5 * GIB
    assert asked == [torch.device("cuda", 1)]


def test_sizes_are_written_for_a_person() -> None:
    assert memory.format_bytes(24 * GIB) == "24.0 GiB"
    assert memory.format_bytes(int(1.25 * GIB)) == "1.2 GiB"
    assert memory.format_bytes(300 << 20) == "300.0 MiB"
    assert memory.format_bytes(0) == "0.0 MiB"


def test_an_oversized_run_is_refused_before_the_backend_opens(tmp_path: Path) -> None:
    """A refusal costs what a usage error costs (about 2 s and 240 MB here),
    so it comes before the backend imports Triton and installs the interpreter's
    patches (80 MB more): no backend line is printed, nothing of Triton is loaded."""
    import subprocess
    import sys

    template = load_scenario(SCENARIOS / "glm5-prefill-512.toml")
    huge = dataclasses.replace(  # about 200 GiB at DCP 64: more than an H200 has free
        template, name="huge", batch=Batch((Request(0, 202_000),)), dcp_sizes=(1, 64), source=None
    )
    (tmp_path / "huge.toml").write_text(scenario_to_toml(huge), encoding="utf-8")
    probe = (
        "import sys\n"
        "from dcpcheck.cli import cli\n"
        "try:\n"
        "    cli(['run', '--scenario-dir', sys.argv[1], '--scenario', 'huge', '--no-tokens'])\n"
        "except SystemExit as exc:\n"
        "    print('exit', exc.code, sorted(m for m in sys.modules if m.startswith('triton')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "exit 2 []", (done.stdout, done.stderr)
    assert "key 'requests[0].new'" in done.stderr and "backend:" not in done.stderr
