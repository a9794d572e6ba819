"""A digest of every byte the project's kernel writes over a fixed set of launches, to show
that a change to the kernel or its launcher moved no output bit on any golden vector or
scenario: a speed change must leave every byte as it was.

Run it in two trees on the same machine and compare the printed digests:

    PYTHONPATH=$PWD python3 benchmarks/kernel_bits.py > new.txt
    python3 benchmarks/kernel_bits.py --tree OLD_CHECKOUT > old.txt
    diff old.txt new.txt && echo "the same bits"

The launches: the four golden-vector cases (``tests/vectors``, launched as
``tests/test_golden_vectors_kernel.py`` launches them), and the real presets
(deepseek-v3.2, glm-5) at 1, 17, 4,096 and 65,536 tokens (``--quick``: 1, 17, 4,096) for
every cache layout, each on an indexer layer with every slot owned and on a shared layer
with every other token owned elsewhere (slot -1, as a DCP rank sees it); fp8_ds_mla also
with the power-of-two tile scale, and the indexer also shuffled with MX scales. Outputs
start as NaN and caches as seeded random bytes, so an unwritten byte shows as well as a
changed one. The values are drawn from seeded generators on the device, the same draws in
every tree, so compare digests of one machine only.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from dataclasses import replace
from pathlib import Path

import torch  # the same in every tree; dcpcheck is imported from --tree, after the path is set

HERE = Path(__file__).resolve().parent
GOLDEN = Path("tests", "vectors", "fused_norm_rope_owned.pt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, help="the checkout whose kernel runs (default: here)")
    parser.add_argument("--quick", action="store_true", help="no 65,536-token launches")
    parser.add_argument(
        "--q-apart",
        type=int,
        choices=(0, 1),
        help="1: Q launched apart, 0: one launch (default: the launcher's choice; the golden "
        "cases, launched as their test launches them, keep it)",
    )
    args = parser.parse_args()
    tree = (args.tree or HERE.parent).resolve()
    sys.path[:0] = [str(tree), str(HERE)]

    from dcpcheck.backend import select_backend

    backend = select_backend("auto")
    from kernel_bandwidth import make_op

    from dcpcheck.ops.fused_norm_rope.contract import (
        CacheLayout,
        DsMlaScale,
        IndexFormat,
        IndexScale,
    )
    from dcpcheck.ops.fused_norm_rope.launcher import fused_norm_rope

    device = backend.device
    plan = {} if args.q_apart is None else {"q_apart": bool(args.q_apart)}
    print(f"# {backend.describe()}; tree {tree.name}", file=sys.stderr)
    total = hashlib.sha256()

    def report(name: str, written: list[torch.Tensor]) -> None:
        digest = hashlib.sha256()
        for tensor in written:
            digest.update(tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
        total.update(digest.digest())
        print(f"{name:58} {digest.hexdigest()[:32]}")

    golden = tree / GOLDEN
    if not golden.is_file():  # a tree older than its vectors launches this tree's
        golden = HERE.parent / GOLDEN
    from tests.test_golden_vectors_kernel import CASE_LAYOUTS, _run_case

    for name, case in torch.load(golden, weights_only=True).items():
        outputs, caches = _run_case(case, CASE_LAYOUTS[name], device)
        report(f"golden {name}", [*_tensors(outputs), *_tensors(caches)])

    tokens = (1, 17, 4096) if args.quick else (1, 17, 4096, 65536)
    for preset in ("deepseek-v3.2", "glm-5"):
        for layout in CacheLayout:
            for count in tokens:
                for label, shared in (("indexer, owned", False), ("shared, half owned", True)):
                    variants = [("", {})]
                    if layout is CacheLayout.FP8_DS_MLA:
                        variants.append((" pow2", {"ds_mla_scale": DsMlaScale.POW2}))
                    if not shared:
                        mx = IndexFormat(shuffled=True, scale=IndexScale.MX)
                        variants.append((" shuffled+mx", {"index_format": mx}))
                    for suffix, changes in variants:
                        inputs, outputs, caches = _launch(
                            make_op, preset, count, layout, device, shared, changes
                        )
                        fused_norm_rope(inputs, outputs, caches, **plan)
                        report(
                            f"{preset} {layout.value} {count} {label}{suffix}",
                            [*_tensors(outputs), *_tensors(caches)],
                        )
    print(f"{'all':58} {total.hexdigest()}")


def _tensors(bundle) -> list:
    return [value for value in vars(bundle).values() if isinstance(value, torch.Tensor)]


def _launch(make_op, preset, count, layout, device, shared, changes):
    """``make_op``'s buffers, then: outputs NaN, caches random bytes, and on a shared
    layer no indexer and every other token's slot -1."""
    inputs, outputs, caches = make_op(preset, count, layout, device)
    gen = torch.Generator(device=device).manual_seed(count)
    caches = replace(
        caches,
        **{
            name: torch.randint(
                0, 256, tensor.shape, generator=gen, dtype=torch.uint8, device=device
            )
            for name, tensor in vars(caches).items()
            if isinstance(tensor, torch.Tensor)
        },
    )
    for tensor in _tensors(outputs):
        tensor.fill_(float("nan") if tensor.is_floating_point() else -7)
    if shared:
        slots = inputs.slot_mapping.clone()
        slots[1::2] = -1
        inputs = replace(
            inputs,
            slot_mapping=slots,
            index_k=None,
            index_weight=None,
            index_bias=None,
            index_slot_mapping=None,
        )
        outputs = replace(outputs, index_k_out=None)
        caches = replace(caches, index=None)
    return replace(inputs, **changes), outputs, caches


if __name__ == "__main__":
    main()
