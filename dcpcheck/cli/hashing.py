"""``dcpcheck hash``: the tiny MLA model's greedy token streams at DCP1 and DCPn, compared,
its DCP decode path running through the ops' kernels (``dcpcheck.e2e.chain``)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import click
from rich.markup import escape

import reference
from dcpcheck import __version__, files
from dcpcheck.cli import options, preflight
from dcpcheck.cli.common import (
    InputError,
    KernelFailed,
    KernelLoadFailure,
    kernel_errors,
    open_backend,
    parse_dcp_sizes,
)
from dcpcheck.e2e.chain import (
    Stages,
    cache_write_kernel,
    parse_stages,
    stage_files,
    stages_for,
)
from dcpcheck.e2e.token_streams import (
    DIGEST_RULE,
    STREAM_INTERLEAVE,
    STREAM_SEED,
    PathStreams,
    StreamComparison,
    StreamConfig,
    check_sizes,
    compare_paths,
    raised_line,
    stream_config_for,
)
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_OK
from dcpcheck.kernels.loading import JudgedFile
from dcpcheck.ops.decode_stages import ChainError, Stage
from dcpcheck.output.console import err, out, print_streams

STREAM_OPTIONS = (
    click.option(
        "--prompts",
        type=click.IntRange(min=1),
        default=3,
        show_default=True,
        help="Requests in the batch, of different prompt lengths.",
    ),
    click.option(
        "--steps",
        type=click.IntRange(min=1),
        default=8,
        show_default=True,
        help="Greedy decode steps per request (crosses block boundaries).",
    ),
    click.option(
        "--layout",
        "layout_name",
        type=click.Choice(list(reference.MLA_LAYOUTS)),
        default="auto",
        show_default=True,
        help="MLA cache layout of the model's caches.",
    ),
    click.option(
        "--preset",
        default=None,
        help="Model widths: a preset name (default: small-neox on the CPU, deepseek-v3.2 on "
        "a GPU).",
    ),
    click.option(
        "--interleave",
        type=click.IntRange(min=1),
        default=STREAM_INTERLEAVE,
        show_default=True,
        help="Positions a rank stores in a row (vLLM's cp_kv_cache_interleave_size); must "
        "divide the block size (4). Releases before 0.11.1 take 1 only.",
    ),
    options.click_option("seed", help="Weights, prompts and cache bytes.", default=STREAM_SEED),
)
"""The token-stream model's options, ``hash_config``'s arguments (``stream_options``)."""


STAGE_OPTION = click.option(
    "--stage",
    "stage_texts",
    multiple=True,
    metavar="NAME=SPEC",
    help="The kernel of one stage of the decode chain besides the fused op's: "
    "slot-mapping=SPEC, attention=SPEC or merge=SPEC, each a spec of that stage's op "
    "(as `dcpcheck run --op OP --kernel`). Unnamed stages come from --kernel when it is a "
    "release (every stage the release has), else they are the project's.",
)
"""The chain's stages (``chain_stages``); ``hash`` and its per-rank form take it."""


def chain_stages(kernel_name: str, adapter: str, stage_texts: Sequence[str]):
    """The fused op's stage and the others of the chain whose ``--kernel`` is
    ``kernel_name`` (``dcpcheck.e2e.chain``), with the CLI's exit codes for a bad spec (2)
    and one that does not load (125)."""
    with kernel_errors():
        named = parse_stages(stage_texts)
        fused = cache_write_kernel(kernel_name, adapter)
        return fused, stages_for(kernel_name, named)


def chain_files(fused: Stage, stages: Stages) -> tuple[JudgedFile, ...]:
    """The files every stage's kernel comes from, the fused op's first."""
    with kernel_errors():
        return stage_files(fused, stages)


def check_json(json_path: Path | None, kernel_name: str, stage_texts: Sequence[str]) -> None:
    """``--json`` writable, and none of the files the chain's kernels come from (``--kernel``
    and every ``--stage``'s spec): exit 2, one line, before any work."""
    preflight.check_report_paths(json_path)
    specs = [kernel_name, *(text.partition("=")[2] for text in stage_texts)]
    preflight.check_reports_spare_inputs([("--json", json_path)], preflight.run_inputs(specs))


def print_chain(fused: Stage, stages: Stages) -> None:
    line = "decode chain: " + "; ".join([fused.describe(), *stages.describe()])
    out.print(line, markup=False, soft_wrap=True)


def stream_options(command):
    """Decorate ``command`` with ``STREAM_OPTIONS``, in their order (also the per-rank
    ``hash`` of ``dcpcheck.distributed``)."""
    for option in reversed(STREAM_OPTIONS):
        command = option(command)
    return command


