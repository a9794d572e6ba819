"""Rebuild the golden vectors beside this file: four cases of vLLM's own ``fused_norm_rope``
Triton kernel, every token owning its slot, run natively on a CUDA GPU (README.md here
describes the cases). From the repository root, on a machine with a CUDA GPU:

    DCPCHECK_CACHE=$PWD/.dcpcheck-cache python3 tests/vectors/make_golden_vectors.py

It writes ``fused_norm_rope_owned.pt`` and ``README.md`` here and prints, per output, how
many elements differ from the file it replaced. Without a CUDA device it refuses (exit 2);
``--interpreter-dry-run DIR`` runs the same on Triton's CPU interpreter and writes into DIR,
never here (``tests/test_golden_vectors_script.py`` compares that with the stored file).

The kernel is vLLM 0.30.0's ``vllm/models/deepseek_v32/common/kernels.py``, loaded as
``dcpcheck run --kernel vllm==0.30.0`` loads it (the release cache, the file checked against
its wheel's RECORD, vLLM's adapter), so the file's SHA256 in the README names what ran.
Why that release: the first vectors came from vLLM's git history at 01b9c661, whose
in-place API (``write_kv_output``) no release shipped (dcpcheck.ops.fused_norm_rope.vllm).
0.27.0 - 0.28.0 write no normalized KV or rotated k_pe outputs, which the vectors hold;
0.31.0 on round fp8_ds_mla tile scales up to a power of two, where 01b9c661 stores
``amax / 448`` (docs/fused-norm-rope.md); 0.29.0 and 0.30.0 compute every stored output by
01b9c661's rules, and 0.30.0 also takes the indexer's own slot mapping as 01b9c661 does.
On the interpreter 0.29.0 and 0.30.0 give the same bytes as each other for all four cases.

The inputs are drawn from CPU generators seeded per case (:data:`CASES`), so every run on
any machine launches the same values; the outputs of one GPU are deterministic (no atomics,
one program per token row), and ``torch.save`` writes the same bytes for the same tensors.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:  # run as a script from the checkout, which is not installed
    sys.path.insert(0, str(REPO))

import reference  # noqa: E402
from dcpcheck.backend import select_backend  # noqa: E402
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_KERNEL_LOAD, EXIT_OK, EXIT_USAGE  # noqa: E402
from dcpcheck.kernels import releases  # noqa: E402
from dcpcheck.kernels.loading import KernelLoadError, KernelSpecError  # noqa: E402
from dcpcheck.ops.fused_norm_rope.contract import (  # noqa: E402
    CacheLayout,
    FusedOpCaches,
    FusedOpInputs,
    FusedOpOutputs,
    index_entry_bytes,
    mla_entry_bytes,
)

GOLDEN_FILE = "fused_norm_rope_owned.pt"
README_FILE = "README.md"
VECTORS = HERE / GOLDEN_FILE
"""The stored vectors the tests read."""

RELEASE = "0.30.0"
"""The vLLM release whose kernel makes the vectors (module docstring: why this one)."""

COMMAND = "DCPCHECK_CACHE=$PWD/.dcpcheck-cache python3 tests/vectors/make_golden_vectors.py"

POSITIONS = (3, 10, 100, 1000, 4095)
SLOTS = (5, 2, 7, 0, 9)
"""One slot per token, every one owned, in no order, in a cache of NUM_BLOCKS blocks."""
Q_DIM, KV_DIM, ROPE_DIM, INDEX_DIM = 256, 512, 64, 128
KV_SCALE = 3.0
INDEX_K_SCALE = 2.0
"""``kv_c`` and ``index_k`` are drawn wider than N(0, 1), so the fp8 scales are not ~1."""
EPS = 1e-6
BLOCK_SIZE = 4
NUM_BLOCKS = 3
"""The caches are [3 blocks, block_size 4, entry], started as zeros."""
TOPK_WIDTH = 16
TOPK_START = 7
"""The top-k buffer starts as 7 everywhere: an indexer layer fills it with -1."""
MAX_POSITION = 4096
ROPE_BASE = 10000.0


@dataclass(frozen=True)
class GoldenCase:
    """One case: its name, the seed its inputs are drawn with, and the layer it runs."""

    name: str
    seed: int
    dtype: torch.dtype
    layout: CacheLayout
    has_indexer: bool
    index_rope_interleave: bool = False
    mla_k_scale: float | None = None


CASES = (
    GoldenCase("mla_auto_bf16__indexer_neox", 1, torch.bfloat16, CacheLayout.AUTO, True),
    GoldenCase(
        "mla_auto_fp16__indexer_interleaved", 2, torch.float16, CacheLayout.AUTO, True, True
    ),
    GoldenCase(
        "mla_fp8_scale0.3__indexer_interleaved", 3, torch.bfloat16, CacheLayout.FP8, True, True, 0.3
    ),
    GoldenCase("mla_fp8_ds_mla__no_indexer", 4, torch.bfloat16, CacheLayout.FP8_DS_MLA, False),
)

Kernel = Callable[[FusedOpInputs, FusedOpOutputs, FusedOpCaches], None]


def case_inputs(case: GoldenCase) -> dict[str, torch.Tensor]:
    """The case's inputs and ``meta_*`` values as the file stores them, on the CPU: each
    tensor ``torch.randn`` in fp32 from a generator seeded with ``case.seed``, in this
    order, scaled, then cast (the indexer's LayerNorm weight and bias stay fp32). A
    shared-layer case draws the indexer's tensors too, so every case draws alike."""
    generator = torch.Generator().manual_seed(case.seed)

    def draw(*shape: int, scale: float = 1.0, dtype: torch.dtype = case.dtype) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * scale).to(dtype)

    tokens = len(POSITIONS)
    tensors = {
        "positions": torch.tensor(POSITIONS, dtype=torch.int64),
        "q_c": draw(tokens, Q_DIM),
        "q_w": draw(Q_DIM),
        "kv_c": draw(tokens, KV_DIM, scale=KV_SCALE),
        "kv_w": draw(KV_DIM),
        "k_pe": draw(tokens, ROPE_DIM),
        "index_k": draw(tokens, INDEX_DIM, scale=INDEX_K_SCALE),
        "index_w": draw(INDEX_DIM, dtype=torch.float32),
        "index_b": draw(INDEX_DIM, dtype=torch.float32),
        "slot_mapping": torch.tensor(SLOTS, dtype=torch.int64),
        "eps": torch.tensor(EPS, dtype=torch.float32),
    }
    if case.mla_k_scale is not None:
        tensors["mla_k_scale"] = torch.tensor([case.mla_k_scale], dtype=torch.float32)
    tensors |= {
        "meta_block_size": torch.tensor(BLOCK_SIZE),
        "meta_has_indexer": torch.tensor(int(case.has_indexer)),
        "meta_index_rope_interleave": torch.tensor(int(case.index_rope_interleave)),
        "meta_rope_base": torch.tensor(ROPE_BASE, dtype=torch.float32),
        "meta_max_pos": torch.tensor(MAX_POSITION),
    }
    return tensors


