"""Token streams of the tiny MLA model under DCP1 and DCPn (docs/dcp-contract.md).

A correct kernel must give the same SHA256 stream digests at every DCP size and on every
rank; a kernel with a DCP flaw must not, and the report must point at the first diverging
token with a DCP1 margin past its rounding bound, or NaN logits (a genuine bug, not a
near-tie). Most tests use the oracle
kernel (fast on the CPU); one small test runs the project's Triton kernels through the
registry, on the interpreter here and natively on a GPU.

The default configuration (3 prompts of 4..9 tokens, 12 steps, block size 4) gives
requests of up to 20 tokens: past several block boundaries at DCP1/2/4, and at DCP8
(virtual block of 32) short requests leave whole ranks with an empty shard.
"""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import torch

import reference
from dcpcheck.e2e.token_streams import (
    CPU_PRESET,
    GPU_PRESET,
    Divergence,
    StreamComparison,
    StreamConfig,
    Streams,
    bf16_ulp,
    build_model,
    compare_streams,
    generate,
    prompt_tokens,
    stream_config_for,
    token_digest,
)
from dcpcheck.ops.fused_norm_rope.contract import (
    FusedOpCaches,
    FusedOpInputs,
    FusedOpOutputs,
)
from dcpcheck.ops.fused_norm_rope.kernels import load_kernel
from dcpcheck.ops.lse_combine.contract import CombineInputs, Merged
from tests.conftest import BACKEND, requires_cuda
from tests.kernels_under_test import fast_stages, oracle_kernel, skips_foreign_kv, torch_merge

DCP_SIZES = (2, 4, 8)
CONFIG = StreamConfig(steps=12)
LAYOUTS = {
    "auto": StreamConfig(steps=12),
    "fp8": StreamConfig(steps=12, cache_layout="fp8", mla_scale=0.5),
    "fp8_ds_mla": StreamConfig(steps=12, cache_layout="fp8_ds_mla"),
    "nvfp4_ds_mla": StreamConfig(steps=12, cache_layout="nvfp4_ds_mla"),
}
FAST = fast_stages()
"""The chain's attention and merge in torch (``kernels_under_test``): the oracle kernel's
tests are about the fused op's stage, and the interpreter runs the Triton ones slowly."""
TRITON_CONFIG = StreamConfig(prompts=2, max_prompt_length=6, steps=3)
"""Small enough for Triton's interpreter: 2 requests, 3 generated tokens each."""


def assert_identical(comparison: StreamComparison) -> None:
    assert comparison.first_divergence is None, comparison.first_divergence.describe()
    assert comparison.identical
    baseline = comparison.digests[0]
    for digests in comparison.digests:
        assert digests.requests == baseline.requests, (digests.dcp_size, digests.rank)


def assert_diverges_at_dcp(comparison: StreamComparison, dcp_size: int) -> None:
    """Ranks of ``dcp_size`` hash differently from DCP1, and the first divergence is a
    genuine one at that size."""
    assert not comparison.identical
    divergence = comparison.first_divergence
    assert divergence is not None
    assert divergence.dcp_size == dcp_size
    assert not divergence.near_tie, divergence.describe()
    assert not divergence.finite or divergence.baseline_margin > divergence.bound
    baseline = comparison.runs[0]
    assert divergence.baseline_token == int(baseline.tokens[0, divergence.request, divergence.step])
    assert divergence.token != divergence.baseline_token
    assert "genuine divergence" in divergence.describe()


@pytest.fixture(scope="module")
def oracle_streams(device):
    """The correct kernel's comparison for every cache layout (shared by several tests)."""
    return {
        name: compare_streams(oracle_kernel, config, DCP_SIZES, device, stages=FAST)
        for name, config in LAYOUTS.items()
    }


