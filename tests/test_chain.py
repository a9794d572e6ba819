"""The tiny model's DCP decode path through the ops' kernels (``dcpcheck.e2e.chain``):
slot mappings, the fused norm + RoPE + cache write, each rank's decode attention over its
shard, the merge.

A correct chain gives the DCP1 streams at DCP 2, 4 and 8 (``test_token_streams`` runs the
project's kernels at every stage); a wrong kernel at any stage other than the fused op's
breaks the DCP4 streams and not the DCP1 ones, and a release's stages are judged as that
release's runner and MLA backend call them: vLLM 0.12.0's merge lets an empty shard's NaN
through (README, "vLLM's merges, release by release"), 0.33.0's does not. A release whose
MLA layer offers both merges (0.18.0 on) has the chain judged through each: 0.20.0's
both let the empty shard's NaN through; 0.25.0's default all-gather merge gives the
DCP1 streams and its all-to-all cannot pack the Triton MLA decode's bf16 LSE; 0.33.0's
both give the DCP1 streams.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

import pytest

from dcpcheck.e2e.chain import STAGE_NAMES, Stages, parse_stages, stages_for
from dcpcheck.e2e.token_streams import compare_paths, compare_streams, stream_config_for
from dcpcheck.kernels.loading import KernelLoadError, KernelSpecError
from dcpcheck.op_registry import DECODE_CHAIN
from dcpcheck.ops import OpPackageError, package
from dcpcheck.ops.decode_stages import (
    ATTENTION,
    CACHE_WRITE,
    MERGE,
    SLOT_MAPPING,
    AttentionStage,
    CacheWriteStage,
    ChainError,
    MergeStage,
    SlotMappingStage,
    played,
)
from dcpcheck.ops.fused_norm_rope.kernels import load_kernel
from tests.conftest import BACKEND, registry_problem
from tests.forked_commands import run_dcpcheck

REPO = Path(__file__).resolve().parents[1]
CONFIG = stream_config_for(BACKEND, steps=3)
"""The streams ``hash`` and ``run`` generate, three steps long: rank 3 of DCP4 holds no
token of the shortest request (a whole block of four positions per rank)."""


def streams(stages: Stages, dcp_size: int = 4):
    return compare_streams(load_kernel("default"), CONFIG, (dcp_size,), BACKEND.device, stages)


def test_the_project_chain_is_what_every_unnamed_stage_is():
    stages = stages_for("default")
    assert [s.spec for s in (stages.slot_mapping, stages.attention, stages.merge)] == [
        "default"
    ] * 3
    assert streams(stages).identical


@pytest.mark.parametrize(
    ("stage", "spec"),
    [
        (MERGE, "mutant/own-lse-of-next-rank"),
        (MERGE, "mutant/heads-rolled"),
        (MERGE, "mutant/scatter-off-by-one"),
        (SLOT_MAPPING, "mutant/interleave-ignored"),
        (SLOT_MAPPING, "mutant/seq-lens-interleave-ignored"),
        (ATTENTION, "mutant/attention-last-token-dropped"),
    ],
)
def test_a_wrong_stage_breaks_the_dcp4_streams_only(stage, spec):
    comparison = streams(stages_for("default", {stage: spec}))
    assert not comparison.identical
    divergence = comparison.first_divergence
    assert divergence is not None and divergence.dcp_size == 4, divergence
    assert not divergence.near_tie, divergence.describe()


def test_every_stage_is_played_by_the_op_the_registry_names_as_its_record():
    records = {
        CACHE_WRITE: CacheWriteStage,
        SLOT_MAPPING: SlotMappingStage,
        ATTENTION: AttentionStage,
        MERGE: MergeStage,
    }
    assert tuple(records) == (CACHE_WRITE, *STAGE_NAMES)
    for stage, record in records.items():
        assert isinstance(played(stage), record), stage


def test_a_stage_an_op_does_not_play_is_named():
    with pytest.raises(OpPackageError, match="decode_chain: no stage 'merge'"):
        package(DECODE_CHAIN.slot_mapping).decode_stage(MERGE)


def test_stage_options_are_read_strictly():
    assert parse_stages(["merge=vllm==0.33.0", "attention=default"]) == {
        MERGE: "vllm==0.33.0",
        ATTENTION: "default",
    }
    for bad in (["merge"], ["merge="], ["norm=default"], ["merge=a", "merge=b"]):
        with pytest.raises(KernelSpecError):
            parse_stages(bad)
    with pytest.raises(KernelSpecError, match="both the slot mappings and the local lengths"):
        stages_for("default", {SLOT_MAPPING: "vllm==0.33.0:get_dcp_local_seq_lens"})


@functools.cache
def release_stages(version: str) -> Stages:
    try:
        return stages_for(f"vllm=={version}")
    except KernelLoadError as exc:
        problem = registry_problem()
        if problem is not None:
            pytest.skip(f"vllm=={version} is not cached and the registry is unreachable: {problem}")
        raise AssertionError(
            f"the registry answers, yet vllm=={version} did not load: {exc}"
        ) from exc


def test_a_release_chain_takes_every_stage_the_release_has():
    stages = release_stages("0.12.0")
    assert stages.slot_mapping.spec == (
        "vllm==0.12.0:compute_slot_mapping + vllm==0.12.0:get_dcp_local_seq_lens"
    )
    assert (stages.attention.spec, stages.merge.spec) == ("vllm==0.12.0", "vllm==0.12.0")


def test_vllm_0_12_0s_merge_lets_an_empty_shards_nan_through_its_decode_attention():
    """Its Triton decode attention leaves ``0 / 0`` on a rank without a token of the
    request; its merge multiplies that by a factor of 0 (no lengths, no zeroing)."""
    comparison = streams(release_stages("0.12.0"))
    divergence = comparison.first_divergence
    assert divergence is not None and divergence.dcp_size == 4
    assert "here nan" in divergence.describe()
    assert streams(release_stages("0.12.0"), dcp_size=1).identical


def test_what_a_release_cannot_be_asked_is_said_not_run():
    """vLLM 0.10.2's decode attention returns no LSE (its MLA backends did not run under
    DCP): the chain's attention is the project's, with the reason. Its V1 block table
    takes an interleave of 1 only: the streams' interleave of 4 is refused at the first
    step, naming the stage."""
    stages = release_stages("0.10.2")
    assert stages.attention.spec == "default"
    assert "lse" in stages.attention.note
    with pytest.raises(ChainError, match=r"slot-mapping: .*interleave"):
        streams(stages)


def test_a_release_chain_has_every_merge_path_its_mla_layer_offers_the_default_first():
    """Before 0.18.0 the MLA layer calls the all-gather merge alone; from 0.18.0
    ``dcp_comm_backend`` picks it (``"ag_rs"``, the default) or the all-to-all."""
    one = release_stages("0.12.0")
    assert (one.merge.spec, one.merge.path, one.merge.default) == ("vllm==0.12.0", "ag_rs", True)
    assert one.other_merges == () and one.by_merge() == (one,)
    two = release_stages("0.25.0")
    assert (two.merge.spec, two.merge.path, two.merge.default) == ("vllm==0.25.0", "ag_rs", True)
    [a2a] = two.other_merges
    assert (a2a.spec, a2a.path, a2a.default) == ("vllm==0.25.0:dcp_a2a_lse_reduce", "a2a", False)
    assert [chain.merge for chain in two.by_merge()] == [two.merge, a2a]
    assert "merge a2a: vllm==0.25.0:dcp_a2a_lse_reduce" in two.describe()
    assert "merge ag_rs (the release's default): vllm==0.25.0" in two.describe()


def test_vllm_0_33_0s_chain_gives_the_dcp1_streams_through_either_merge():
    default, a2a = compare_paths(
        load_kernel("default"), CONFIG, (4,), BACKEND.device, release_stages("0.33.0")
    )
    assert default.identical and a2a.identical


def hash_streams(tmp_path: Path, *options: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``dcpcheck hash --dcp 1,4 --steps 3 OPTIONS --json ...`` in a process of its own
    (forked: ``tests.forked_commands``): the process and its report."""
    report = tmp_path / "streams.json"
    done = run_dcpcheck(
        ["hash", "--dcp", "1,4", "--steps", "3", *options, "--json", str(report)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=900,
    )
    return done, json.loads(report.read_text())


def test_hash_names_every_stage_and_fails_on_a_wrong_one(tmp_path):
    done, doc = hash_streams(tmp_path, "--stage", "merge=mutant/own-lse-of-next-rank")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "merge: mutant/own-lse-of-next-rank" in done.stdout
    assert doc["chain"][MERGE] == {"spec": "mutant/own-lse-of-next-rank", "note": None}
    [path] = doc["merge_paths"]  # a named merge is the one path judged
    assert (path["path"], path["spec"], path["identical"]) == (
        None,
        "mutant/own-lse-of-next-rank",
        False,
    )
    assert doc["chain"]["fused-norm-rope"]["spec"] == "default"
    assert not doc["identical"]
    assert any(f["path"].endswith("lse_combine/mutants.py") for f in doc["kernel_files"])


def test_vllm_0_20_0s_merges_both_let_an_empty_shards_nan_through():
    """Its all-to-all weighs the empty rank by 0 and multiplies its NaN output by it, as
    its all-gather merge does (the all-gather zeroes it from 0.25.0)."""
    paths = compare_paths(
        load_kernel("default"), CONFIG, (4,), BACKEND.device, release_stages("0.20.0")
    )
    assert [(p.merge.path, p.merge.default) for p in paths] == [("ag_rs", True), ("a2a", False)]
    for path in paths:
        divergence = path.comparison.first_divergence
        assert divergence is not None and divergence.dcp_size == 4
        assert "here nan" in divergence.describe()


def test_hash_judges_every_merge_path_of_a_release_and_fails_on_the_all_to_all_of_0_25_0(
    tmp_path,
):
    """0.25.0's chain runs its own fused kernel (``nvidia/kernels.py``), whose early return
    for a foreign token skips its Q (PR 50005): the streams through its default merge
    diverge at DCP4's first step, with NaN logits. Its all-to-all packs the LSE's 32 bits
    into two slots of the output's dtype (``lse_val.to(tl.uint32, bitcast=True)``), which
    the Triton MLA decode's bf16 LSE cannot be: that path raises, and is reported beside
    the other."""
    release_stages("0.25.0")  # fetched (or skipped) as the other tests fetch it
    done, doc = hash_streams(tmp_path, "--kernel", "vllm==0.25.0")
    assert done.returncode == 1, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert "merge ag_rs (the release's default): vllm==0.25.0: streams differ (DCP4 " in said
    assert "merge a2a: vllm==0.25.0:dcp_a2a_lse_reduce: the kernel raised: " in said
    assert "Cannot bitcast data-type of size 16 to data-type of size 32" in said
    ag_rs, a2a = doc["merge_paths"]
    assert (ag_rs["path"], ag_rs["default"], ag_rs["identical"]) == ("ag_rs", True, False)
    divergence = ag_rs["first_divergence"]
    assert (divergence["dcp_size"], divergence["step"], divergence["finite"]) == (4, 0, False)
    assert not divergence["near_tie"]
    assert (a2a["path"], a2a["default"], a2a["identical"]) == ("a2a", False, False)
    assert a2a["spec"] == "vllm==0.25.0:dcp_a2a_lse_reduce"
    assert a2a["first_divergence"] is None
    assert "Cannot bitcast data-type of size 16 to data-type of size 32" in a2a["error"]
    assert not doc["identical"]
    files = {Path(f["path"]).name for f in doc["kernel_files"]}
    assert {"common.py", "dcp_alltoall.py"} <= files


def test_hash_refuses_an_unknown_stage_with_exit_2(tmp_path):
    done = run_dcpcheck(
        ["hash", "--stage", "norm=default"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=600,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "unknown stage 'norm'" in done.stderr
    assert "Traceback" not in done.stderr


def test_hash_refuses_a_chain_a_release_cannot_run_with_exit_2(tmp_path):
    release_stages("0.10.2")  # fetched (or skipped) as the other tests fetch it
    done = run_dcpcheck(
        ["hash", "--dcp", "1,2", "--steps", "1", "--kernel", "vllm==0.10.2"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=600,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the decode chain cannot run: slot-mapping:" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_dcp_size_that_does_not_divide_the_heads_is_not_applicable_to_the_run():
    """The merge scatters the model's 8 heads: DCP3 cannot share them. The run's
    token-stream case says so and neither passes nor fails."""
    from dcpcheck.cases.verdicts import RunConfig
    from dcpcheck.e2e.stream_case import token_stream_case

    result = token_stream_case(load_kernel("default"), RunConfig("default", (3,)), BACKEND)
    assert result.status == "not_applicable"
    assert "DCP 3 does not divide" in result.error
