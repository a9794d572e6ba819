"""``dcpcheck fetch``: put released vLLM kernel files into the release cache (or fetch them
afresh), each checked against dcpcheck's lock file and its wheel's RECORD, so a machine
without network can be handed the cache (``$DCPCHECK_CACHE``) and judge them offline."""

from __future__ import annotations

import click
from rich.markup import escape

from dcpcheck.cli.common import InputError, KernelLoadFailure
from dcpcheck.kernels import releases
from dcpcheck.output.console import out


def _version(word: str) -> str:
    """``vllm==X`` or ``X`` as a normalised version; exit 2 when it is neither."""
    spec = word if word.startswith(f"{releases.PACKAGE}==") else f"{releases.PACKAGE}=={word}"
    try:
        parsed = releases.parse_spec(spec)
    except releases.MalformedVersion as exc:
        raise InputError(f"fetch: {exc}") from None
    if parsed is None or parsed.function != releases.DEFAULT_FUNCTION:
        raise InputError(f"fetch: {word!r} is not a release (expected e.g. vllm==0.30.0)")
    return parsed.version


@click.command("fetch")
@click.argument("names", nargs=-1, required=True, metavar="vllm==X...")
@click.option(
    "--refresh",
    is_flag=True,
    help="Download each wheel again and replace what the cache holds of the release.",
)
def fetch_command(names: tuple[str, ...], refresh: bool) -> None:
    """Fetch released vLLM kernel files into the release cache ($DCPCHECK_CACHE, else
    ~/.cache/dcpcheck): every op's files the wheel has (dcpcheck list ops), each checked
    against the SHA256 its wheel's RECORD gives and, for a release dcpcheck's lock file
    knows, the lock's (a release it does not know is said so), the wheel deleted. Prints
    each file and its SHA256. Exit 2 for a version the package index does not publish or a
    cache that cannot be used, 125 when a wheel cannot be had."""
    versions = list(dict.fromkeys(_version(name) for name in names))
    for version in versions:
        try:
            kept = releases.fetch_all(version, refresh=refresh)
        except (releases.CacheFault, releases.UnknownRelease) as exc:
            raise InputError(str(exc)) from None
        except releases.ReleaseError as exc:
            raise KernelLoadFailure(str(exc)) from None
        for file in kept:
            out.print(
                f"{releases.PACKAGE}=={version}  sha256 {file.sha256}  {escape(str(file.path))}",
                soft_wrap=True,
            )