def launch(
    case: dict[str, torch.Tensor], layout: CacheLayout, device: torch.device, kernel: Kernel
) -> tuple[FusedOpOutputs, FusedOpCaches]:
    """Run ``kernel`` on one case as stored (its inputs and ``meta_*`` values): outputs
    NaN, the top-k buffer TOPK_START, caches zero; one slot mapping for both caches."""
    c = {name: tensor.to(device) for name, tensor in case.items()}
    block_size = int(c["meta_block_size"])
    has_indexer = bool(c["meta_has_indexer"])
    num_tokens, index_dim = c["index_k"].shape
    cos_sin = reference.cos_sin_table(
        int(c["meta_max_pos"]), c["k_pe"].shape[-1], float(c["meta_rope_base"])
    ).to(device)
    inputs = FusedOpInputs(
        q_c=c["q_c"],
        q_weight=c["q_w"],
        kv_c=c["kv_c"],
        kv_weight=c["kv_w"],
        k_pe=c["k_pe"],
        positions=c["positions"],
        cos_sin=cos_sin,
        eps=float(c["eps"]),
        block_size=block_size,
        cache_layout=layout,
        mla_scale=float(c["mla_k_scale"]) if layout is CacheLayout.FP8 else None,
        slot_mapping=c["slot_mapping"],
        index_k=c["index_k"] if has_indexer else None,
        index_weight=c["index_w"] if has_indexer else None,
        index_bias=c["index_b"] if has_indexer else None,
        index_rope_interleaved=bool(c["meta_index_rope_interleave"]),
        index_slot_mapping=c["slot_mapping"] if has_indexer else None,
    )
    nan = float("nan")
    outputs = FusedOpOutputs(
        q_out=torch.full_like(c["q_c"], nan),
        kv_out=torch.full_like(c["kv_c"], nan),
        kpe_out=torch.full_like(c["k_pe"], nan),
        topk_indices=torch.full(
            (num_tokens, TOPK_WIDTH), TOPK_START, dtype=torch.int32, device=device
        ),
        index_k_out=torch.full_like(c["index_k"], nan) if has_indexer else None,
    )
    entry_bytes = mla_entry_bytes(layout, c["kv_c"].shape[1], c["k_pe"].shape[1], c["q_c"].dtype)
    caches = FusedOpCaches(
        mla=torch.zeros(NUM_BLOCKS, block_size, entry_bytes, dtype=torch.uint8, device=device),
        index=(
            torch.zeros(
                NUM_BLOCKS,
                block_size,
                index_entry_bytes(index_dim),
                dtype=torch.uint8,
                device=device,
            )
            if has_indexer
            else None
        ),
    )
    kernel(inputs, outputs, caches)
    return outputs, caches


