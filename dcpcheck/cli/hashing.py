"""``dcpcheck hash``: the tiny MLA model's greedy token streams at DCP1 and DCPn, compared."""

from __future__ import annotations

import click

from dcpcheck.cli.common import (
    InputError,
    KernelFailed,
    adapter_option,
    device_option,
    load,
    open_backend,
    parse_dcp_sizes,
)
from dcpcheck.console import err, print_streams
from dcpcheck.contract import CacheLayout
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_OK
from dcpcheck.token_streams import compare_streams, stream_config_for

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
        type=click.Choice([c.value for c in CacheLayout]),
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
        "--seed", type=int, default=0, show_default=True, help="Weights, prompts and cache bytes."
    ),
)
"""The token-stream model's options, ``hash_config``'s arguments (``stream_options``)."""


def stream_options(command):
    """Decorate ``command`` with ``STREAM_OPTIONS``, in their order (also the per-rank
    ``hash`` of ``dcpcheck.distributed``)."""
    for option in reversed(STREAM_OPTIONS):
        command = option(command)
    return command


@click.command("hash")
@click.option(
    "--dcp",
    "dcp_text",
    default="1,4",
    show_default=True,
    metavar="N[,N...]",
    help="DCP sizes to generate at (DCP1 always runs as the baseline).",
)
@click.option(
    "--kernel",
    "kernel_name",
    default="default",
    show_default=True,
    help="The kernel under test (as for `dcpcheck run --kernel`).",
)
@stream_options
@device_option
@adapter_option
def hash_command(
    dcp_text, kernel_name, prompts, steps, layout_name, preset, seed, device, adapter
) -> None:
    """Generate greedy token streams with a tiny seeded MLA model at each DCP size and
    compare their SHA256 digests: exit 1 when any rank of any size differs from DCP1."""
    dcp_sizes = parse_dcp_sizes(dcp_text)
    backend = open_backend(device)
    stream_config = hash_config(backend, layout_name, preset, prompts, steps, seed)
    kernel = load(kernel_name, adapter)
    try:
        with err.status("generating token streams"):
            comparison = compare_streams(kernel, stream_config, dcp_sizes, backend.device)
    except (Exception, SystemExit) as exc:  # the kernel under test raised inside the model
        raise KernelFailed(f"the kernel raised: {type(exc).__name__}: {exc}") from exc
    print_streams(comparison)
    raise SystemExit(EXIT_OK if comparison.identical else EXIT_FAIL)


def hash_config(backend, layout_name: str, preset, prompts: int, steps: int, seed: int):
    """The `hash` options as a ``StreamConfig`` for ``backend``; bad values are exit 2."""
    try:
        return stream_config_for(
            backend,
            CacheLayout(layout_name),
            preset=preset,
            prompts=prompts,
            steps=steps,
            seed=seed,
        )
    except ValueError as exc:
        raise InputError(str(exc)) from None
