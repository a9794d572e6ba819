"""The click side of the option table (``dcpcheck.cases.options``): each record as a click
option, each command's options in its help's order, the harness's values the records
leave to the command line (``Fill``), and the one function that turns a command's parsed
values into the run's config."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from dcpcheck.cases.options import COMMANDS, OPTIONS, Option, config_fields
from dcpcheck.cli.common import InputError, parse_dcp_sizes, refuse_options
from dcpcheck.distributed.group import COLLECTIVE_TIMEOUT_MARGIN_S, DEFAULT_RANK_TIMEOUT_S
from dcpcheck.harness import sanitizer
from dcpcheck.harness.isolation import DEFAULT_CASE_TIMEOUT_S
from dcpcheck.kernels.loading import KernelSpecError, canonical_spec
from dcpcheck.op_registry import OPS
from dcpcheck.ops import package

FILLS: dict[str, Any] = {
    "sanitizer_tools": sanitizer.TOOLS,
    "case_timeout_s": DEFAULT_CASE_TIMEOUT_S,
    "rank_timeout_s": DEFAULT_RANK_TIMEOUT_S,
    "collective_margin_s": COLLECTIVE_TIMEOUT_MARGIN_S,
    **{key: value for op in OPS for key, value in package(op).option_fills().items()},
}
"""What the records name as ``Fill`` or ``{key}``: values of the harness, and each op's
(its package's ``options``)."""


def _checked_dcp(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--dcp`` checked as it is read (``parse_dcp_sizes``: exit 2 for a size outside
    1..DCP_SIZE_MAX, before any other option is acted on). The command keeps the text as
    given, which its replay lines, a real-rank run's ranks and a bisection's steps pass on."""
    if value is not None:
        parse_dcp_sizes(value)
    return value


def _canonical_kernel(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``--kernel`` as every report and replay spells it: a release's version normalised
    (``vllm==0.30`` is ``vllm==0.30.0``); a release spec whose version is no version is
    exit 2 here, before any work."""
    try:
        return canonical_spec(value)
    except KernelSpecError as exc:
        raise InputError(str(exc)) from None


CALLBACKS: dict[str, Callable] = {"dcp": _checked_dcp, "kernel": _canonical_kernel}
"""The options checked (and normalised) as click reads them."""


def _click_type(option: Option) -> Any:
    bounded = option.low is not None or option.high is not None
    if option.kind == "int":
        return click.IntRange(option.low, option.high) if bounded else int
    if option.kind == "float":
        return click.FloatRange(option.low, option.high) if bounded else float
    if option.kind in ("path", "dir"):
        return click.Path(path_type=Path, file_okay=option.kind == "path")
    if option.kind == "choice":
        return click.Choice(list(option.choices))
    return None


def click_option(name: str, command: str = "run", **changes: Any) -> Callable:
    """Option ``name`` as a click option of ``command``; ``changes``: what a command outside
    the table (``hash``, ``bisect``, ``mutate``) words or defaults otherwise."""
    option = OPTIONS[name].on(command, FILLS)
    if changes:
        option = dataclasses.replace(option, **changes)
    strings = [option.flag] if option.short is None else [option.short, option.flag]
    if option.kind == "switch":
        strings = [f"{option.flag}/--no-{option.name}"]
    settings: dict[str, Any] = {
        "default": option.default,
        "show_default": option.show_default,
        "help": option.help,
        "metavar": option.metavar,
        "multiple": option.multiple,
        "envvar": option.envvar,
        "callback": CALLBACKS.get(name),
    }
    if option.kind == "flag":
        settings["is_flag"] = True
    else:
        settings["type"] = _click_type(option)
    return click.option(*strings, option.key, **settings)


def click_options(command: str, names: tuple[str, ...] | None = None) -> Callable:
    """Every option of ``command`` (``COMMANDS``; ``names`` for a part of them), in its
    help's order."""

    def decorate(function: Callable) -> Callable:
        for name in reversed(COMMANDS[command] if names is None else names):
            function = click_option(name, command)(function)
        return function

    return decorate


def keys(names: frozenset[str] | tuple[str, ...], command: str = "run") -> set[str]:
    """The parameters the options ``names`` of ``command`` are kept under."""
    return {OPTIONS[name].on(command, FILLS).key for name in names}


def option_values(ctx: click.Context, command: str) -> dict[str, Any]:
    """``ctx``'s parsed values by option name."""
    return {
        name: ctx.params[OPTIONS[name].on(command, FILLS).key]
        for name in COMMANDS[command]
        if OPTIONS[name].on(command, FILLS).key in ctx.params
    }


def refuse_untaken(ctx: click.Context, op: str, command: str, refusal: str) -> None:
    """Exit 2, ``refusal`` then each option given that ``op``'s ``command`` does not take
    (its registry record, ``op_registry.Op``), as typed."""
    taken = {name for name in COMMANDS[command] if OPS[op].takes(command, name)}
    refuse_options(ctx, keys(tuple(taken), command) | {"file"}, refusal)


_CONVERT: dict[str, Callable[[Any], Any]] = {
    "dcp": lambda text: None if text is None else parse_dcp_sizes(text),
    "oracle": lambda value: value == "on",
    **{name: convert for op in OPS for name, convert in package(op).option_converters().items()},
}
"""Each option whose config field holds another type than the option's value: the
harness's, and each op's (its package's ``options``)."""

Config = TypeVar("Config")


def config(kind: type[Config], values: Mapping[str, Any]) -> Config:
    """``kind`` (``RunConfig``, ``SearchConfig``) of a command's parsed ``values``
    (``option_values``): each option sets its record's field, where ``kind`` has it."""
    converted = {name: _CONVERT.get(name, lambda value: value)(v) for name, v in values.items()}
    return kind(**config_fields(kind, converted))