def case_outputs(
    case: GoldenCase, outputs: FusedOpOutputs, caches: FusedOpCaches
) -> dict[str, torch.Tensor]:
    """What the file stores of a run, on the CPU: an ``auto`` MLA cache in the activation
    dtype, every other cache as bytes; no indexer cache on a shared layer."""
    mla = caches.mla.view(case.dtype) if case.layout is CacheLayout.AUTO else caches.mla
    stored = {
        "out_q": outputs.q_out,
        "out_kv": outputs.kv_out,
        "out_kpe": outputs.kpe_out,
        "out_mla_cache": mla,
        "out_topk": outputs.topk_indices,
    }
    if caches.index is not None:
        stored["out_indexer_cache"] = caches.index
    return {name: tensor.cpu().contiguous() for name, tensor in stored.items()}


def golden_vectors(kernel: Kernel, device: torch.device) -> dict[str, dict[str, torch.Tensor]]:
    """Every case's inputs and ``kernel``'s outputs on ``device``."""
    golden = {}
    for case in CASES:
        tensors = case_inputs(case)
        outputs, caches = launch(tensors, case.layout, device, kernel)
        golden[case.name] = tensors | case_outputs(case, outputs, caches)
    return golden


@dataclass(frozen=True)
class Provenance:
    """What made a file of vectors, as its README names it."""

    kernel: str
    device: str
    torch_version: str
    triton_version: str


CASES_HEADING = "## The cases"
"""Where a README's part that every file of vectors shares begins (its provenance is above)."""


README_WIDTH = 92