@pytest.mark.parametrize("layout", LAYOUTS)
def test_correct_kernel_gives_identical_streams_at_every_dcp_size(oracle_streams, layout):
    comparison = oracle_streams[layout]
    assert [run.dcp_size for run in comparison.runs] == [1, *DCP_SIZES]
    assert len(comparison.digests) == 1 + sum(DCP_SIZES)  # one per rank of every run
    assert_identical(comparison)
    tokens = comparison.runs[0].tokens[0]
    assert tokens.shape == (CONFIG.prompts, CONFIG.steps)
    for request in tokens:  # the streams are not degenerate
        assert len(set(request.tolist())) > 1
    assert torch.isfinite(comparison.runs[0].margins).all()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_correct_kernels_margins_move_less_than_their_bound_between_dcp_sizes(
    oracle_streams, layout
):
    """The bound that decides a near-tie covers what the arithmetic of another DCP size
    does to every step's margin (identical tokens, so every step is comparable)."""
    comparison = oracle_streams[layout]
    baseline = comparison.runs[0]
    assert (baseline.bounds[0] > 0).all() and torch.isfinite(baseline.bounds).all()
    for run in comparison.runs[1:]:
        assert run.finite.all()
        moved = (run.margins - baseline.margins[0]).abs()
        assert (moved <= baseline.bounds[0]).all(), (
            run.dcp_size,
            (moved / baseline.bounds[0]).max(),
        )


def test_the_bound_is_one_bf16_step_per_element_of_the_lm_heads_input():
    assert bf16_ulp(torch.tensor([1.0, 1.5, 0.75, -3.0, 2.0**-10])).tolist() == [
        2.0**-7,
        2.0**-7,
        2.0**-8,
        2.0**-6,
        2.0**-17,
    ]
    assert torch.tensor(1.0 + 2.0**-7).bfloat16().float() != 1.0  # one step up is bf16's


@pytest.mark.parametrize("interleave", [2, 4])
def test_interleaved_ownership_gives_identical_streams(device, interleave):
    """Runs of 2 positions per rank, and a whole block per rank (a short request then
    lives on rank 0 alone: one shard holds everything)."""
    config = StreamConfig(steps=8, interleave=interleave, seed=3)
    assert_identical(compare_streams(oracle_kernel, config, DCP_SIZES, device, stages=FAST))


def test_cache_layout_changes_the_streams(oracle_streams):
    """Decode reads the caches: the fp8 layouts' quantization shows in the logits (every
    step's top-2 margin), whether or not it flips a greedy token."""
    auto = oracle_streams["auto"].runs[0].margins
    assert not torch.equal(oracle_streams["fp8"].runs[0].margins, auto)
    assert not torch.equal(oracle_streams["fp8_ds_mla"].runs[0].margins, auto)


def test_pr_54908_flaw_diverges_under_dcp4_only(device, oracle_streams):
    comparison = compare_streams(skips_foreign_kv, CONFIG, (4,), device, stages=FAST)
    assert_diverges_at_dcp(comparison, 4)
    divergence = comparison.first_divergence
    # Every prompt's prefill has foreign tokens on every rank: the very first token breaks,
    # and the NaN-poisoned kv_out rows reach the logits.
    assert divergence.step == 0
    assert divergence.margin != divergence.margin  # NaN
    assert comparison.digests[0] == oracle_streams["auto"].digests[0]  # DCP1 hides the flaw


def skips_cache_write(
    inputs: FusedOpInputs, outputs: FusedOpOutputs, caches: FusedOpCaches
) -> None:
    """Correct outputs, but the cache keeps its old (random) bytes."""
    before = caches.mla.clone()
    oracle_kernel(inputs, outputs, caches)
    caches.mla.copy_(before)


def test_decode_reads_what_the_kernel_wrote(device, oracle_streams):
    """Without cache writes the chunked prefill and decode attend over random bytes, so
    even the DCP1 stream changes: the model really consumes the kernel's cache."""
    broken = generate(skips_cache_write, CONFIG, 1, device, stages=FAST)
    assert not torch.equal(broken.tokens, oracle_streams["auto"].runs[0].tokens)


def test_generation_is_deterministic(device, oracle_streams):
    again = generate(oracle_kernel, CONFIG, 4, device, stages=FAST)
    first = oracle_streams["auto"].runs[2]
    assert first.dcp_size == 4
    assert torch.equal(again.tokens, first.tokens)
    assert torch.equal(again.margins, first.margins)
    assert torch.equal(again.bounds, first.bounds)


def test_prompts_have_distinct_lengths():
    lengths = [len(p) for p in prompt_tokens(CONFIG)]
    assert len(set(lengths)) == CONFIG.prompts
    assert min(lengths) >= 4


