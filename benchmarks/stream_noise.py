"""How far a correct kernel's DCPn token streams stray from its DCP1 streams: the largest
difference of a step's top-2 logit margin between a DCP2/4/8 run and the DCP1 run, over
seeds, cache layouts and block size / interleave pairs, that difference over the DCP1
step's ``token_streams.margin_bound``, which must stay well below 1, and how many
configurations diverged (none should).

    PYTHONPATH=$PWD python3 benchmarks/stream_noise.py [--seeds 4]
"""

from __future__ import annotations

import argparse

from dcpcheck.backend import current_backend
from dcpcheck.e2e.token_streams import StreamConfig, compare_streams
from dcpcheck.ops.fused_norm_rope.contract import CacheLayout
from tests.kernels_under_test import oracle_kernel

LAYOUTS = ((CacheLayout.AUTO, None), (CacheLayout.FP8, 0.5), (CacheLayout.FP8_DS_MLA, None))
BLOCKS = ((4, 1), (4, 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args()
    backend = current_backend()
    worst, worst_ratio, diverged, configs = 0.0, 0.0, 0, 0
    for seed in range(args.seeds):
        for layout, scale in LAYOUTS:
            for block_size, interleave in BLOCKS:
                config = StreamConfig(
                    cache_layout=layout,
                    mla_scale=scale,
                    block_size=block_size,
                    interleave=interleave,
                    seed=seed,
                    steps=12,
                )
                comparison = compare_streams(oracle_kernel, config, (2, 4, 8), backend.device)
                configs += 1
                baseline = comparison.runs[0]
                for run in comparison.runs[1:]:
                    if (run.tokens == baseline.tokens[0]).all():
                        gap = (run.margins - baseline.margins[0]).abs()
                        worst = max(worst, gap.max().item())
                        worst_ratio = max(worst_ratio, (gap / baseline.bounds[0]).max().item())
                diverged += not comparison.identical
    print(
        f"{configs} configurations, {diverged} diverged; largest margin difference "
        f"{worst:.3g}, at most {worst_ratio:.3g} times the DCP1 step's bound"
    )


if __name__ == "__main__":
    main()
