"""Achieved memory bandwidth of the project's fused kernel, next to an eager PyTorch
composition of the same op, at DeepSeek-V3.2 and GLM-5.x shapes.

The op is memory-bound (a few flops per byte), so the unit that matters is bytes moved
per second against the H200's HBM peak. Bytes are counted as the op must move them:
every activation row read once, every output row and every owned cache entry written
once, the top-k row filled, the RoPE table row of each token read. Weights are ignored
(a few KB, L2-resident).

    PYTHONPATH=$PWD python3 benchmarks/kernel_bandwidth.py   # on a CUDA device, from the checkout
    python3 benchmarks/kernel_bandwidth.py --quick    # fewer sizes
    python3 benchmarks/kernel_bandwidth.py --block-tokens 1,2,4 --num-warps 4,8  # tuning
    python3 benchmarks/kernel_bandwidth.py --no-eager --tokens 65536 --maxnreg 32,40,48
    python3 benchmarks/kernel_bandwidth.py --no-eager --q-apart 0,1   # one launch or Q apart
    ncu --clock-control none -k regex:fused_norm_rope -c 1 python3 benchmarks/kernel_bandwidth.py \
        --no-eager --tokens 65536 --presets deepseek-v3.2 --layouts fp8_ds_mla   # one launch

The kernel is timed as a CUDA graph of its launch alone (``launcher.launch``, the
buffers checked once beforehand): GPU time, free of Python and of the launch checks'
device-to-host copy. The eager composition is timed as it runs, call by call
(``triton.testing.do_bench``): its host time is part of what it costs.

Decode: 1 to 256 tokens (launch-bound: the figure there is microseconds, not GB/s);
prefill: 4K to 64K tokens, every token owned (DCP1), fp8_ds_mla and auto caches.
"""

from __future__ import annotations

import argparse
from functools import partial
from itertools import product

import torch
import triton

import reference
from dcpcheck.backend import select_backend
from dcpcheck.ops.fused_norm_rope.case import oracle_for
from dcpcheck.ops.fused_norm_rope.contract import (
    PRESETS,
    CacheLayout,
    FusedOpCaches,
    FusedOpInputs,
    FusedOpOutputs,
    index_entry_bytes,
    mla_entry_bytes,
)
from dcpcheck.ops.fused_norm_rope.launch_checks import check_launch
from dcpcheck.ops.fused_norm_rope.launcher import GPU_NUM_WARPS, launch

H200_PEAK_TBPS = 4.8
"""HBM3e peak by NVIDIA's datasheet; a device-to-device copy reaches about 4.3 TB/s."""

BLOCK_SIZE = 64


def make_op(preset_name: str, tokens: int, layout: CacheLayout, device: torch.device):
    p, dtype = PRESETS[preset_name], torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    blocks = triton.cdiv(tokens, BLOCK_SIZE)
    slots = torch.randperm(blocks * BLOCK_SIZE, generator=gen, device=device)[:tokens]
    inputs = FusedOpInputs(
        q_c=randn(tokens, p.q_lora_rank),
        q_weight=randn(p.q_lora_rank),
        kv_c=randn(tokens, p.kv_lora_rank),
        kv_weight=randn(p.kv_lora_rank),
        k_pe=randn(tokens, p.rope_dim),
        positions=torch.randint(1, p.max_position, (tokens,), generator=gen, device=device),
        cos_sin=reference.cos_sin_table(p.max_position, p.rope_dim, p.rope_base).to(device),
        eps=p.eps,
        block_size=BLOCK_SIZE,
        cache_layout=layout,
        mla_scale=0.5 if layout is CacheLayout.FP8 else None,
        slot_mapping=slots,
        index_k=randn(tokens, p.index_head_dim),
        index_weight=torch.ones(p.index_head_dim, device=device),
        index_bias=torch.zeros(p.index_head_dim, device=device),
        index_rope_interleaved=p.index_rope_interleaved,
        index_slot_mapping=slots,
    )
    outputs = FusedOpOutputs(
        q_out=torch.empty_like(inputs.q_c),
        kv_out=torch.empty_like(inputs.kv_c),
        kpe_out=torch.empty_like(inputs.k_pe),
        topk_indices=torch.empty(tokens, p.topk, dtype=torch.int32, device=device),
        index_k_out=torch.empty_like(inputs.index_k),
    )
    entry = mla_entry_bytes(layout, p.kv_lora_rank, p.rope_dim, dtype)
    caches = FusedOpCaches(
        mla=torch.zeros(blocks, BLOCK_SIZE, entry, dtype=torch.uint8, device=device),
        index=torch.zeros(
            blocks,
            BLOCK_SIZE,
            index_entry_bytes(p.index_head_dim),
            dtype=torch.uint8,
            device=device,
        ),
    )
    return inputs, outputs, caches