@click.command("hash")
@options.click_option(
    "dcp", help="DCP sizes to generate at (DCP1 always runs as the baseline).", default="1,4"
)
@options.click_option("kernel", help="The kernel under test (as for `dcpcheck run --kernel`).")
@stream_options
@options.click_option("device")
@options.click_option("adapter")
@STAGE_OPTION
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Write every stream's full SHA256, its tokens, the hashing rule and the first "
    "divergence here (atomically; the same bytes for the same inputs and seed).",
)
def hash_command(
    dcp_text,
    kernel_name,
    prompts,
    steps,
    layout_name,
    preset,
    interleave,
    seed,
    device,
    adapter,
    stage_texts,
    json_path: Path | None,
) -> None:
    """Generate greedy token streams with a tiny seeded MLA model at each DCP size and
    compare their SHA256 digests: exit 1 when any rank of any size differs from DCP1.
    Prints each distinct stream digest in full (64 hex digits), with the runs that gave it."""
    dcp_sizes = parse_dcp_sizes(dcp_text)
    check_json(json_path, kernel_name, stage_texts)
    backend = open_backend(device)
    stream_config = hash_config(backend, layout_name, preset, prompts, steps, interleave, seed)
    check_chain_sizes(stream_config, dcp_sizes)
    backend_name = "interpreter" if backend.interpreted else "cuda"

    def failed(message: str, judged: tuple[JudgedFile, ...] = (), chain: dict | None = None):
        """No stream compared: the report still written, saying why (never an earlier
        run's left in place)."""
        if json_path is not None:
            document = streams_json(
                stream_config,
                None,
                kernel=kernel_name,
                backend=backend_name,
                error=message,
                kernel_files=judged,
                chain=chain,
            )
            _write_json(json_path, document)

    try:
        fused, stages = chain_stages(kernel_name, adapter, stage_texts)
    except (KernelLoadFailure, KernelFailed) as unloaded:  # 125, or its import was lost: 1
        failed(unloaded.message)
        kept = "" if json_path is None else f"; report: {json_path}"
        unloaded.message += f"; no stream was generated{kept}"
        raise
    judged = chain_files(fused, stages)
    chain = chain_json(fused, stages)
    print_chain(fused, stages)
    try:
        with err.status("generating token streams"):
            paths = compare_paths(fused.kernel, stream_config, dcp_sizes, backend.device, stages)
    except ChainError as exc:  # a stage's kernel cannot be asked this chain's steps
        raise InputError(f"the decode chain cannot run: {exc}") from None
    except (Exception, SystemExit) as exc:  # a stage's kernel raised inside the model
        message = f"the kernel raised: {raised_line(exc)}"
        failed(message, judged, chain)
        raise KernelFailed(message) from exc
    if json_path is not None:
        document = streams_json(
            stream_config,
            paths[0].comparison,
            kernel=kernel_name,
            backend=backend_name,
            kernel_files=judged,
            chain=chain,
            merge_paths=merge_paths_json(paths),
        )
        _write_json(json_path, document)
    for path in paths:
        if len(paths) > 1:
            out.print(f"through {path.merge.describe()}", markup=False, soft_wrap=True)
        if path.comparison is not None:
            print_streams(path.comparison)
            print_full_digests(path.comparison)
    if len(paths) > 1:
        print_path_verdicts(paths)
    raise SystemExit(EXIT_OK if all(path.identical for path in paths) else EXIT_FAIL)


def _path_verdict(path: PathStreams) -> str:
    if path.comparison is None:
        return f"[bold red]the kernel raised[/]: {escape(str(path.error))}"
    if path.comparison.identical:
        return "[green]identical streams[/]"
    divergence = path.comparison.first_divergence
    assert divergence is not None
    return f"[bold red]streams differ[/] ({escape(divergence.describe())})"


def print_path_verdicts(paths: Sequence[PathStreams]) -> None:
    """One line a merge path: whether its streams are the DCP1 ones, or what it raised."""
    for path in paths:
        out.print(f"{escape(path.merge.describe())}: {_path_verdict(path)}", soft_wrap=True)


def merge_paths_json(paths: Sequence[PathStreams]) -> list[dict]:
    """Each merge path the chain ran, the default's first: its merge's spec, whether it is
    the release's default, and its streams' verdict or what its kernel raised
    (``streams_json``)."""
    return [
        {
            "path": path.merge.path or None,
            "spec": path.merge.spec,
            "note": path.merge.note or None,
            "default": path.merge.default,
            "identical": path.identical,
            "error": path.error,
            "first_divergence": _divergence_json(path.comparison),
        }
        for path in paths
    ]


def _divergence_json(comparison: StreamComparison | None) -> dict | None:
    first = None if comparison is None else comparison.first_divergence
    if first is None:
        return None
    return {
        **asdict(first),
        "baseline_margin": _finite(first.baseline_margin),
        "bound": _finite(first.bound),
        "margin": _finite(first.margin),
        "near_tie": first.near_tie,
        "summary": first.describe(),
    }


def print_full_digests(comparison: StreamComparison) -> None:
    """Each distinct stream digest in full, one line each, with the runs that produced it.

    The table shows 16 hex digits to fit per-request digests beside them; a kernel engineer
    comparing against a digest from elsewhere (a PR description, another machine's run,
    ``sha256sum``) needs all 64. Grouping by digest keeps a passing run to one line.
    """
    groups: dict[str, dict[int, list[int]]] = {}
    for d in comparison.digests:
        groups.setdefault(d.stream, {}).setdefault(d.dcp_size, []).append(d.rank)
    baseline = comparison.digests[0].stream
    out.print("SHA256 per stream (token ids as little-endian int32; --json states the rule):")
    for digest, ranks in groups.items():
        where = "; ".join(f"DCP{size} {_rank_list(r)}" for size, r in ranks.items())
        mark = "" if digest == baseline else "  [bold red](differs from DCP1)[/]"
        out.print(f"{digest}  {escape(where)}{mark}", soft_wrap=True)