def _prose(text: str, indent: str = "") -> str:
    """``text`` as one Markdown paragraph wrapped at README_WIDTH (``indent`` after the first
    line, for a list item)."""
    return textwrap.fill(
        " ".join(text.split()),
        width=README_WIDTH,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


def readme(provenance: Provenance) -> str:
    """The README of a file of vectors made as ``provenance`` says."""
    names = ", ".join(f"`{case.name}`" for case in CASES)
    seeds = ", ".join(f"{case.seed} for `{case.name}`" for case in CASES)
    eps = f"{EPS:.0e}".replace("e-0", "e-")
    half = ROPE_DIM // 2
    blocks = [
        "# Golden vectors: the fused op with every slot owned",
        _prose(
            f"""`{GOLDEN_FILE}`: `torch.load(path, weights_only=True)` gives a dict of four
            cases; each case is a dict of tensors. Every token owns its slot here, so these
            are independent evidence for the **layouts and arithmetic** of
            docs/fused-norm-rope.md (cache entry bytes, scales, RoPE pairing, top-k fill),
            not DCP cases: vLLM's kernels skip the cache writes of tokens without a local
            slot."""
        ),
        "## Where they come from",
        "\n".join(
            _prose(item, indent="  ")
            for item in (
                f"- kernel: {provenance.kernel}",
                f"- run on: {provenance.device}",
                f"- with: torch {provenance.torch_version}, triton {provenance.triton_version}",
            )
        ),
        _prose(
            """Regenerate them on a CUDA GPU, from the repository root (the release is
            fetched into the cache on first use; `make_golden_vectors.py` says why that
            release):"""
        ),
        f"    {COMMAND}",
        CASES_HEADING,
        _prose(f"{names}."),
        _prose(
            f"""Inputs: `positions` [5] {POSITIONS}, `q_c` [5, {Q_DIM}], `q_w` [{Q_DIM}],
            `kv_c` [5, {KV_DIM}], `kv_w` [{KV_DIM}], `k_pe` [5, {ROPE_DIM}], `index_k`
            [5, {INDEX_DIM}], `index_w`, `index_b` [{INDEX_DIM}] (fp32), `slot_mapping` [5]
            = {SLOTS}, `eps` ({eps}, all three norms), `mla_k_scale` (fp8 case),
            `meta_block_size` ({BLOCK_SIZE}), `meta_has_indexer`,
            `meta_index_rope_interleave`, `meta_rope_base` ({ROPE_BASE:g}), `meta_max_pos`
            ({MAX_POSITION}). The tensors are `torch.randn` in fp32 from a CPU
            `torch.Generator` seeded {seeds}, drawn in the order listed (`kv_c` times
            {KV_SCALE:g}, `index_k` times {INDEX_K_SCALE:g}), then cast to the case's
            activation dtype (`index_w` and `index_b` stay fp32); the shared-layer case
            draws the indexer's tensors too."""
        ),
        _prose(
            f"""RoPE tables are not stored: both are `[cos | sin]` of
            `outer(arange({MAX_POSITION}), 1 / {ROPE_BASE:g} ** (arange({half}) / {half}))`
            in fp32 (rotary dim {ROPE_DIM}; `reference.cos_sin_table`). Caches start as
            zeros: MLA cache [{NUM_BLOCKS} blocks, {BLOCK_SIZE}, entry] (bf16/fp16 entry
            {KV_DIM + ROPE_DIM} values; fp8 entry {KV_DIM + ROPE_DIM} bytes; fp8_ds_mla entry
            656 bytes), indexer cache [{NUM_BLOCKS}, {BLOCK_SIZE}, {INDEX_DIM + 4}] bytes (per
            block: {BLOCK_SIZE} x {INDEX_DIM} fp8 values, then {BLOCK_SIZE} fp32 scales), one
            slot mapping for both; top-k buffer [5, {TOPK_WIDTH}] starts as {TOPK_START}."""
        ),
        _prose(
            """Outputs: `out_q`, `out_kv` (normalized kv_c), `out_kpe` (roped k_pe),
            `out_mla_cache`, `out_indexer_cache`, `out_topk`."""
        ),
        "## The same kernel on the CPU interpreter",
        _prose(
            """Under `TRITON_INTERPRET=1` (`--interpreter-dry-run`) the kernel gives the same
            fp16 values byte for byte, but about half of its **bf16** values are one unit in
            the last place toward zero: the interpreter converts fp32 to bf16 by truncation,
            while the GPU rounds to nearest even (the GPU matches torch's
            `.to(torch.bfloat16)` of the fp32 result in every element checked). fp8 bytes
            agree within one step, fp8_ds_mla's fp32 tile scales within a few ulps (the fp32
            RMSNorm's reductions run in another order). `tests/test_golden_vectors_script.py`
            holds a dry run to exactly that. Tolerances that compare a kernel run on the CPU
            with the oracle must allow for this; comparisons between runs on one backend
            (rank against rank, DCPn against DCP1) stay bitwise."""
        ),
    ]
    return "\n\n".join(blocks) + "\n"


def write(golden: dict[str, dict[str, torch.Tensor]], provenance: Provenance, folder: Path) -> Path:
    """Write the vectors and their README into ``folder``, each replacing the old one whole
    (a reader never sees half a file); the vectors' path."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, save in (
        (GOLDEN_FILE, lambda path: torch.save(golden, path)),
        (README_FILE, lambda path: path.write_text(readme(provenance), encoding="utf-8")),
    ):
        staged = folder / f".{name}.partial"
        save(staged)
        os.replace(staged, folder / name)
    return folder / GOLDEN_FILE


BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
"""An integer dtype of each element size, to compare tensors bit for bit (NaN included)."""


def differences(
    old: dict[str, dict[str, torch.Tensor]], new: dict[str, dict[str, torch.Tensor]]
) -> list[str]:
    """Per case and output, how many elements of ``new`` differ bitwise from ``old``."""
    lines = []
    for name, case in new.items():
        for key, tensor in case.items():
            if not key.startswith("out_"):
                continue
            before = old.get(name, {}).get(key)
            if before is None or before.shape != tensor.shape or before.dtype != tensor.dtype:
                lines.append(f"{name} {key}: new (no such output before)")
                continue
            bits = BITS[tensor.dtype.itemsize]
            differ = int((before.view(bits) != tensor.view(bits)).sum())
            lines.append(f"{name} {key}: {differ} of {tensor.numel()} elements differ")
    return lines


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="make_golden_vectors.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--interpreter-dry-run",
        metavar="DIR",
        type=Path,
        help="run on Triton's CPU interpreter and write into DIR (never tests/vectors)",
    )
    return parser.parse_args(argv)


def _refusal(dry_run: Path | None) -> str | None:
    """Why this run cannot start, before anything is loaded or written; None when it can."""
    if dry_run is None:
        if not torch.cuda.is_available():
            return (
                "no CUDA device: the golden vectors come from a GPU "
                "(--interpreter-dry-run DIR runs Triton's CPU interpreter and writes into DIR)"
            )
        return None
    if dry_run.resolve() == HERE:
        return f"--interpreter-dry-run writes elsewhere: {HERE} holds the GPU's vectors"
    if dry_run.exists() and not dry_run.is_dir():
        return f"--interpreter-dry-run {dry_run}: not a folder"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    prog = "make_golden_vectors.py"
    refusal = _refusal(args.interpreter_dry_run)
    if refusal is not None:
        print(f"{prog}: {refusal}", file=sys.stderr)
        return EXIT_USAGE
    dry_run = args.interpreter_dry_run is not None
    backend = select_backend("cpu" if dry_run else "cuda")
    from dcpcheck.ops.fused_norm_rope.kernels import load_kernel  # after the backend is fixed

    try:
        kernel = load_kernel(f"vllm=={RELEASE}")
        kept = releases.fetch(RELEASE)
    except KernelLoadError as exc:
        print(f"{prog}: vllm=={RELEASE}: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, KernelSpecError) else EXIT_KERNEL_LOAD
    try:
        golden = golden_vectors(kernel, backend.device)
    except Exception as exc:  # the kernel's own failure, reported in one line
        print(f"{prog}: vllm=={RELEASE} raised: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    import triton

    device = (
        "Triton's CPU interpreter (TRITON_INTERPRET=1)"
        if dry_run
        else f"{torch.cuda.get_device_name(backend.device)}, natively (CUDA)"
    )
    provenance = Provenance(
        kernel=(
            f"vLLM {RELEASE}'s own `fused_norm_rope` Triton kernel, `{releases.KERNEL_MEMBER}` "
            f"of its wheel (SHA256 `{kept.sha256}`), loaded through dcpcheck's release loader "
            f"(`--kernel vllm=={RELEASE}`)"
        ),
        device=device,
        torch_version=torch.__version__,
        triton_version=triton.__version__,
    )
    previous = torch.load(VECTORS, weights_only=True) if VECTORS.is_file() else {}
    written = write(golden, provenance, args.interpreter_dry_run or HERE)
    print(f"wrote {written} ({provenance.device}); against {VECTORS}:")
    for line in differences(previous, golden):
        print(f"  {line}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