def bytes_moved(inputs: FusedOpInputs, outputs: FusedOpOutputs, caches: FusedOpCaches) -> int:
    tokens = inputs.num_tokens
    reads = sum(
        t.numel() * t.element_size() for t in (inputs.q_c, inputs.kv_c, inputs.k_pe, inputs.index_k)
    )
    reads += tokens * (3 * 8 + inputs.cos_sin.shape[1] * 4)  # positions, 2 slot maps, RoPE row
    writes = sum(t.numel() * t.element_size() for t in vars(outputs).values() if t is not None)
    writes += tokens * (caches.mla.shape[2] + caches.index.shape[2])
    return reads + writes


def eager(inputs: FusedOpInputs, outputs: FusedOpOutputs, caches: FusedOpCaches) -> None:
    """The op composed of PyTorch calls: the oracle's math, caches written in place."""
    ref = oracle_for(inputs)
    outputs.q_out.copy_(ref.q_out)
    outputs.kv_out.copy_(ref.kv_out)
    outputs.kpe_out.copy_(ref.kpe_out)
    outputs.index_k_out.copy_(ref.index_k_out)
    outputs.topk_indices.fill_(-1)
    caches.mla.view(-1, caches.mla.shape[2])[inputs.slot_mapping] = ref.mla_entries


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _written_bytes(inputs, outputs, caches) -> list[torch.Tensor]:
    """Copies of everything a launch writes: a tuning option must not move one bit."""
    written = [t for t in vars(outputs).values() if isinstance(t, torch.Tensor)]
    written += [caches.mla] + ([caches.index] if caches.index is not None else [])
    return [t.clone() for t in written]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes")
    parser.add_argument("--block-tokens", type=_int_list, default=[None], help="BLOCK_T values")
    parser.add_argument("--num-warps", type=_int_list, default=[None], help="num_warps values")
    parser.add_argument(
        "--maxnreg", type=_int_list, default=[None], help="register caps per thread (CUDA)"
    )
    parser.add_argument(
        "--q-apart", type=_int_list, default=[None], help="0: one launch, 1: Q launched apart"
    )
    parser.add_argument("--no-eager", action="store_true", help="skip the eager composition")
    parser.add_argument("--tokens", type=_int_list, help="token counts (default: all sizes)")
    parser.add_argument("--presets", default="deepseek-v3.2,glm-5", help="comma-separated")
    parser.add_argument("--layouts", default="fp8_ds_mla,auto", help="comma-separated")
    args = parser.parse_args()
    backend = select_backend("cuda")
    decode = (1, 16, 256) if args.quick else (1, 4, 16, 64, 256)
    prefill = (4096, 65536) if args.quick else (4096, 16384, 65536)
    sizes = args.tokens or (*decode, *prefill)
    print(f"device: {backend.describe()}; peak {H200_PEAK_TBPS} TB/s (datasheet)")
    print(
        f"{'preset':14} {'layout':10} {'tokens':>7} {'BLOCK_T':>7} {'warps':>5} "
        f"{'maxnreg':>7} {'Q apart':>7} {'bits':>6} {'MB':>8} "
        f"{'kernel us':>10} {'GB/s':>7} {'%peak':>6} {'eager us':>9} {'GB/s':>7} {'speedup':>7}"
    )
    for preset in args.presets.split(","):
        for layout in map(CacheLayout, args.layouts.split(",")):
            for tokens in sizes:
                op = make_op(preset, tokens, layout, backend.device)
                shape = check_launch(*op, backend.device)
                moved = bytes_moved(*op)
                eager_cols = ""
                if not args.no_eager:
                    t_eager = triton.testing.do_bench(partial(eager, *op))
                    eager_gbps = moved / (t_eager * 1e-3) / 1e9
                    eager_cols = f"{t_eager * 1e3:9.1f} {eager_gbps:7.0f}"
                launch(shape, *op)  # the default configuration's bytes, to compare with
                written = _written_bytes(*op)
                configs = product(args.block_tokens, args.num_warps, args.maxnreg, args.q_apart)
                for block_tokens, num_warps, maxnreg, q_apart in configs:
                    run = partial(
                        launch,
                        shape,
                        *op,
                        block_tokens=block_tokens,
                        num_warps=num_warps,
                        maxnreg=maxnreg,
                        q_apart=None if q_apart is None else bool(q_apart),
                    )
                    run()  # compile outside the graph
                    same = all(
                        torch.equal(a, b) for a, b in zip(written, _written_bytes(*op), strict=True)
                    )
                    t_kernel = triton.testing.do_bench_cudagraph(run)
                    gbps = moved / (t_kernel * 1e-3) / 1e9
                    speedup = f" {t_eager / t_kernel:6.1f}x" if eager_cols else ""
                    print(
                        f"{preset:14} {layout.value:10} {tokens:7d} {block_tokens or 1:7d} "
                        f"{num_warps or GPU_NUM_WARPS:5d} {maxnreg or '-':>7} "
                        f"{'default' if q_apart is None else q_apart:>7} "
                        f"{'same' if same else 'DIFFER':>6} {moved / 1e6:8.2f} "
                        f"{t_kernel * 1e3:10.1f} {gbps:7.0f} {gbps / (H200_PEAK_TBPS * 10):5.1f}% "
                        f"{eager_cols}{speedup}"
                    )


if __name__ == "__main__":
    main()