def _rank_list(ranks: list[int]) -> str:
    """``rank 0``, ``ranks 0-3``, ``ranks 0, 2-3``: ascending ranks, runs collapsed."""
    spans: list[list[int]] = []
    for rank in sorted(ranks):
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"


def _finite(value: float) -> float | None:
    """``value``, or ``None`` for NaN/inf (a margin or bound of NaN logits): JSON has no NaN,
    and strict readers (JavaScript, jq) reject Python's ``NaN`` literal."""
    return value if math.isfinite(value) else None


def streams_json(
    config: StreamConfig,
    comparison: StreamComparison | None,
    *,
    kernel: str,
    backend: str,
    error: str | None = None,
    kernel_files: Sequence[JudgedFile] = (),
    chain: dict | None = None,
    merge_paths: list[dict] | None = None,
) -> str:
    """The ``--json`` report: every stream's full digest and tokens, the first divergence.

    Deterministic like ``dcpcheck.output.report``: sorted keys, no times, margins as the floats
    the CPU computed. ``hash_of`` states how tokens become bytes, so a reader can check
    every digest with any SHA256 tool. ``comparison`` is ``None`` when the kernel raised
    (``error`` says how): the report is still written, so no earlier one is left in place.
    Top-level keys a superset of ``hash --json`` of a real-rank run's.

    Where the chain ran more than one merge path (``merge_paths``, the default's first),
    the digests and the first divergence are the default path's, ``merge_paths`` gives
    each path's verdict, and ``identical`` holds only when every path's streams are DCP1's.
    """
    streams: list[dict] = []
    if comparison is not None:
        baseline = comparison.digests[0].stream
        rows = [(run, rank) for run in comparison.runs for rank in range(run.dcp_size)]
        for d, (run, rank) in zip(comparison.digests, rows, strict=True):
            streams.append(
                {
                    **asdict(d),
                    "tokens": run.tokens[rank].tolist(),
                    "matches_dcp1": d.stream == baseline,
                }
            )
    doc = {
        "dcpcheck": __version__,
        "kernel": kernel,
        "kernel_files": [f.reported() for f in kernel_files],
        "chain": chain,
        "backend": backend,
        "model": {
            "preset": config.preset,
            "layers": config.layers,
            "cache_layout": config.cache_layout,
            "mla_scale": config.mla_scale,
            "dtype": str(config.dtype).removeprefix("torch."),
            "prompts": config.prompts,
            "max_prompt_length": config.max_prompt_length,
            "steps": config.steps,
            "block_size": config.block_size,
            "interleave": config.interleave,
            "seed": config.seed,
        },
        "hash_of": DIGEST_RULE,
        "error": error,
        "identical": comparison is not None
        and comparison.identical
        and all(path["identical"] for path in merge_paths or ()),
        "merge_paths": merge_paths,
        "min_dcp1_margin": None if comparison is None else _finite(comparison.min_baseline_margin),
        "min_dcp1_margin_over_bound": (
            None if comparison is None else _finite(comparison.min_baseline_clearance)
        ),
        "digests": streams,
        "first_divergence": _divergence_json(comparison),
    }
    return json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n"


def chain_json(fused: Stage, stages: Stages) -> dict:
    """Each stage of the chain: the spec its kernel came from, and why where it is not
    the one asked for."""
    return {
        stage.name: {"spec": stage.spec, "note": stage.note or None}
        for stage in (fused, stages.slot_mapping, stages.attention, stages.merge)
    }


def _write_json(path: Path, text: str) -> None:
    """``files.write_atomic``; its path was tried before any work, so failing now means
    the disk changed under the run: one line, exit 2 (as ``dcpcheck run``'s reports)."""
    try:
        files.write_atomic(path, text)
    except OSError as exc:
        raise InputError(f"{path}: cannot write the report: {exc.strerror}") from None


def check_chain_sizes(config: StreamConfig, dcp_sizes: Sequence[int]) -> None:
    """Exit 2, one line, for a DCP size the decode chain cannot run, before any stage is
    loaded or any stream generated (``token_streams.check_sizes``)."""
    try:
        check_sizes(config, dcp_sizes)
    except ChainError as exc:
        raise InputError(f"the decode chain cannot run: {exc}") from None


def hash_config(
    backend, layout_name: str, preset, prompts: int, steps: int, interleave: int, seed: int
):
    """The `hash` options as a ``StreamConfig`` for ``backend``; bad values are exit 2."""
    try:
        return stream_config_for(
            backend,
            layout_name,
            preset=preset,
            prompts=prompts,
            steps=steps,
            interleave=interleave,
            seed=seed,
        )
    except ValueError as exc:
        raise InputError(str(exc)) from None
