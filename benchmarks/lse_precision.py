"""What an LSE carried in bf16 costs the merged output, against the fp32 LSE the merge's
bound assumes (docs/lse-combine.md, "The bound").

For each context length and DCP size: one batch of decode rows (bf16 partial outputs, 16
heads of dim 64, every logit shifted by ``--shift``, which moves the LSEs and not the
outputs), its partials' LSEs rounded to fp32 or to bf16 as a decode backend that
allocates them in the query's dtype leaves them, merged by a kernel of the op (the
project's by default, or a release's: ``--kernel vllm==X``); the worst element's error in
units of the bound, for each LSE dtype. A ratio above 1 breaks the contract.

    python3 benchmarks/lse_precision.py [--kernel vllm==0.20.0] [--contexts 1024,131072]
        [--shift 20]
"""

from __future__ import annotations

import argparse
import time

import torch

from dcpcheck.backend import select_backend
from dcpcheck.op_registry import LSE_COMBINE


def worst(kernel, batch, size: int, device) -> float:
    """The largest |error| / bound over the merged output's real rows (0 when none)."""
    from dcpcheck.ops.lse_combine import checks
    from dcpcheck.ops.lse_combine.case import build_case, launch_all

    case = build_case(batch, size, device)
    merged = launch_all(kernel, case)
    share = case.heads_per_rank
    bound = checks.output_tolerance(case)
    ratios = []
    for rank, result in enumerate(merged):
        heads = slice(rank * share, (rank + 1) * share)
        error = (result.out.to("cpu", torch.float64) - case.expected_out[:, heads]).abs()
        ratios.append(float((error / bound[:, heads])[case.real].max()))
    return max(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="default")
    parser.add_argument("--contexts", default="1024,8192,32768,131072")
    parser.add_argument("--dcp", default="2,4,8")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--shift", type=float, default=0.0, help="added to every logit: larger LSEs, same outputs"
    )
    args = parser.parse_args()
    backend = select_backend("auto")
    from dcpcheck.ops import package
    from dcpcheck.ops.lse_combine.case import CombineBatch

    kernel = package(LSE_COMBINE).kernel(args.kernel)
    print(f"kernel {args.kernel}, logits shifted by {args.shift:g}, {backend.describe()}")
    print("| context | DCP | fp32 LSE: worst error / bound | bf16 LSE | s |\n|---|---|---|---|---|")
    for context in map(int, args.contexts.split(",")):
        for size in map(int, args.dcp.split(",")):
            started = time.perf_counter()
            cells = []
            for lse_dtype in ("float32", "bfloat16"):
                ratios = []
                for seed in range(args.seeds):
                    batch = CombineBatch(
                        requests=((context, 1), (context // 2 + 1, 1)),
                        heads=16,
                        head_dim=64,
                        lse_dtype=lse_dtype,
                        logit_shift=args.shift,
                        seed=seed,
                    )
                    ratios.append(worst(kernel, batch, size, backend.device))
                cells.append(f"{max(ratios):.3g}")
            seconds = time.perf_counter() - started
            print(f"| {context} | {size} | {cells[0]} | {cells[1]} | {seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
