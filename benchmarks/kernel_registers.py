"""Registers per thread of the project's kernel for a GPU architecture, per sub-task, with
no GPU: Triton compiles the kernel for the target and ptxas reports what it allocated.

Why per sub-task: a launch runs several sub-tasks (indexer K, top-k fill, KV + k_pe, Q;
``dcpcheck/ops/fused_norm_rope/kernel.py``) selected at run time by the program's index,
so they live in one binary, and a binary has one register count: the largest any of its
paths needs. That count caps how many programs fit on a multiprocessor, so the sub-task
with the most live state sets the occupancy of every other one. The table gives the
binary of one launch of every sub-task (the interpreter's), the GPU's two launches (up to
KV, then Q alone: ``launcher.GPU_Q_APART_FROM_TOKENS``) and each sub-task compiled alone
(``FIRST_TASK == LAST_TASK``, which the kernel resolves at compile time).

The launch arguments are the launcher's own (``launcher.launch`` recorded, not launched,
by ``launch_keys``, on CPU tensors from ``kernel_bandwidth.make_op``), at the GPU's tile
(``GPU_TOKENS_PER_PROGRAM`` tokens per program, ``GPU_NUM_WARPS`` warps), with 16-byte
divisibility where Triton would specialize it at launch. Cross-check: the whole kernel
compiles to 63 registers for deepseek-v3.2 at sm_90, the count Nsight Compute read on the
H200 (BENCHMARKS.md).

Occupancy is the theoretical one of sm_90 (H100/H200): 65,536 registers, 64 warps and 32
programs per multiprocessor, registers allocated per warp in units of 256 (8 per thread).

    PYTHONPATH=$PWD python3 benchmarks/kernel_registers.py            # this machine's Triton
    PYTHONPATH=$PWD python3 benchmarks/kernel_registers.py --presets glm-5 --layouts auto
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile, never interpret: nothing is launched
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "0")  # as launched (quiets Triton 3.9)

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).parent))
from kernel_bandwidth import make_op
from launch_keys import recorded_launches

from dcpcheck.ops.fused_norm_rope import launcher
from dcpcheck.ops.fused_norm_rope.contract import CacheLayout
from dcpcheck.ops.fused_norm_rope.kernel import (
    TASK_INDEXER_K,
    TASK_KV,
    TASK_Q,
    TASK_TOPK_FILL,
    _fused_norm_rope_kernel,
)
from dcpcheck.ops.fused_norm_rope.launch_checks import check_launch

SUB_TASKS = {TASK_INDEXER_K: "indexer K", TASK_TOPK_FILL: "top-k fill", TASK_KV: "KV + k_pe"}
"""The sub-tasks compiled alone besides Q, which the GPU's second launch compiles alone."""
TYPES = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.uint8: "u8",
}
SM90_REGISTERS, SM90_WARPS, SM90_PROGRAMS = 65536, 64, 32


def launch_arguments(preset: str, layout: CacheLayout) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) of the launcher's launch for ``preset``/``layout``."""
    inputs, outputs, caches = make_op(preset, 64, layout, torch.device("cpu"))
    shape = check_launch(inputs, outputs, caches, torch.device("cpu"))
    with recorded_launches(forward=False) as launches:
        launcher.launch(
            shape, inputs, outputs, caches, block_tokens=launcher.GPU_TOKENS_PER_PROGRAM
        )
    [launch] = launches
    signature, attrs = {}, {}
    for index, argument in enumerate(launch.arguments):
        if argument.dtype is not None:
            signature[argument.name] = "*" + TYPES[argument.dtype]
        else:
            signature[argument.name] = "fp32" if isinstance(argument.value, float) else "i32"
        if argument.divisible_by_16:
            attrs[(index,)] = [["tt.divisibility", 16]]
    signature.update({name: "constexpr" for name in launch.constexprs})
    return signature, dict(launch.constexprs), attrs


def _ptxas(arch: int) -> str:
    from triton.backends.nvidia import compiler as nvidia

    if hasattr(nvidia, "get_ptxas"):
        return nvidia.get_ptxas(arch).path
    return triton.knobs.nvidia.ptxas.path


def registers(kernel, signature, constexprs, attrs, arch: int, num_warps: int) -> tuple[int, str]:
    """(registers per thread, ptxas's spill line) of ``kernel`` compiled for ``arch``."""
    source = ASTSource(kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(
        source,
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": num_warps, "enable_fp_fusion": False},
    )
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(compiled.asm["ptx"])
        ptx.flush()
        log = subprocess.run(
            [
                _ptxas(arch),
                "-v",
                "--fmad=false",
                f"--gpu-name=sm_{arch}a",
                ptx.name,
                "-o",
                os.devnull,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    used = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores", log)
    return int(used.group(1)), f"{spills.group(1)} B spilled" if spills else "?"


def occupancy(regs: int, num_warps: int) -> float:
    """Theoretical share of sm_90's 64 warps a kernel of ``regs`` registers keeps resident."""
    per_warp = -(-regs // 8) * 8 * 32
    programs = min(SM90_PROGRAMS, SM90_REGISTERS // (per_warp * num_warps))
    return min(SM90_WARPS, programs * num_warps) / SM90_WARPS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="deepseek-v3.2,glm-5")
    parser.add_argument("--layouts", default="fp8_ds_mla,auto")
    parser.add_argument("--arch", type=int, default=90, help="compute capability x10")
    args = parser.parse_args()
    warps = launcher.GPU_NUM_WARPS
    print(f"Triton {triton.__version__}, sm_{args.arch}, {warps} warps per program")
    columns = ["one launch", "GPU launch 1: up to KV", "GPU launch 2: Q", *SUB_TASKS.values()]
    print("| preset | layout | " + " | ".join(columns) + " |")
    print("| --- | --- |" + " --- |" * len(columns))
    for preset in args.presets.split(","):
        for layout in args.layouts.split(","):
            signature, constexprs, attrs = launch_arguments(preset, CacheLayout(layout))
            first = constexprs["FIRST_TASK"]
            ranges = [(first, TASK_Q.value), (first, TASK_KV.value), (TASK_Q.value,) * 2]
            ranges += [(task.value,) * 2 for task in SUB_TASKS]
            cells = []
            for low, high in ranges:
                if low < first:  # a shared layer has no indexer sub-tasks
                    cells.append("-")
                    continue
                regs, spill = registers(
                    _fused_norm_rope_kernel,
                    signature,
                    {**constexprs, "FIRST_TASK": low, "LAST_TASK": high},
                    attrs,
                    args.arch,
                    warps,
                )
                cells.append(f"{regs} ({occupancy(regs, warps):.0%}, {spill})")
            print(f"| {preset} | {layout} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