def test_digests_hash_little_endian_int32_token_ids(oracle_streams):
    assert (
        token_digest([1, 256, -1])
        == hashlib.sha256(
            b"\x01\x00\x00\x00" + b"\x00\x01\x00\x00" + b"\xff\xff\xff\xff"
        ).hexdigest()
    )
    run = oracle_streams["auto"].runs[0]
    requests = [row.tolist() for row in run.tokens[0]]
    as_bytes = [b"".join(t.to_bytes(4, "little", signed=True) for t in r) for r in requests]
    assert run.request_digests(0) == tuple(hashlib.sha256(b).hexdigest() for b in as_bytes)
    assert run.stream_digest(0) == hashlib.sha256(b"".join(as_bytes)).hexdigest()


def model_tensors(model) -> dict[str, torch.Tensor]:
    tensors = {"embedding": model.embedding, "final_norm": model.final_norm}
    tensors |= {"lm_head": model.lm_head, "cos_sin": model.cos_sin}
    for index, layer in enumerate(model.layers):
        tensors |= {f"layers.{index}.{k}": v for k, v in vars(layer).items()}
    return tensors


def test_the_model_has_the_same_bits_on_every_device(device):
    """Drawn by ``seeded`` where it runs, the model is bit for bit the model the CPU
    draws: a stream hashed on the H200 is the stream a laptop hashes at the same widths."""
    on_cpu = model_tensors(build_model(CONFIG, torch.device("cpu")))
    here = model_tensors(build_model(CONFIG, device))
    assert here.keys() == on_cpu.keys()
    for name, tensor in on_cpu.items():
        assert (here[name].device.type, here[name].dtype) == (device.type, tensor.dtype)
        assert torch.equal(here[name].cpu().view(torch.uint8), tensor.view(torch.uint8)), name


def test_every_weight_is_a_draw_of_its_own():
    """No two weight tensors repeat each other's values (each is its own ``seeded``
    stream): a model whose layers were copies would hide a layer-dependent bug."""
    tensors = model_tensors(build_model(CONFIG, torch.device("cpu")))
    firsts = {
        name: tuple(t.flatten()[:8].tolist()) for name, t in tensors.items() if name != "cos_sin"
    }
    assert len(set(firsts.values())) == len(firsts)


def test_a_divergence_is_a_near_tie_only_within_the_bound_with_finite_logits():
    near = Divergence(4, 1, 0, 5, 17, 18, 0.004, 0.003, bound=0.009, finite=True)
    assert near.near_tie
    assert "near-tie" in near.describe() and "rounding bound 0.009" in near.describe()
    # The H200's merge mutant: a DCP1 margin of 0.0168 is past a bound of about 0.009.
    assert not Divergence(4, 1, 0, 5, 17, 18, 0.0168, 0.01, bound=0.009, finite=True).near_tie
    # NaN logits are never rounding, however narrow the DCP1 margin.
    nan = Divergence(4, 1, 0, 0, 21, 0, 0.004, float("nan"), bound=0.009, finite=False)
    assert not nan.near_tie
    assert "here nan with non-finite logits): genuine divergence" in nan.describe()
    # A non-finite row whose top two are finite (an inf elsewhere) is genuine too.
    assert not Divergence(4, 1, 0, 0, 21, 0, 0.004, 0.004, bound=0.009, finite=False).near_tie


def assert_no_step_within_its_bound(streams: Streams) -> None:
    """Every DCP1 step's margin is past its rounding bound: no divergence from these
    streams can be excused as a near-tie."""
    assert streams.dcp_size == 1 and streams.finite.all()
    clearance = streams.margins[0] / streams.bounds[0]
    assert (clearance > 1).all(), f"a step's margin is {clearance.min():.3g}x its bound"


@pytest.mark.parametrize("layout", list(reference.MLA_LAYOUTS))
def test_the_default_cpu_streams_have_no_near_tie(device, layout):
    """``dcpcheck hash`` and ``dcpcheck run`` on the CPU (every layout ``hash`` takes)."""
    config = stream_config_for(BACKEND, layout, preset=CPU_PRESET)
    assert_no_step_within_its_bound(generate(load_kernel("default"), config, 1, device))


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("layout", list(reference.MLA_LAYOUTS))
def test_the_default_gpu_streams_have_no_near_tie(device, layout):
    config = stream_config_for(BACKEND, layout, preset=GPU_PRESET)
    assert_no_step_within_its_bound(generate(load_kernel("default"), config, 1, device))


def drops_the_last_shard(inputs: CombineInputs) -> Merged:
    """A wrong merge with finite output: the last rank's partial gets no weight."""
    last = inputs.group.rank_in_group == inputs.group.world_size - 1
    lse = torch.full_like(inputs.partial_lse, float("-inf")) if last else inputs.partial_lse
    return torch_merge(dataclasses.replace(inputs, partial_lse=lse))


def test_a_wrong_merge_with_finite_logits_is_a_genuine_divergence(device):
    stages = dataclasses.replace(
        FAST, merge=dataclasses.replace(FAST.merge, kernel=drops_the_last_shard)
    )
    comparison = compare_streams(oracle_kernel, CONFIG, (4,), device, stages=stages)
    assert_diverges_at_dcp(comparison, 4)
    assert comparison.first_divergence.finite


def test_config_rejects_inconsistent_fields():
    with pytest.raises(ValueError, match="mla_scale"):
        StreamConfig(cache_layout="fp8")
    with pytest.raises(ValueError, match="mla_scale"):
        StreamConfig(mla_scale=0.5)
    with pytest.raises(ValueError, match="distinct prompt lengths"):
        StreamConfig(prompts=7, max_prompt_length=9)


@pytest.fixture(scope="module")
def triton_default_streams(device):
    return compare_streams(load_kernel("default"), TRITON_CONFIG, (2, 4), device)


def test_triton_kernel_gives_identical_streams(triton_default_streams):
    assert_identical(triton_default_streams)


@pytest.mark.parametrize("regression", ["regress/pre-54908", "regress/pre-50005"])
def test_triton_regressions_diverge_under_dcp4(device, triton_default_streams, regression):
    comparison = compare_streams(load_kernel(regression), TRITON_CONFIG, (4,), device)
    assert_diverges_at_dcp(comparison, 4)
    assert comparison.digests[0] == triton_default_streams.digests[0]


def test_triton_kernel_gives_identical_streams_with_an_nvfp4_cache(device):
    """The model's decode reads the e2m1 entries the project's kernel wrote."""
    config = dataclasses.replace(TRITON_CONFIG, cache_layout="nvfp4_ds_mla")
    comparison = compare_streams(load_kernel("default"), config, (4,), device)
    assert_identical(comparison)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["auto", "fp8_ds_mla", "nvfp4_ds_mla"])
def test_full_width_model_on_gpu(device, layout):
    """DeepSeek-V3.2 widths (hidden 7168, 128 heads) with the Triton kernel, natively."""
    config = StreamConfig(preset="deepseek-v3.2", cache_layout=layout, steps=6)
    assert_identical(compare_streams(load_kernel("default"), config, (2, 4, 8), device))
    flawed = compare_streams(load_kernel("regress/pre-54908"), config, (4,), device)
    assert_diverges_at_dcp(flawed, 4)


class CacheOnlyK:
    """A kernel whose API has no K outputs (vLLM 0.28.0's shape): it computes everything
    but hands back no KV / k_pe rows (they stay NaN-poisoned), and says so."""

    writes_k_outputs = False

    def __init__(self, kernel) -> None:
        self.kernel = kernel

    def __call__(self, inputs, outputs, caches) -> None:
        self.kernel(inputs, outputs, caches)
        outputs.kv_out.fill_(float("nan"))
        outputs.kpe_out.fill_(float("nan"))


@pytest.mark.parametrize("layout", ["auto", "fp8_ds_mla"])
def test_a_kernel_without_k_outputs_prefills_from_the_caches(layout):
    """The prefill's K comes from the owners' cache entries: a correct cache-only-K kernel
    gives identical streams at every DCP size (and, for the exact auto layout, the same
    streams as a kernel with K outputs); its NaN K outputs are never read."""
    config = LAYOUTS[layout]
    comparison = compare_streams(
        CacheOnlyK(oracle_kernel), config, DCP_SIZES, BACKEND.device, stages=FAST
    )
    assert_identical(comparison)
    if layout == "auto":
        with_k = compare_streams(oracle_kernel, config, (1,), BACKEND.device, stages=FAST)
        assert comparison.digests[0].stream == with_k.digests[0].stream


def test_a_cache_only_k_kernel_that_skips_foreign_q_diverges():
    def skips_foreign_q(inputs, outputs, caches):
        oracle_kernel(inputs, outputs, caches)
        if inputs.slot_mapping is not None:
            outputs.q_out[inputs.slot_mapping < 0] = float("nan")

    comparison = compare_streams(
        CacheOnlyK(skips_foreign_q), CONFIG, (4,), BACKEND.device, stages=FAST
    )
    assert_diverges_at_dcp(comparison, 4)
